"""The declared fields' one-pass mapping gives what the full mapping gives, or the same error."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lookup import Field
from lookup.exceptions import BadResponseError
from lookup.fields import FieldMapper

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.text(max_size=5),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=2), inner, max_size=2),
    max_leaves=4,
)
NAMES = st.sampled_from(["a", "b", "c"])
FIELDS = st.lists(
    st.builds(
        Field,
        name=NAMES,
        type=st.sampled_from(["string", "int", "float", "bool", "json"]),
        path=st.one_of(st.none(), st.sampled_from(["a", "b", "c.d", "0"])),
        required=st.booleans(),
    ),
    min_size=1,
    max_size=3,
    unique_by=lambda f: f.name,
)
ANSWERS = st.one_of(st.dictionaries(st.sampled_from(["a", "b", "c", "d", "x"]), VALUES, max_size=4), VALUES)


def outcome(call: Any) -> Any:
    try:
        return ("value", call())
    except BadResponseError as exc:
        return ("error", str(exc))


@settings(max_examples=400)
@given(FIELDS, ANSWERS)
def test_direct_mapping_equals_the_full_one(fields: list[Field], answer: Any) -> None:
    mapper = FieldMapper(fields)
    direct = outcome(lambda: mapper.map(answer, "k1", "svc"))
    full = outcome(lambda: mapper._map(answer, "k1", "svc"))
    assert direct == full
    if direct[0] == "value":
        assert all(type(a) is type(b) for a, b in zip(direct[1].values(), full[1].values(), strict=True))


def test_an_int_for_a_float_field_is_converted_and_a_bool_for_an_int_is_refused() -> None:
    mapper = FieldMapper([Field("price", "float"), Field("n", "int")])
    assert mapper.map({"price": 3, "n": 2}, "k", "svc") == {"price": 3.0, "n": 2}
    assert type(mapper.map({"price": 3, "n": 2}, "k", "svc")["price"]) is float
    try:
        mapper.map({"price": 1.5, "n": True}, "k", "svc")
    except BadResponseError as exc:
        assert "field 'n' should be int" in str(exc)
    else:
        raise AssertionError("a bool passed as an int")


@pytest.mark.parametrize(
    ("declared", "value", "met", "declare"),
    [
        ("string", 4.5, "a JSON number", "Field('score', 'float')"),
        ("string", 7, "a JSON number (an integer)", "Field('score', 'int') ('float' takes it too)"),
        ("float", "4.5", "a JSON string", "Field('score', 'string')"),
        ("int", True, "a JSON boolean", "Field('score', 'bool')"),
        ("string", {"a": 1}, "a JSON object", "Field('score', 'json')"),
        ("int", [1], "a JSON array", "Field('score', 'json')"),
    ],
)
def test_a_value_of_another_type_names_the_json_type_met_and_the_type_to_declare(
    declared: str, value: object, met: str, declare: str
) -> None:
    with pytest.raises(BadResponseError) as caught:
        FieldMapper([Field("score", declared)]).map({"score": value}, "k7", "svc")
    message = str(caught.value)
    assert f"field 'score' should be {declared}, but the answer has {met} there" in message
    assert f"declare {declare}" in message and "'k7'" in message


def test_a_nested_value_of_another_type_names_its_path() -> None:
    mapper = FieldMapper([Field("city", "int", path="address.city")])
    with pytest.raises(BadResponseError, match=r"field 'city' \(path 'address.city'\) should be int"):
        mapper.map({"address": {"city": "Oslo"}}, "k", "svc")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(FIELDS, st.lists(st.one_of(st.none(), st.just(ValueError("kept")), ANSWERS), max_size=6))
@example([Field("a", "int")], [{"a": 1}, {"a": True}])  # a bool is an int to isinstance
@example([Field("a", "float")], [{"a": 1.5}, None, {"a": 2}])  # an int for a float becomes one
def test_mapping_a_batch_equals_mapping_each_answer(fields: list[Field], answers: list[Any]) -> None:
    mapper = FieldMapper(fields)
    keys = [f"k{i}" for i in range(len(answers))]

    def each() -> list[Any]:
        return [
            a if a is None or isinstance(a, BaseException) else [mapper.map(a, k, "svc")]
            for a, k in zip(answers, keys, strict=True)
        ]

    batch, one_by_one = outcome(lambda: mapper.map_all(answers, keys, "svc")), outcome(each)
    assert repr(batch) == repr(one_by_one)  # repr: an int is not a float, errors compared by text


@given(st.integers())
def test_an_int_literal_reads_back_exactly(n: int) -> None:
    from lookup.fields import parse_literal

    assert parse_literal(str(n), "int") == n
    assert parse_literal(json.dumps(float(n % 10**15) / 4), "float") == float(n % 10**15) / 4


@given(st.text(max_size=6))
def test_a_string_is_an_int_only_as_jsons_int_literal(text: str) -> None:
    from lookup.fields import parse_literal

    try:
        value = json.loads(text)
    except ValueError:
        value = None
    is_literal = type(value) is int and json.dumps(value) in (text, text.removeprefix("-"))  # -0 too
    try:
        assert parse_literal(text, "int") == value and is_literal
    except ValueError:
        assert not is_literal

"""The JSON decoder for answers: orjson when installed, the same values as the standard
library whatever the input (orjson refuses NaN and integers wider than 64 bits: those go to the
standard library), and the standard library's error when neither can decode."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lookup import fast_json


@pytest.mark.parametrize(
    "text",
    [
        b'{"a": 1, "b": [1.5, null, true], "c": "\\u00e9"}',
        b'{"big": 123456789012345678901234567890, "edge": 18446744073709551616}',
        b'{"max": 9223372036854775807, "min": -9223372036854775808, "u": 18446744073709551615}',
        b'{"below_min": -9223372036854775809}',  # 19 digits, no 64-bit integer: the widest run checked
        b'{"x": NaN, "y": Infinity}',
        b"null",
        '{"s": "text given as str"}',
    ],
)
def test_the_same_values_as_the_standard_library(text: bytes | str) -> None:
    got = fast_json.loads(text)
    want = json.loads(text)
    assert repr(got) == repr(want)  # repr: NaN == NaN, and int vs float told apart


def test_an_answer_neither_can_decode_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        fast_json.loads(b"{not json")


def test_kaw_json_forces_the_standard_library(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAW_JSON", "json")
    forced = importlib.reload(fast_json)
    try:
        assert forced.JSON_DECODER == "json" and forced.loads is json.loads
    finally:
        monkeypatch.delenv("KAW_JSON")
        importlib.reload(fast_json)
    assert fast_json.JSON_DECODER in ("orjson", "json")


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**25), 10**25)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=8,
)
payloads = st.one_of(
    st.none(),  # a miss (MGET's nil)
    json_values.map(lambda v: json.dumps(v).encode()),
    st.sampled_from([b"{not json", b"1 2", b"[1", b"", b'"a"']),
)


def outcome(decode: Callable[[], list[Any]]) -> tuple[str, Any]:
    """The values (by repr: NaN == NaN, an int is not a float), or the kind of error."""
    try:
        return ("value", repr(decode()))
    except (TypeError, ValueError) as exc:
        return ("error", ValueError if isinstance(exc, ValueError) else TypeError)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.lists(payloads, max_size=12))
def test_a_batch_decodes_as_each_payload_would(batch: list[bytes | None]) -> None:
    each = outcome(lambda: [None if p is None else fast_json.loads(p) for p in batch])
    assert outcome(lambda: fast_json.loads_many(batch)) == each


stdlib_payloads = st.one_of(
    payloads,
    json_values.map(lambda v: json.dumps(v, ensure_ascii=False).encode()),  # UTF-8 beyond ASCII
    json_values.map(lambda v: json.dumps(v).encode("utf-16")),  # a BOM: json.loads reads UTF-16
    json_values.map(lambda v: json.dumps(v).encode("utf-16-le")),  # no BOM, NULs: UTF-16 again
    json_values.map(lambda v: b"\xef\xbb\xbf" + json.dumps(v).encode()),  # UTF-8 with a BOM
    json_values.map(lambda v: b" \n" + json.dumps(v).encode() + b"\t"),  # white space around
    st.sampled_from([b'"a\nb"', b'"\\ud800"', b"NaN", b"-Infinity", b"1e400", b"[1,", b"2]", b"\xff"]),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.lists(stdlib_payloads, max_size=8))
def test_the_standard_librarys_batch_decodes_as_json_loads(batch: list[bytes | None]) -> None:
    each = outcome(lambda: [None if p is None else json.loads(p) for p in batch])
    assert outcome(lambda: fast_json._stdlib_many(batch)) == each


@pytest.mark.parametrize(
    "batch",
    [[memoryview(b"1")], ['"text"', b"2"], [ValueError("in a value's place")], [bytearray(b"[3]"), None]],
)
def test_odd_payloads_get_json_loads_value_or_error(batch: list[Any]) -> None:
    each = outcome(lambda: [None if p is None else json.loads(p) for p in batch])
    assert outcome(lambda: fast_json._stdlib_many(batch)) == each
    assert outcome(lambda: fast_json.loads_many(batch)) == each

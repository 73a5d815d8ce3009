"""The capabilities the runtime and the Spark layer find with ``isinstance`` (runtime-checkable
protocols), held by the classes that have them: renaming one of these methods in ``lookup/`` or
the chain fails here, instead of silently dropping error descriptions, metrics or a declared
schema in every task. No service is contacted: clients are made lazily."""

from __future__ import annotations

import pytest

from keyed_async_wait import Chain, Step
from keyed_async_wait.runtime.backend import (
    DeclaresInputs,
    DeclaresOutputSchema,
    DescribesCalls,
    ReleasesKeysEarly,
    adapt_function,
    declared_inputs,
    declared_output_schema,
)
from lookup import Field, HttpLookup, HttpWrite, RedisLookup, RedisWrite
from lookup.parts import ReportsLookupStats

HTTP = "http://127.0.0.1:9/users/{user_id}"
REDIS = "redis://127.0.0.1:9/0"


def _lookups() -> list[object]:
    return [
        HttpLookup(HTTP, fields=[Field("name"), Field("tier", "int")]),
        RedisLookup(REDIS, "user:{user_id}", fields=[Field("name")]),
    ]


@pytest.mark.parametrize("lookup", _lookups(), ids=["http", "redis"])
def test_a_lookup_declares_its_fields_describes_its_calls_and_reports_stats(lookup: object) -> None:
    assert isinstance(lookup, DeclaresInputs) and declared_inputs(lookup) == ("user_id",)
    assert isinstance(lookup, DeclaresOutputSchema) and declared_output_schema(lookup)
    assert isinstance(lookup, DescribesCalls) and isinstance(lookup, ReportsLookupStats)
    adapter = adapt_function(lookup)
    assert adapter.instance is lookup and adapter.describe is not None
    assert "7" in str(adapter.describe({"user_id": 7}))


def test_writes_describe_their_calls() -> None:
    for write in (
        RedisWrite(REDIS, "k:{id}", fields=["v"], version="v"),
        HttpWrite("http://127.0.0.1:9/records/{id}", fields=["v"], version="v"),
    ):
        describe = adapt_function(write).describe
        assert isinstance(write, DescribesCalls) and describe is not None
        assert "3" in str(describe({"id": 3, "v": 1}))


def test_a_chain_releases_its_key_early_only_with_release_after_and_declares_its_steps() -> None:
    async def first(record: dict) -> dict:
        return {"a": 1}

    async def second(record: dict) -> dict:
        return {"b": 2}

    steps = (Step("first", first, fields=("a",)), Step("second", second, fields=("b",)))
    early, whole = Chain(*steps, release_after="first"), Chain(*steps)
    assert isinstance(early, ReleasesKeysEarly) and adapt_function(early).bind_release is not None
    assert adapt_function(whole).bind_release is None
    lookups = Chain(Step("users", _lookups()[0]))
    assert declared_inputs(lookups) == ("user_id",) and declared_output_schema(lookups)


def test_a_plain_async_def_declares_nothing() -> None:
    async def plain(record: dict) -> dict:
        return record

    assert declared_inputs(plain) == () and declared_output_schema(plain) is None
    assert not isinstance(plain, DescribesCalls)
    adapter = adapt_function(plain)
    assert adapter.instance is None and adapter.describe is None

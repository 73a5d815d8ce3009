"""RedisWrite against a real Redis server: fencing by version, re-runs, tombstones, batches."""

from __future__ import annotations

import datetime as dt
import json
import math
import random
import uuid
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio.client import Pipeline

from keyed_async_wait import RecordFailedError, RetryStrategy
from keyed_async_wait.operator import FailedRecord
from lookup import Field, LookupOptionError, RedisLookup, RedisWrite, VersionError, WrongTypeError
from lookup.versions import encode_version

from ..core.helpers import run
from .writing import write_all


@pytest.fixture
def db(redis_url: str) -> Any:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        yield client
    finally:
        client.close()


def prefix() -> str:
    return f"w{uuid.uuid4().hex[:8]}"


def test_a_write_applies_only_a_newer_version_and_a_rerun_applies_nothing(redis_url: str, db: Any) -> None:
    p = prefix()
    updates = [{"id": 1, "v": v, "name": f"n{v}"} for v in (1, 3, 2, 3)]
    fn = RedisWrite(redis_url, p + ":{id}", fields=["name", "v"], version="v")
    pairs = run(write_all(fn, updates, batch_size=None))
    # 2 arrived after 3: stale; the second 3 is the same version again: refused too
    assert [res[0]["applied"] for _, res in pairs] == [True, True, False, False]
    assert json.loads(db.get(f"{p}:1")) == {"name": "n3", "v": 3}
    assert fn.stats.applied == 2 and fn.stats.stale == 2
    again = RedisWrite(redis_url, p + ":{id}", fields=["name", "v"], version="v")
    pairs = run(write_all(again, updates))  # the whole input re-run: the store has it all
    assert [res[0]["applied"] for _, res in pairs] == [False] * 4
    assert json.loads(db.get(f"{p}:1")) == {"name": "n3", "v": 3}


def test_a_delete_leaves_a_tombstone_that_a_late_older_upsert_cannot_pass(redis_url: str, db: Any) -> None:
    p = prefix()
    fn = RedisWrite(redis_url, p + ":{id}", fields=["name"], version="v", deleted="gone", tombstone_ttl=60)
    updates = [
        {"id": 7, "v": 1, "name": "a", "gone": False},
        {"id": 7, "v": 2, "name": None, "gone": True},
        {"id": 7, "v": 1, "name": "a", "gone": False},  # late and older: refused
    ]
    pairs = run(write_all(fn, updates))
    assert [res[0]["applied"] for _, res in pairs] == [True, True, False]
    assert db.get(f"{p}:7") is None
    assert 0 < db.pttl(f"{p}:7:kaw-version") <= 60_000


def test_hset_fields_read_back_typed_and_ttl_applies_to_key_and_version(redis_url: str, db: Any) -> None:
    p = prefix()
    fn = RedisWrite(redis_url, p + ":{id}", command="HSET", fields=["name", "tier"], version="seq", ttl=30)
    run(write_all(fn, [{"id": 1, "seq": 5, "name": "ann", "tier": 3}]))
    assert db.hgetall(f"{p}:1") == {"name": "ann", "tier": "3"}
    assert 0 < db.pttl(f"{p}:1") <= 30_000 and 0 < db.pttl(f"{p}:1:kaw-version") <= 30_000
    reader = RedisLookup(
        redis_url, p + ":{id}", command="HGETALL", fields=[Field("name"), Field("tier", "int")]
    )

    async def read() -> Any:
        try:
            return await reader.invoke({"id": 1})
        finally:
            await reader.aclose()

    assert run(read()) == [{"name": "ann", "tier": 3}]


def test_a_null_version_fails_its_record_only_naming_the_column_and_key(redis_url: str) -> None:
    p = prefix()
    fn = RedisWrite(redis_url, p + ":{id}", fields=["name"], version="v")
    records = [{"id": 1, "v": 1, "name": "a"}, {"id": 2, "v": None, "name": "b"}]
    outputs = run(write_all(fn, records, on_error="emit", batch_size=10))
    [failed] = [o for o in outputs if isinstance(o, FailedRecord)]
    assert [o[1] for o in outputs if not isinstance(o, FailedRecord)] == [[{"applied": True}]]
    error = failed.exception
    assert failed.record["id"] == 2 and isinstance(error, VersionError) and not error.retryable
    assert "'v'" in str(error) and f"{p}:2" in str(error) and "NULL" in str(error)


def test_a_write_without_a_version_is_refused_when_made_unless_at_least_once(redis_url: str, db: Any) -> None:
    with pytest.raises(LookupOptionError, match="version="):
        RedisWrite(redis_url, "k:{id}", fields=["name"])
    with pytest.raises(LookupOptionError, match="fields="):
        RedisWrite(redis_url, "k:{id}", version="v")
    p = prefix()
    fn = RedisWrite(redis_url, p + ":{id}", fields=["name"], at_least_once=True)
    pairs = run(write_all(fn, [{"id": 1, "name": "new"}, {"id": 1, "name": "old"}]))
    assert [res[0]["applied"] for _, res in pairs] == [True, True]
    assert json.loads(db.get(f"{p}:1")) == {"name": "old"}  # no fencing: the last write wins


def test_a_record_failure_names_the_write_and_its_key(redis_url: str) -> None:
    p = prefix()
    fn = RedisWrite(redis_url, p + ":{id}", fields=["name"], version="v")
    with pytest.raises(RecordFailedError, match=rf"Redis SET '{p}:1'"):
        run(write_all(fn, [{"id": 1, "v": None, "name": "a"}], batch_size=None))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    versions=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 6)), min_size=1, max_size=30),
    seed=st.integers(0, 2**16),
    batch=st.sampled_from([None, 4]),
)
def test_whatever_the_order_and_reruns_each_key_ends_at_its_newest_version(
    redis_url: str, db: Any, versions: list[tuple[int, int]], seed: int, batch: int | None
) -> None:
    """Invariant: arrival order, duplicates and re-runs aside, a key holds the value of its
    highest version, and a write was applied exactly when its version was above every version
    applied before it for its key."""
    p = prefix()
    records = [{"id": k, "v": v, "name": f"{k}-{v}"} for k, v in versions]
    random.Random(seed).shuffle(records)
    fn = RedisWrite(redis_url, p + ":{id}", fields=["name"], version="v")
    pairs = run(write_all(fn, records + records[: len(records) // 2], batch_size=batch))
    highest: dict[int, int] = {}
    for record, results in pairs:  # key-ordered: per key, output order is arrival order
        k, v = record["id"], record["v"]
        assert results[0]["applied"] == (k not in highest or v > highest[k]), (record, highest)
        highest[k] = max(v, highest.get(k, v))
    for k, v in highest.items():
        assert json.loads(db.get(f"{p}:{k}")) == {"name": f"{k}-{v}"}


def _spark_order(kind: str) -> Any:
    return {
        "int": st.integers(-(2**63), 2**63 - 1),
        "float": st.floats(allow_nan=True, allow_infinity=True),
        "str": st.text(max_size=6),
        "bytes": st.binary(max_size=6),
        "date": st.dates(),
        "timestamp": st.datetimes(timezones=st.just(dt.timezone.utc)),
    }[kind]


def _key(kind: str, value: Any) -> Any:
    """Spark's order: NaN above every double, -0.0 equal to 0.0, strings by UTF-8 bytes."""
    if kind == "float":
        return (1, 0.0) if math.isnan(value) else (0, value + 0.0)
    if kind == "str":
        return value.encode("utf-8")
    return value


@pytest.mark.parametrize("kind", ["int", "float", "str", "bytes", "date", "timestamp"])
def test_version_strings_order_as_spark_orders_the_column(kind: str) -> None:
    @settings(max_examples=200, deadline=None)
    @given(a=_spark_order(kind), b=_spark_order(kind))
    def check(a: Any, b: Any) -> None:
        ka, kb = _key(kind, a), _key(kind, b)
        ea, eb = encode_version(a), encode_version(b)
        assert (ea < eb) == (ka < kb) and (ea == eb) == (ka == kb), (a, b, ea, eb)
        assert ea.isascii() and ea.isalnum()

    check()


def test_versions_without_an_order_are_refused_naming_what_is_allowed() -> None:
    from decimal import Decimal

    for bad in (None, True, Decimal("1.5"), 2**63, [1]):
        with pytest.raises(ValueError, match=r"long|NULL|boolean|fit"):
            encode_version(bad)


def test_unordered_writes_never_take_a_key_back_in_time(redis_url: str, db: Any) -> None:
    """Without key order the writes of a key race; the fence still keeps the newest."""
    p = prefix()
    versions = list(range(40))
    random.Random(3).shuffle(versions)
    fn = RedisWrite(redis_url, p + ":{id}", fields=["v"], version="v")
    run(write_all(fn, [{"id": 1, "v": v} for v in versions], mode="unordered", batch_size=None, capacity=40))
    assert json.loads(db.get(f"{p}:1")) == {"v": 39}
    assert fn.stats.applied + fn.stats.stale == 40 and fn.stats.applied >= 1


def test_set_with_ttl_expires_key_and_version_and_a_write_without_ttl_clears_it(
    redis_url: str, db: Any
) -> None:
    p = prefix()
    run(write_all(RedisWrite(redis_url, p + ":{id}", fields=["v"], version="v", ttl=30), [{"id": 1, "v": 1}]))
    assert 0 < db.pttl(f"{p}:1") <= 30_000 and 0 < db.pttl(f"{p}:1:kaw-version") <= 30_000
    run(write_all(RedisWrite(redis_url, p + ":{id}", fields=["v"], version="v"), [{"id": 1, "v": 2}]))
    assert db.pttl(f"{p}:1") == -1 and db.pttl(f"{p}:1:kaw-version") == -1  # kept for good now
    assert json.loads(db.get(f"{p}:1")) == {"v": 2}


def test_a_write_the_server_refuses_fails_alone_in_its_batch(redis_url: str, db: Any) -> None:
    """Writes share a script call; one that Redis refuses (HSET onto a string) is that record's
    error, not retryable, and the writes around it are applied."""
    p = prefix()
    db.set(f"{p}:2", "a string")
    fn = RedisWrite(redis_url, p + ":{id}", command="HSET", fields=["name"], version="v")
    records = [{"id": i, "v": 1, "name": f"n{i}"} for i in range(1, 4)]
    outputs = run(write_all(fn, records, on_error="emit", batch_size=10))
    [failed] = [o for o in outputs if isinstance(o, FailedRecord)]
    assert failed.record["id"] == 2 and isinstance(failed.exception, WrongTypeError)
    assert db.hgetall(f"{p}:1") == {"name": "n1"} and db.hgetall(f"{p}:3") == {"name": "n3"}
    assert db.get(f"{p}:2:kaw-version") is None  # the refused write stored no version


def test_a_batch_larger_than_one_script_call_keeps_every_outcome_in_place(redis_url: str, db: Any) -> None:
    p = prefix()
    fn = RedisWrite(redis_url, p + ":{id}", fields=["v"], version="v")
    first = run(write_all(fn, [{"id": i, "v": 2} for i in range(250)], batch_size=250, capacity=250))
    assert all(res == [{"applied": True}] for _, res in first)
    assert fn.stats.requests < 3  # a batch of more writes than one script call takes
    again = RedisWrite(redis_url, p + ":{id}", fields=["v"], version="v")
    mixed = [{"id": i, "v": 1 + 2 * (i % 2)} for i in range(250)]  # odd ids newer, even ids older
    pairs = run(write_all(again, mixed, batch_size=250, capacity=250))
    assert all(res == [{"applied": r["id"] % 2 == 1}] for r, res in pairs)


def test_a_redis_write_holds_its_limits_a_batch_one_call(redis_url: str) -> None:
    """``Limits(rate=20)``: 40 writes in batches of 10 are 4 calls, spaced by the rate (a
    pipeline of a batch is one call of as many keys)."""
    import time

    from lookup import Limits

    p = f"lim{uuid.uuid4().hex[:6]}"
    fn = RedisWrite(redis_url, p + ":{id}", fields=["v"], version="v", limits=Limits(rate=20, burst=1))
    started = time.monotonic()
    pairs = run(write_all(fn, [{"id": i, "v": 1} for i in range(40)], batch_size=10, buffer_timeout=None))
    assert all(res[0]["applied"] for _, res in pairs) and fn.stats.requests == 4
    assert time.monotonic() - started >= 3 / 20 * 0.9  # four calls at 20 a second


def test_a_write_sent_again_by_its_client_is_applied_and_a_rerun_is_stale(redis_url: str, db: Any) -> None:
    """A client that sends a call again after losing its answer (redis-py's cluster pipeline
    retries so) finds its own version with its own token: applied, not stale; another call
    (a re-run) at the same version is stale; an older one too."""
    from lookup.redis_write import SCRIPT

    p = prefix()
    fn = RedisWrite(redis_url, p + ":{id}", fields=["name"], version="v")
    record = {"id": 1, "v": 5, "name": "five"}
    target = fn.target(record)
    args = fn._calls.arguments(record, encode_version(5))
    keys = [target, f"{target}:kaw-version"]
    script = db.register_script(SCRIPT)
    assert script(keys=keys, args=["call-a", *args]) == [1]
    assert script(keys=keys, args=["call-a", *args]) == [1]  # the same call, sent again
    assert script(keys=keys, args=["call-b", *args]) == [2]  # a re-run: the same version held
    older = fn._calls.arguments({**record, "v": 4}, encode_version(4))
    assert script(keys=keys, args=["call-c", *older]) == [0]
    assert json.loads(db.get(target)) == {"name": "five"}
    rerun = RedisWrite(redis_url, p + ":{id}", fields=["name"], version="v")
    assert [res[0]["applied"] for _, res in run(write_all(rerun, [record]))] == [False]


def test_a_write_whose_answer_was_lost_is_applied_when_retried(
    redis_url: str, db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pipeline ran the writes but its answers were lost (a reset, a timeout): the record's
    retry is a new call with a new token, finds its own version held and reports it applied,
    not stale; a re-run of the same records afterwards is stale."""
    p = prefix()
    updates = [{"id": i, "v": 7, "name": f"n{i}"} for i in range(3)]
    real = Pipeline.execute
    lost = []

    async def answer_lost(self: Any, *args: Any, **kwargs: Any) -> Any:
        answers = await real(self, *args, **kwargs)  # applied on the server
        if not lost:
            lost.append(answers)
            raise redis.exceptions.ConnectionError("Connection reset by peer")
        return answers

    monkeypatch.setattr(Pipeline, "execute", answer_lost)
    fn = RedisWrite(redis_url, p + ":{id}", fields=["name"], version="v")
    retry = RetryStrategy.fixed_delay(2, 0.01)
    pairs = run(write_all(fn, updates, batch_size=10, retry=retry))
    assert lost and [res[0]["applied"] for _, res in pairs] == [True] * 3
    assert [json.loads(db.get(f"{p}:{i}")) for i in range(3)] == [{"name": f"n{i}"} for i in range(3)]
    rerun = RedisWrite(redis_url, p + ":{id}", fields=["name"], version="v")
    assert [res[0]["applied"] for _, res in run(write_all(rerun, updates, batch_size=10))] == [False] * 3

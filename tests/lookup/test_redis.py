"""RedisLookup against a real Redis server."""

from __future__ import annotations

import json
import pickle
import subprocess
from typing import Any

import pytest
import redis

from keyed_async_wait import RecordFailedError
from keyed_async_wait.app.service import free_port
from keyed_async_wait.operator import KeyedAsyncWaitOperator
from lookup import BadResponseError, Field, RedisLookup, ServiceUnavailableError, WrongTypeError

from ..core.helpers import run


@pytest.fixture(scope="module")
def db(redis_url: str) -> redis.Redis:
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    for i in range(100):
        client.set(f"price:{i}", json.dumps({"sku": i, "price": i * 1.5}))
        client.hset(f"user:{i}", mapping={"name": f"user-{i}", "tier": "gold" if i % 2 else "silver"})
    client.set("raw:1", "plain text")
    client.set("bad:1", "{not json")
    client.lpush("list:1", "x")
    return client


async def lookup_all(fn: RedisLookup, records: list[dict[str, Any]], **kw: Any) -> list[Any]:
    op = KeyedAsyncWaitOperator(fn, mode="key_ordered", key="order_id", output="pairs", **kw)
    try:
        return [pair async for pair in op.process(records)]
    finally:
        await fn.aclose()


def test_get_json_in_batches_through_mget(db: redis.Redis, redis_url: str) -> None:
    fn = RedisLookup(redis_url, "price:{sku}", fields=[Field("price", "float")])
    records = [{"order_id": i % 9, "sku": i % 120} for i in range(300)]
    pairs = run(lookup_all(fn, records, capacity=300))
    for record, results in pairs:
        assert results == ([] if record["sku"] >= 100 else [{"price": record["sku"] * 1.5}])
    assert fn.stats.requests < 300 / 5  # MGETs, not one GET per record


def test_get_raw_hgetall_and_hmget(db: redis.Redis, redis_url: str) -> None:
    raw = RedisLookup(redis_url, "raw:{id}", decode="raw")
    assert run(lookup_all(raw, [{"order_id": 1, "id": 1}]))[0][1] == ["plain text"]
    hall = RedisLookup(redis_url, "user:{id}", command="HGETALL")
    assert run(lookup_all(hall, [{"order_id": 1, "id": 3}, {"order_id": 2, "id": 999}]))[0][1] == [
        {"name": "user-3", "tier": "gold"}
    ]
    hm = RedisLookup(redis_url, "user:{id}", command="HMGET", hash_fields=["tier"])
    out = run(lookup_all(hm, [{"order_id": 1, "id": 4}, {"order_id": 2, "id": 999}]))
    assert [res for _, res in out] == [[{"tier": "silver"}], []]


def test_single_gets_without_batching(db: redis.Redis, redis_url: str) -> None:
    fn = RedisLookup(redis_url, "price:{sku}", fields=[Field("price", "float")])
    op = KeyedAsyncWaitOperator(fn, mode="unordered", key="order_id", batch_size=None, output="pairs")

    async def go() -> list[Any]:
        try:
            return [p async for p in op.process([{"order_id": 1, "sku": 2}, {"order_id": 2, "sku": 3}])]
        finally:
            await fn.aclose()

    assert sorted(r[1][0]["price"] for r in run(go())) == [3.0, 4.5]


def test_wrong_type_names_the_key_and_is_not_retried(db: redis.Redis, redis_url: str) -> None:
    fn = RedisLookup(redis_url, "list:{id}")
    with pytest.raises(RecordFailedError, match=r"'list:1'.*wrong type.*WRONGTYPE") as info:
        run(lookup_all(fn, [{"order_id": 1, "id": 1}]))
    assert isinstance(info.value.__cause__, WrongTypeError) and not info.value.__cause__.retryable


def test_value_that_is_not_json_is_named(db: redis.Redis, redis_url: str) -> None:
    fn = RedisLookup(redis_url, "bad:{id}")
    with pytest.raises(RecordFailedError, match=r"'bad:1'.*not JSON.*decode='raw'") as info:
        run(lookup_all(fn, [{"order_id": 1, "id": 1}]))
    assert isinstance(info.value.__cause__, BadResponseError)


def test_unreachable_redis_is_unavailable_and_retryable() -> None:
    fn = RedisLookup(f"redis://127.0.0.1:{free_port()}/0", "price:{sku}", socket_timeout=1)
    with pytest.raises(RecordFailedError) as info:
        run(lookup_all(fn, [{"order_id": 1, "sku": 1}]))
    assert isinstance(info.value.__cause__, ServiceUnavailableError) and info.value.__cause__.retryable


def test_pickles_without_a_pool(db: redis.Redis, redis_url: str) -> None:
    fn = RedisLookup(redis_url, "price:{sku}")
    run(lookup_all(fn, [{"order_id": 1, "sku": 1}]))

    async def pickled_while_live() -> RedisLookup:
        fn.client()
        copy = pickle.loads(pickle.dumps(fn))
        await fn.aclose()
        return copy

    copy = run(pickled_while_live())
    assert copy._client is None
    assert run(lookup_all(copy, [{"order_id": 1, "sku": 2}]))[0][1] == [{"sku": 2, "price": 3.0}]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"command": "SCAN"}, "command='SCAN'; allowed: GET, HGETALL, HMGET"),
        ({"decode": "xml"}, "decode='xml'; allowed: json, raw"),
        ({"command": "HMGET"}, "needs hash_fields"),
    ],
)
def test_bad_configuration_is_named(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RedisLookup("redis://127.0.0.1:1/0", "k:{id}", **kwargs)


def test_db_given_twice_must_agree_and_db_alone_is_used(redis_url: str) -> None:
    base = redis_url.rsplit("/", 1)[0]
    with pytest.raises(ValueError, match=r"db=1 conflicts with the database 0 the URL names"):
        RedisLookup(base + "/0", "k:{id}", db=1)
    with pytest.raises(ValueError, match=r"db=1 conflicts with the database 2"):
        RedisLookup(base + "/?db=2", "k:{id}", db=1)
    other = redis.Redis.from_url(base + "/3")
    other.set("dbcheck:1", json.dumps({"where": "db3"}))
    plain = redis.Redis.from_url(base + "/0")
    plain.delete("dbcheck:1")
    try:
        for fn in (RedisLookup(base, "dbcheck:{id}", db=3), RedisLookup(base + "/3", "dbcheck:{id}", db=3)):
            assert run(lookup_all(fn, [{"order_id": 1, "id": 1}]))[0][1] == [{"where": "db3"}]
    finally:
        other.delete("dbcheck:1")
        other.close()
        plain.close()


def test_declared_field_missing_from_a_value_is_a_bad_response(db: redis.Redis, redis_url: str) -> None:
    db.set("partial:1", json.dumps({"price": 1.0}))
    fn = RedisLookup(redis_url, "partial:{sku}", fields=[Field("price", "float"), Field("currency")])
    with pytest.raises(
        RecordFailedError, match=r"field 'currency' \(path 'currency'\) is missing.*optional=True"
    ):
        run(lookup_all(fn, [{"order_id": 1, "sku": 1}]))
    fn = RedisLookup(
        redis_url, "partial:{sku}", fields=[Field("price", "float"), Field("currency", optional=True)]
    )
    assert run(lookup_all(fn, [{"order_id": 1, "sku": 1}]))[0][1] == [{"price": 1.0, "currency": None}]


def test_an_embedded_redis_dies_with_the_process_that_started_it() -> None:
    import signal
    import sys
    from pathlib import Path

    from ..processes import group, wait_exit

    lines = ["from keyed_async_wait.app.embedded import embedded_redis", "with embedded_redis() as url:"]
    script = "\n".join([*lines, "    print(url, flush=True)", "    input()"])
    root = Path(__file__).parents[2]
    with group(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True, cwd=root
    ) as proc:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("redis://127.0.0.1:")
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        (server,) = [int(pid) for pid in children]
        client = redis.Redis.from_url(url)
        assert client.ping()
        client.close()
        proc.send_signal(signal.SIGKILL)  # no finally, no context manager exit: a hard death
        proc.wait(30)
        assert wait_exit(server, 20), "redis-server outlived the process that started it"


def test_more_calls_in_flight_than_connections_wait_for_one(db: redis.Redis, redis_url: str) -> None:
    """Capacity 60 over 2 connections, one GET per record: calls wait for a connection (the
    pool blocks), none fails with 'Too many connections'."""
    fn = RedisLookup(redis_url, "price:{sku}", fields=[Field("price", "float")], max_connections=2)
    records = [{"order_id": i, "sku": i % 100} for i in range(200)]
    pairs = run(lookup_all(fn, records, capacity=60, batch_size=None))
    assert len(pairs) == 200
    assert all(results == [{"price": r["sku"] * 1.5}] for r, results in pairs)


def test_typed_fields_over_a_hash_read_its_strings_exactly(db: redis.Redis, redis_url: str) -> None:
    db.hset("typed:1", mapping={"name": "ann", "tier": "3", "score": "2.5e1", "vip": "true"})
    for bad, value in (("t:three", "three"), ("t:half", "3.5"), ("t:space", " 3"), ("t:plus", "+3")):
        db.hset(bad, mapping={"name": "x", "tier": value, "score": "1", "vip": "false"})
    fields = [Field("name"), Field("tier", "int"), Field("score", "float"), Field("vip", "bool")]
    fn = RedisLookup(redis_url, "{k}", command="HGETALL", fields=fields)
    out = run(lookup_all(fn, [{"order_id": 1, "k": "typed:1"}]))
    assert out[0][1] == [{"name": "ann", "tier": 3, "score": 25.0, "vip": True}]
    for bad, value in (("t:three", "three"), ("t:half", "3.5"), ("t:space", " 3"), ("t:plus", "+3")):
        fn = RedisLookup(redis_url, "{k}", command="HGETALL", fields=fields)
        with pytest.raises(RecordFailedError) as failure:
            run(lookup_all(fn, [{"order_id": 1, "k": bad}]))
        text = str(failure.value.__cause__)
        assert f"field 'tier': {value!r} is not int" in text and bad in text, text
    raw = RedisLookup(redis_url, "raw:{id}", decode="raw", fields=[Field("n", "int", path="n")])
    assert raw.mapper.from_strings
    json_get = RedisLookup(redis_url, "price:{sku}", fields=[Field("price", "float")])
    assert not json_get.mapper.from_strings  # JSON values carry their own types


def test_a_lookup_describes_its_own_key_for_errors() -> None:
    """What an error of a record names besides the record (no server needed: nothing is sent)."""
    fn = RedisLookup("redis://:pw@127.0.0.1:1/0", "user:{k}", command="HGETALL")
    assert fn.describe_call({"k": 7}) == "Redis HGETALL 'user:7'"


@pytest.mark.parametrize(
    "answer",
    [
        "CLUSTERDOWN The cluster is down",
        "TRYAGAIN Multiple keys request during rehashing of slot",
        "MASTERDOWN Link with MASTER is down",
        "READONLY You can't write against a read only replica.",
    ],
)
def test_an_answer_of_a_cluster_in_change_is_retryable_as_redis_py_parses_it(answer: str) -> None:
    """A pipeline hands such answers over parsed (redis-py's class, the code word gone from the
    message): still retryable, as the raw text is."""
    from redis.asyncio.connection import Connection

    from lookup.redis_errors import response_error

    parsed = Connection(host="127.0.0.1", port=1)._parser.parse_error(answer)
    assert not str(parsed).startswith(answer.split()[0])
    for exc in (parsed, redis.ResponseError(answer)):
        error = response_error("k", exc, action="write")
        assert isinstance(error, ServiceUnavailableError) and error.retryable, (type(exc), error)

"""A cache every executor shares, in a real Redis: a second worker (or a re-run) asks the
service nothing it asked before, misses are kept unless told not to, entries expire, answers
of different lookups never meet, and a Redis that cannot be reached only costs calls."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis

from keyed_async_wait import RecordFailedError
from keyed_async_wait.core.exceptions import ConfigError
from keyed_async_wait.operator import KeyedAsyncWaitOperator
from lookup import Field, HttpLookup, PartialCache, RedisLookup, Secret, SharedCache
from lookup.shared_cache import SharedCacheClient

from ..core.helpers import run
from .loops import in_threads


def users(url: str, shared: SharedCache | None, **kw: Any) -> HttpLookup:
    return HttpLookup(f"{url}/users/{{user_id}}", fields=[Field("name")], shared_cache=shared, **kw)


async def through(fn: Any, records: list[dict[str, Any]], **kw: Any) -> list[Any]:
    op = KeyedAsyncWaitOperator(fn, mode="unordered", output="pairs", **kw)
    try:
        return [pair async for pair in op.process(records)]
    finally:
        await fn.aclose()


def rows(ids: range) -> list[dict[str, Any]]:
    return [{"seq": i, "user_id": i} for i in ids]


@pytest.mark.parametrize("batch", [None, 20])
def test_a_second_worker_and_a_rerun_ask_nothing_already_asked(
    service: Any, redis_url: str, batch: int | None
) -> None:
    url, state = service
    state.users = 50  # ids 50 and above are misses (404)
    name = f"c{uuid.uuid4().hex[:8]}"
    shared = SharedCache(redis_url, expire_after_write=60, name=name)
    batch_url = f"{url}/users/batch" if batch else None
    first = run(through(users(url, shared, batch_url=batch_url), rows(range(80)), batch_size=batch))
    asked = state.keys_asked
    assert asked == 80
    again = users(url, shared, batch_url=batch_url, cache=PartialCache(10))  # an L1 of its own
    second = run(through(again, rows(range(80)), batch_size=batch))
    assert state.keys_asked == asked  # not one key asked again, misses included
    assert again.stats.shared_cache_hits == 80 and again.counters()["shared_cache_hits"] == 80
    assert sorted(map(repr, first)) == sorted(map(repr, second))  # the same answers, misses as misses
    client = redis.Redis.from_url(redis_url)
    try:
        names = list(client.scan_iter(f"kaw:cache:{name}:*"))
        assert len(names) == 80 and all(0 < client.pttl(n) <= 60_000 for n in names)
        assert not any(b"user" in n for n in names)  # a lookup key's text never shows
    finally:
        client.close()


def test_misses_are_asked_again_when_not_kept(service: Any, redis_url: str) -> None:
    url, state = service
    state.users = 10
    shared = SharedCache(redis_url, expire_after_write=60, cache_missing_key=False, name=uuid.uuid4().hex)
    run(through(users(url, shared), rows(range(20))))
    run(through(users(url, shared), rows(range(20))))
    assert state.keys_asked == 30  # the 10 misses twice, the 10 hits once


def test_answers_of_different_lookups_and_credentials_never_meet(service: Any, redis_url: str) -> None:
    url, state = service
    shared = SharedCache(redis_url, expire_after_write=60)
    run(through(users(url, shared, bearer_token=Secret("tenant-a")), rows(range(5))))
    run(through(users(url, shared, bearer_token=Secret("tenant-b")), rows(range(5))))
    assert state.keys_asked == 10  # another tenant's token: its own entries
    other = RedisLookup(redis_url, "profile:{user_id}", shared_cache=shared)
    assert other.cache_identity() != users(url, shared).cache_identity()


@pytest.mark.parametrize("credential", ["bearer", "header"])
def test_a_named_cache_keeps_tenants_apart_unless_told_to_share(
    service: Any, redis_url: str, credential: str
) -> None:
    url, state = service
    state.users = 1_000
    name = f"users-{uuid.uuid4().hex[:8]}"

    def tenant(token: str, share: bool = False) -> HttpLookup:
        shared = SharedCache(redis_url, expire_after_write=60, name=name, share_across_credentials=share)
        if credential == "bearer":
            return users(url, shared, bearer_token=Secret(token))
        return users(url, shared, headers={"X-Api-Key": Secret(token)})

    run(through(tenant("tenant-a"), rows(range(30))))
    second = tenant("tenant-b")
    run(through(second, rows(range(30))))
    assert state.keys_asked == 60 and second.stats.shared_cache_hits == 0  # the name alone shares nothing
    again = tenant("tenant-a")
    run(through(again, rows(range(30))))
    assert state.keys_asked == 60 and again.stats.shared_cache_hits == 30  # its own answers, kept
    opened = tenant("tenant-c", share=True)
    run(through(opened, rows(range(30))))
    sharing = tenant("tenant-d", share=True)
    run(through(sharing, rows(range(30))))
    assert state.keys_asked == 90 and sharing.stats.shared_cache_hits == 30  # said so: shared
    client = redis.Redis.from_url(redis_url)
    try:
        names = [n.decode() for n in client.scan_iter(f"kaw:cache:{name}*")]
        assert len(names) == 90 and not any("tenant" in n for n in names)  # 3 namespaces, digests only
    finally:
        client.close()
    assert "share_across_credentials=True" in repr(
        SharedCache(redis_url, expire_after_write=1, share_across_credentials=True)
    )
    with pytest.raises(ConfigError, match="share_across_credentials"):
        SharedCache(redis_url, expire_after_write=1, share_across_credentials="yes")  # type: ignore[arg-type]


def test_redis_lookups_of_other_users_keep_their_answers_apart(redis_url: str) -> None:
    shared = SharedCache(redis_url, expire_after_write=60, name="profiles")
    base = redis_url.replace("redis://", "")
    one = RedisLookup(f"redis://alice:a-secret@{base}", "profile:{user_id}", shared_cache=shared)
    two = RedisLookup(f"redis://bob:b-secret@{base}", "profile:{user_id}", shared_cache=shared)
    spaces = {shared.namespace(f.cache_identity(), f.cache_credentials()) for f in (one, two)}
    assert len(spaces) == 2 and all(s.startswith("profiles~") and "secret" not in s for s in spaces)


def test_a_cache_that_cannot_be_reached_only_costs_calls(service: Any, caplog: Any) -> None:
    url, state = service
    shared = SharedCache("redis://:hunter2@127.0.0.1:1/0", expire_after_write=60, socket_timeout=0.5)
    fn = users(url, shared)
    out = run(through(fn, rows(range(5))))
    assert len(out) == 5 and all(results for _, results in out) and state.keys_asked == 5
    assert "not reachable" in caplog.text and "hunter2" not in caplog.text
    assert "hunter2" not in repr(shared)


def test_a_shared_cache_is_checked_when_made(redis_url: str) -> None:
    with pytest.raises(ConfigError, match="expire_after_write"):
        SharedCache(redis_url, expire_after_write=0)
    with pytest.raises(ConfigError, match="shared_cache"):
        HttpLookup("http://127.0.0.1:1/{id}", shared_cache="redis://x")  # type: ignore[arg-type]


@pytest.mark.parametrize("batch", [None, 25])
def test_one_call_per_key_for_the_whole_job(service: Any, redis_url: str, batch: int | None) -> None:
    """Three workers ask the same 150 users at the same moments: with single flight each user
    is asked of the service once, the others waiting for that answer; without it, a key both
    workers miss at once is asked by both."""
    url, state = service
    state.latency = 0.03
    batch_url = f"{url}/users/batch" if batch else None

    def job(flight: float | None) -> list[Any]:
        shared = SharedCache(redis_url, expire_after_write=60, name=uuid.uuid4().hex, single_flight=flight)
        fns = [users(url, shared, batch_url=batch_url) for _ in range(3)]
        outs = in_threads(3, lambda i: run(through(fns[i], rows(range(150)), batch_size=batch)))
        return [outs, fns]

    [outs, fns] = job(5.0)
    assert state.keys_asked == 150  # each user once, job-wide
    assert all(sorted(map(repr, out)) == sorted(map(repr, outs[0])) for out in outs)  # the same answers
    waits = sum(fn.stats.shared_flight_waits for fn in fns)
    hits = sum(fn.stats.shared_cache_hits for fn in fns)
    assert waits > 0 and waits + hits == 300
    state.keys_asked = 0
    job(None)
    assert state.keys_asked > 150  # without it, the same moment's misses are all asked


def test_a_claim_whose_holder_died_delays_the_others_by_at_most_the_bound(
    service: Any, redis_url: str
) -> None:
    """A worker killed mid-call leaves its claims: the others wait for them at most
    ``single_flight`` seconds, then ask the service themselves; a call that fails gives its
    claims up at once."""
    import time

    url, state = service
    shared = SharedCache(redis_url, expire_after_write=60, name=uuid.uuid4().hex, single_flight=0.5)
    fn = users(url, shared)
    namespace = shared.namespace(fn.cache_identity(), fn.cache_credentials())
    client = redis.Redis.from_url(redis_url)
    try:
        dead = SharedCacheClient(shared, namespace)
        for user in (1, 2):  # claims of a dead worker, alive for 30 s
            client.set(dead._claim_of(fn.request_key({"user_id": user})), "dead", px=30_000)
        started = time.monotonic()
        out = run(through(fn, rows(range(1, 3))))
        waited = time.monotonic() - started
        assert len(out) == 2 and all(results for _, results in out) and state.keys_asked == 2
        assert 0.4 <= waited <= 2.0, waited  # the bound, not the dead claim's 30 s
    finally:
        client.close()
    state.keys_asked = 0
    patient = SharedCache(redis_url, expire_after_write=60, name=shared.name, single_flight=5.0)
    state.fail(503, count=1)
    with pytest.raises(RecordFailedError):
        run(through(users(url, patient), rows(range(7, 8))))
    started = time.monotonic()
    again = run(through(users(url, patient), rows(range(7, 8))))
    assert again[0][1] and time.monotonic() - started < 2.0  # not the 5 s of a claim left behind

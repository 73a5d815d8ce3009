"""A cache every executor shares, in a real Redis: a second worker (or a re-run) asks the
service nothing it asked before, misses are kept unless told not to, entries expire, answers
of different lookups never meet, and a Redis that cannot be reached only costs calls."""

from __future__ import annotations

import heapq
import json
import select
import subprocess
import sys
import textwrap
import uuid
from typing import Any

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from keyed_async_wait import RecordFailedError
from keyed_async_wait.core.exceptions import ConfigError
from keyed_async_wait.operator import KeyedAsyncWaitOperator
from lookup import Field, HttpLookup, PartialCache, RedisLookup, Secret, SharedCache
from lookup.claim_waits import Waits
from lookup.shared_cache import SharedCacheClient

from ..core.helpers import run
from ..processes import group, kill_group
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


@pytest.mark.parametrize("batch", [None, 20])
def test_a_claim_taken_over_is_given_up_when_the_takers_call_fails(
    service: Any, redis_url: str, batch: int | None
) -> None:
    """A dead worker's claim expires; the waiter takes it over and its call fails: it gives the
    claim up at once (the other waiters ask now), as a claim of its own, not at its expiry."""
    url, state = service
    shared = SharedCache(redis_url, expire_after_write=60, name=uuid.uuid4().hex, single_flight=30.0)
    fn = users(url, shared, batch_url=f"{url}/users/batch" if batch else None)
    namespace = shared.namespace(fn.cache_identity(), fn.cache_credentials())
    claim = SharedCacheClient(shared, namespace)._claim_of(fn.request_key({"user_id": 9}))
    client = redis.Redis.from_url(redis_url)
    try:
        client.set(claim, "dead", px=300)  # a dead worker's, about to expire
        state.fail(503, count=1)
        with pytest.raises(RecordFailedError):
            run(through(fn, rows(range(9, 10)), batch_size=batch or 1))
        assert state.faults == 1 and state.keys_asked == 1  # taken over and asked, once
        assert client.exists(claim) == 0  # given up, not held for the 30 s of single_flight
    finally:
        client.close()


_WORKER = textwrap.dedent(
    """
    import asyncio, json, sys, time
    from keyed_async_wait.operator import KeyedAsyncWaitOperator
    from lookup import Field, HttpLookup, SharedCache

    url, redis_url, name, flight, role = sys.argv[1:]
    if role == "dead":  # its calls never end: it holds their claims until it is killed
        import lookup.calls

        async def held(self, keys, units):
            print(len(keys), flush=True)
            await asyncio.Event().wait()

        lookup.calls.LookupCalls._batch_call = held
    shared = SharedCache(redis_url, expire_after_write=60, name=name, single_flight=float(flight))
    fn = HttpLookup(
        url + "/users/{user_id}", fields=[Field("name")], shared_cache=shared,
        batch_url=url + "/users/batch",
    )

    async def main():
        op = KeyedAsyncWaitOperator(fn, mode="unordered", output="pairs", batch_size=20)
        try:
            return [pair async for pair in op.process([{"seq": i, "user_id": i} for i in range(20)])]
        finally:
            await fn.aclose()

    print("ready", flush=True)
    sys.stdin.readline()  # go
    started = time.monotonic()
    out = asyncio.run(main())
    seconds = time.monotonic() - started
    answers = sorted([record["user_id"], repr(results)] for record, results in out)
    print(json.dumps({"seconds": seconds, "answers": answers}), flush=True)
    """
)


def _line(proc: subprocess.Popen[str], timeout: float) -> str:
    """The next line ``proc`` prints, waited for at most ``timeout`` seconds."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no line from the worker within {timeout} s"
    return proc.stdout.readline().strip()


def test_after_a_dead_claimant_one_waiter_asks_and_the_others_wait_for_it(
    service: Any, redis_url: str
) -> None:
    """Three worker processes share one single-flight cache: one claims 20 users and is
    SIGKILLed inside its call; the two others, asked for the same users, take its claims over
    when they expire: one of them asks each user, the other waits for that answer. The service
    sees each user once more (20 keys, not 40), and both finish within the bound."""
    url, state = service
    flight = 2.0
    name = f"c{uuid.uuid4().hex[:8]}"
    args = [sys.executable, "-c", _WORKER, url, redis_url, name, str(flight)]
    pipes: dict[str, Any] = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True}
    with (
        group([*args, "dead"], **pipes) as dead,
        group([*args, "waiter"], **pipes) as one,
        group([*args, "waiter"], **pipes) as two,
    ):
        for proc in (dead, one, two):  # imported and ready: the waiters start at once later
            assert _line(proc, 60) == "ready"
        assert dead.stdin is not None
        dead.stdin.write("go\n")
        dead.stdin.flush()
        held = 0
        for _ in range(20):  # the keys of each call it made (and holds the claims of)
            held += int(_line(dead, 30))
            if held >= 20:
                break
        assert held == 20
        kill_group(dead)
        for proc in (one, two):
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        finished = [json.loads(proc.communicate(timeout=60)[0]) for proc in (one, two)]
    assert state.keys_asked <= 21, (
        state.keys_asked,
        [f["seconds"] for f in finished],
    )  # before: 40, each waiter asked all 20
    for done in finished:
        assert done["seconds"] < 2 * flight, done["seconds"]  # the bound (about one, here)
        assert [user for user, _ in done["answers"]] == list(range(20))
        assert all(f"user-{user}'" in results for user, results in done["answers"])
    assert finished[0]["answers"] == finished[1]["answers"]


def _simulate(
    bound: float,
    keys: int,
    arrivals: list[float],
    sets: list[list[int]],
    polls: list[float],
    delays: list[float],
    calls: list[float],
    dies: list[bool],
    given_up: float | None,
) -> tuple[list[list[int]], list[float]]:
    """Waiters run by :class:`Waits` over a fake Redis and clock: a claimant claimed every
    key at 0 (expiring at ``bound``, a little apart) and died, or gave its claims up at
    ``given_up``. Waiter ``w`` arrives at ``arrivals[w]`` for the keys ``sets[w]``, looks every
    ``polls[w]`` seconds, its compare-and-sets landing ``delays[w]`` after it decided, and once
    done asks the service for the keys it must, answered ``calls[w]`` later unless it
    ``dies``. Returns each waiter's keys asked and when it was done."""
    names = [f"k{k}" for k in range(keys)]
    claims: dict[int, tuple[bytes, float]] = {k: (b"first", bound + k * 1e-4) for k in range(keys)}
    cache: set[int] = set()
    tokens = iter(range(10**6))
    asked: list[list[int]] = [[] for _ in arrivals]
    done_at = [0.0] * len(arrivals)
    waits: list[Any] = [None] * len(arrivals)
    events: list[tuple[float, int, str, int, list[int]]] = []
    seq = iter(range(10**6))

    def at(t: float, what: str, w: int, tried: list[int] | None = None) -> None:
        heapq.heappush(events, (t, next(seq), what, w, tried or []))

    def claim(k: int, t: float) -> bytes | None:
        held = claims.get(k)
        return held[0] if held is not None and held[1] > t else None

    def next_look(w: int, t: float) -> None:
        if waits[w].waits and t < waits[w].end:
            at(t + min(polls[w], max(0.0, waits[w].due(t) - t)), "look", w)
        else:
            done_at[w] = t
            mine = [sets[w][i] for i, (found, _) in enumerate(waits[w].out) if not found]
            asked[w] = mine
            if not dies[w]:
                at(t + calls[w], "answer", w, mine)

    for w, arrival in enumerate(arrivals):
        at(arrival, "first", w)
    if given_up is not None:
        at(given_up, "give up", -1)
    for _ in range(100_000):
        if not events:
            break
        t, _, what, w, tried = heapq.heappop(events)
        ks = sets[w] if w >= 0 else []
        if what == "give up":
            claims.clear()
        elif what == "answer":
            cache.update(tried)
        elif what == "first":
            first = []
            for k in ks:
                token = claim(k, t)
                pttl = -2 if token is None else round((claims[k][1] - t) * 1000)
                first.append((b"1" if k in cache else None, token, pttl))
            waits[w] = Waits(bound, t, [names[k] for k in ks], first)
            next_look(w, t)
        elif what == "look":
            open_ = waits[w].open
            texts = [b"1" if ks[i] in cache else None for i in open_]
            now_claims = [claim(ks[i], t) for i in open_]
            take = waits[w].looked(open_, texts, now_claims, t)
            if take:
                at(t + delays[w], "take", w, take)
            else:
                next_look(w, t)
        elif what == "take":
            won = []
            for i in tried:
                k, seen = ks[i], waits[w].waits[i].token
                held = claim(k, t)
                won.append(held is None or held == seen)
                if won[-1]:
                    claims[k] = (b"t%d" % next(tokens), t + bound)
            more = waits[w].took(tried, won, t)
            if more:
                at(t + delays[w], "take", w, more)
            else:
                next_look(w, t)
    assert not events, "the simulation did not end"
    return asked, done_at


@settings(max_examples=200, deadline=None)
@given(
    keys=st.integers(1, 4),
    data=st.data(),
    same_keys=st.booleans(),
    given_up=st.none() | st.floats(0.5, 0.9),
)
def test_property_one_waiter_takes_a_dead_claim_over_and_none_waits_past_twice_the_bound(
    keys: int, data: st.DataObject, same_keys: bool, given_up: float | None
) -> None:
    """Over any arrivals, poll rates, interleavings of the compare-and-sets and call times:
    no waiter waits past ``2 * bound``; with the claimant dead and the taker answering, each
    key is asked once by the waiters of the same keys; with its claims given up, every waiter
    asks at once (as before)."""
    bound = 1.0
    n = data.draw(st.integers(2, 4), label="waiters")
    every = list(range(keys))
    subsets = st.lists(st.sampled_from(every), min_size=1, max_size=keys, unique=True)
    sets = [every if same_keys else data.draw(subsets, label="keys") for _ in range(n)]
    latest = 0.45 if given_up is not None else 0.9
    arrivals = data.draw(st.lists(st.floats(0.0, latest), min_size=n, max_size=n), label="arrivals")
    polls = data.draw(st.lists(st.floats(0.002, 0.05), min_size=n, max_size=n), label="polls")
    delays = data.draw(st.lists(st.floats(0.0, 0.02), min_size=n, max_size=n), label="delays")
    calls = data.draw(st.lists(st.floats(0.0, 0.3), min_size=n, max_size=n), label="calls")
    dies = data.draw(st.lists(st.booleans(), min_size=n, max_size=n), label="dies")
    if same_keys and given_up is None:
        dies = [False] * n
    asked, done_at = _simulate(bound, keys, arrivals, sets, polls, delays, calls, dies, given_up)
    for w in range(n):
        assert done_at[w] <= arrivals[w] + 2 * bound + 2 * max(delays) + 1e-9
    if given_up is not None:
        for w in range(n):
            assert done_at[w] <= given_up + polls[w] + 1e-9  # given up: each asks at once
    elif same_keys:
        assert sorted(k for mine in asked for k in mine) == every  # each key once, job-wide

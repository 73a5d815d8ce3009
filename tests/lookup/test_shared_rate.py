"""A job-wide rate budget held in Redis: lookups in separate event loops (as in separate worker
processes) share one bucket; the bucket cleans up after itself; secrets stay out of sight."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import pytest
import redis

from keyed_async_wait.core.exceptions import ConfigError, RecordFailedError
from keyed_async_wait.operator import KeyedAsyncWaitOperator
from lookup import Field, HttpLookup, Limits, ServiceUnavailableError, SharedRate

from ..core.helpers import run
from .loops import assert_rate_held


def users(url: str, limits: Limits) -> HttpLookup:
    params = {"order": "{order}", "seq": "{seq}"}
    return HttpLookup(f"{url}/users/{{user_id}}", params=params, fields=[Field("name")], limits=limits)


async def lookup_all(fn: HttpLookup, rows: list[dict[str, Any]]) -> list[Any]:
    op = KeyedAsyncWaitOperator(fn, mode="key_ordered", key="order", output="pairs", capacity=50)
    try:
        return [pair async for pair in op.process(rows)]
    finally:
        await fn.aclose()


def test_two_event_loops_share_one_budget(service: Any, redis_url: str) -> None:
    """Two lookups, each in an event loop of its own thread (as two worker processes would be),
    started together: their calls together hold burst + rate * T, not twice that."""
    url, state = service
    state.record_calls = True
    rate, burst = 150.0, 5.0
    shared = SharedRate(redis_url, f"test-{uuid.uuid4().hex}")
    results: list[list[Any]] = [[], []]
    go = threading.Barrier(2, timeout=30)

    def worker(i: int) -> None:
        rows = [{"order": n % 20, "seq": n, "user_id": n, "w": i} for n in range(i * 100, i * 100 + 100)]
        go.wait()
        results[i] = asyncio.run(lookup_all(users(url, Limits(rate=rate, burst=burst, shared=shared)), rows))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert sorted(r["seq"] for part in results for r, _ in part) == list(range(200))
    starts = sorted(start for _, start, _, _ in state.calls)
    assert len(starts) == 200
    assert_rate_held(starts, rate, burst)  # any window of calls, across both loops
    seconds = starts[-1] - starts[0]
    assert seconds >= (200 - burst) / rate * 0.9, seconds  # one budget: per-loop buckets take half
    key = f"kaw:rate:{shared.name}"
    client = redis.Redis.from_url(redis_url)
    try:
        ttl = client.pttl(key)
        assert 0 < ttl <= (burst / rate) * 1000 + 1100, ttl  # gone once it would be full again
    finally:
        client.delete(key)
        client.close()


def test_an_unreachable_budget_fails_the_call_and_keeps_its_password(service: Any) -> None:
    url, _ = service
    shared = SharedRate("redis://:hunter2@127.0.0.1:1/0", "nowhere")
    assert "hunter2" not in repr(shared) and "hunter2" not in repr(Limits(rate=5, shared=shared))
    fn = users(url, Limits(rate=100, shared=shared))
    rows = [{"order": 1, "seq": 1, "user_id": 1}]
    with pytest.raises(RecordFailedError) as failed:
        run(lookup_all(fn, rows))
    cause = failed.value.__cause__
    assert isinstance(cause, ServiceUnavailableError) and cause.__cause__ is None
    assert "shared rate budget 'nowhere'" in str(failed.value) and "hunter2" not in str(failed.value)


def test_a_shared_budget_is_checked_when_made(redis_url: str) -> None:
    with pytest.raises(ConfigError, match="rate= or keys_rate="):
        Limits(adaptive=True, shared=SharedRate(redis_url, "x"))
    with pytest.raises(ConfigError, match="redis://"):
        SharedRate("http://127.0.0.1:1", "x")
    with pytest.raises(ConfigError, match="without spaces"):
        SharedRate(redis_url, "a b")

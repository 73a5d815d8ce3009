"""Limits on a lookup against the real service with a capacity model: adaptive concurrency, a
rate limit, a Retry-After pause for the whole lookup, a circuit breaker; key order holds."""

from __future__ import annotations

from typing import Any

import pytest

from keyed_async_wait import RetryStrategy
from keyed_async_wait.core.exceptions import ConfigError
from keyed_async_wait.operator import KeyedAsyncWaitOperator
from lookup import CircuitOpenError, Field, HttpLookup, Limits

from ..core.helpers import run, until
from ..spark.calls import overlaps_and_disorder
from .loops import SERVICE_CLOCK_SLACK, assert_rate_held

RETRY = RetryStrategy.fixed_delay(8, 0.01)


def records(n: int, keys: int = 50) -> list[dict[str, Any]]:
    return [{"order": i % keys, "seq": i, "user_id": i} for i in range(n)]


def users(url: str, limits: Limits | None) -> HttpLookup:
    params = {"order": "{order}", "seq": "{seq}"}
    return HttpLookup(f"{url}/users/{{user_id}}", params=params, fields=[Field("name")], limits=limits)


async def lookup_all(fn: HttpLookup, rows: list[dict[str, Any]], **kw: Any) -> list[Any]:
    op = KeyedAsyncWaitOperator(fn, mode="key_ordered", key="order", output="pairs", retry=RETRY, **kw)
    try:
        return [pair async for pair in op.process(rows)]
    finally:
        await fn.aclose()


def test_adaptive_concurrency_finds_the_services_capacity(service: Any) -> None:
    url, state = service
    state.latency, state.max_concurrent, state.record_calls = 0.02, 10, True
    fixed = run(lookup_all(users(url, None), records(300), capacity=100, on_error="emit"))
    rejected_fixed = state.rejected
    state.rejected, state.calls = 0, []
    fn = users(url, Limits(adaptive=True, max_concurrency=100))
    adaptive = run(lookup_all(fn, records(300), capacity=100))
    assert len(fixed) == 300 and sorted(r["seq"] for r, _ in adaptive) == list(range(300))
    assert all(res == [{"name": f"user-{r['user_id']}"}] for r, res in adaptive)
    assert overlaps_and_disorder(state.calls) == (0, 0)  # key order holds under the limit
    assert rejected_fixed > 50  # the fixed capacity floods a service that takes 10
    assert state.rejected < rejected_fixed / 3, (state.rejected, rejected_fixed)
    print(f"429s: fixed capacity {rejected_fixed}, adaptive {state.rejected}")


def test_a_rate_limit_holds_for_every_window_of_calls(service: Any) -> None:
    url, state = service
    state.record_calls = True
    rate, burst = 200.0, 5.0
    run(lookup_all(users(url, Limits(rate=rate, burst=burst)), records(120)))
    starts = sorted(start for _, start, _, _ in state.calls)
    assert len(starts) == 120
    # any window of calls: at most burst + rate * T (on the service's clock: see SERVICE_CLOCK_SLACK).
    # No limit (120 calls in about 50 ms) or one at twice the rate still fails one of the two bounds.
    assert_rate_held(starts, rate, burst)
    # and the limit is not loose: 120 calls need (120 - burst) / rate seconds at least
    assert starts[-1] - starts[0] >= (120 - burst) / rate - SERVICE_CLOCK_SLACK


def test_retry_after_pauses_the_whole_lookup(service: Any) -> None:
    url, state = service
    state.record_calls = True
    state.fail(429, count=1, retry_after="0.3")
    fn = users(url, Limits(rate=10_000))
    rows = records(40, keys=40)
    pause: list[float] = []

    async def source() -> Any:
        yield rows[0]  # its call gets the 429
        await until(lambda: fn._gate is not None and fn._gate.paused_until > 0, turns=500_000)
        assert fn._gate is not None
        pause.append(fn._gate.paused_until)
        for row in rows[1:]:  # other keys: they must wait for the pause too
            yield row

    pairs = run(lookup_all(fn, source()))  # type: ignore[arg-type]
    assert len(pairs) == 40
    first_calls = [start for _, start, _, query in state.calls if query["seq"] != "0"]
    assert len(first_calls) == 39 and min(first_calls) >= pause[0] - 0.01  # none during the pause


def test_an_open_circuit_stops_calling_and_fails_records_at_once(service: Any) -> None:
    url, state = service
    state.fail(503)  # an outage
    fn = users(url, Limits(breaker_failures=5, breaker_cool_off=60))
    pairs = run(lookup_all(fn, records(100), capacity=10, on_error="emit"))
    assert len(pairs) == 100
    short = [p for p in pairs if type(p).__name__ == "FailedRecord" and p.error_type == "CircuitOpenError"]
    assert len(short) >= 80 and all("circuit is open" in p.error_message for p in short)
    # failed at once, without burning attempts: only the records in flight when it opened retried
    assert sum(p.attempts > 1 for p in short) <= 10
    # retries alone would call 8 times per record (800); the breaker stops after a few
    assert state.requests <= 5 + 10, state.requests


def test_limits_are_checked_when_made() -> None:
    with pytest.raises(ConfigError, match="rate=-1"):
        Limits(rate=-1)
    with pytest.raises(ConfigError, match="failures=0"):
        Limits(breaker_failures=0)
    with pytest.raises(ConfigError, match="limits="):
        HttpLookup("http://127.0.0.1:1/u/{id}", limits=5)  # type: ignore[arg-type]
    assert CircuitOpenError.retryable is False


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"keys_rate": -5}, "keys_rate=-5 is not allowed"),
        ({"rate": 0}, "rate=0 is not allowed"),
        ({"rate": 5, "burst": -1}, "burst=-1 is not allowed"),
        ({"breaker_failures": 0}, "breaker_failures=0 is not allowed"),
        ({"breaker_failures": 3, "breaker_cool_off": -2}, "breaker_cool_off=-2 is not allowed"),
    ],
)
def test_a_bad_limit_is_named_as_the_caller_wrote_it(options: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        Limits(**options)

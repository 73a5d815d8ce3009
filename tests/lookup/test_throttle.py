"""Property tests of the throttling policies: rate, adaptive concurrency, circuit breaker."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keyed_async_wait.core.exceptions import ConfigError
from lookup.throttle import AimdLimit, CircuitBreaker, TokenBucket


@settings(max_examples=300, deadline=None)
@given(
    rate=st.floats(0.5, 1000),
    burst=st.one_of(st.none(), st.floats(1, 100)),
    gaps=st.lists(st.floats(0, 0.5), min_size=1, max_size=200),
)
def test_a_bucket_never_grants_more_than_its_burst_plus_rate_times_time(
    rate: float, burst: float | None, gaps: list[float]
) -> None:
    bucket = TokenBucket(rate, burst)
    now, used_at = 0.0, []
    for gap in gaps:
        now += gap
        used_at.append(now + bucket.reserve(now))  # when the caller may use its token
    used_at.sort()
    for i, start in enumerate(used_at):  # any window [start, end] holds at most burst + rate * T
        for j in range(i, len(used_at)):
            assert j - i + 1 <= bucket.burst + rate * (used_at[j] - start) + 1e-6


def test_a_bucket_waits_exactly_for_the_tokens_it_lacks() -> None:
    bucket = TokenBucket(10, burst=2)
    assert bucket.reserve(0.0) == 0 and bucket.reserve(0.0) == 0
    assert bucket.reserve(0.0) == pytest.approx(0.1)  # the third waits one token's time
    assert bucket.reserve(1.0) == 0  # refilled (to the burst, no more)


events = st.lists(
    st.tuples(st.sampled_from(["ok", "slow", "overload"]), st.floats(0.001, 0.5), st.floats(0, 0.2)),
    max_size=300,
)


@settings(max_examples=300, deadline=None)
@given(maximum=st.integers(1, 200), minimum=st.integers(1, 10), steps=events)
def test_an_adaptive_limit_stays_within_its_bounds(maximum: int, minimum: int, steps: list) -> None:
    minimum = min(minimum, maximum)
    limit = AimdLimit(maximum, minimum=minimum)
    now = 0.0
    for kind, latency, gap in steps:
        now += gap
        before = limit.limit
        if kind == "overload":
            limit.overloaded(now)
            assert limit.limit <= before
        else:
            limit.succeeded(latency * (10 if kind == "slow" else 1), now)
            assert limit.limit <= before + 1.0  # additive: at most one more per success
        assert minimum <= limit.allowed <= maximum


def test_an_adaptive_limit_grows_on_success_and_halves_once_per_burst_of_rejections() -> None:
    limit = AimdLimit(100, initial=10)
    for i in range(200):
        limit.succeeded(0.02, i * 0.001)
    grown = limit.limit
    assert grown > 20
    for _ in range(50):  # the rejections of the calls already in flight: one cut
        limit.overloaded(1.0)
    assert limit.limit == pytest.approx(grown / 2)
    limit.overloaded(1.0 + 0.05)  # a round trip later: cut again
    assert limit.limit == pytest.approx(grown / 4)


@settings(max_examples=300, deadline=None)
@given(
    failures=st.integers(1, 5),
    cool_off=st.floats(0.1, 5),
    steps=st.lists(st.tuples(st.booleans(), st.floats(0, 2)), max_size=200),
)
def test_an_open_circuit_lets_nothing_through_before_its_cool_off_then_one_probe(
    failures: int, cool_off: float, steps: list
) -> None:
    breaker = CircuitBreaker(failures, cool_off)
    now, in_flight, streak, opened_at = 0.0, 0, 0, None
    for ok, gap in steps:
        now += gap
        state = breaker.state
        allowed = breaker.allow(now)
        if state == CircuitBreaker.OPEN and opened_at is not None and now - opened_at < cool_off:
            assert not allowed
        if breaker.state == CircuitBreaker.HALF_OPEN:
            assert in_flight <= 1
        if not allowed:
            continue
        probe = breaker.state == CircuitBreaker.HALF_OPEN
        in_flight += probe
        breaker.record(ok, now)
        in_flight -= probe
        streak = 0 if ok else streak + 1
        if breaker.state == CircuitBreaker.OPEN and (probe or streak >= failures):
            opened_at = now
        if probe:
            assert breaker.state == (CircuitBreaker.CLOSED if ok else CircuitBreaker.OPEN)


def test_a_circuit_opens_after_its_failures_and_a_probe_closes_it() -> None:
    breaker = CircuitBreaker(failures=3, cool_off=10)
    for _ in range(3):
        assert breaker.allow(0.0)
        breaker.record(False, 0.0)
    assert breaker.state == "open" and not breaker.allow(5.0) and breaker.remaining(5.0) == 5.0
    assert breaker.allow(10.0) and not breaker.allow(10.0)  # one probe at a time
    breaker.record(True, 10.1)
    assert breaker.state == "closed" and breaker.allow(10.2)


def test_bad_policy_settings_are_named() -> None:
    with pytest.raises(ConfigError, match="rate=0"):
        TokenBucket(0)
    with pytest.raises(ConfigError, match="backoff=1"):
        AimdLimit(10, backoff=1)
    with pytest.raises(ConfigError, match="failures=0"):
        CircuitBreaker(0)

"""Property tests of the pure outcome unit: what happens to a record after an attempt."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from keyed_async_wait.core.entry import Entry
from keyed_async_wait.core.exceptions import RecordFailedError, RecordTimeoutError, ResultTypeError
from keyed_async_wait.core.outcome import (
    DONE,
    Emit,
    Expire,
    Fail,
    Keep,
    OutcomePolicy,
    Park,
    Retry,
)
from keyed_async_wait.core.parking import DeferPolicy, ParkInfo
from keyed_async_wait.core.retry import RetryStrategy, lookup_miss


class Flaky(Exception):
    def __init__(self, retryable: bool = True, retry_after: float | None = None) -> None:
        super().__init__("flaky")
        self.retryable = retryable
        self.retry_after = retry_after


def _entry(attempts: int, started: float, meta: ParkInfo | None = None) -> Entry:
    entry = Entry(1, {"id": 7}, 7)
    entry.attempts = attempts
    entry.started = started
    entry.meta = meta
    return entry


strategies = st.one_of(
    st.none(),
    st.builds(
        RetryStrategy.fixed_delay,
        max_attempts=st.integers(1, 6),
        delay=st.floats(0, 5),
        retry_on_result=st.sampled_from([None, lookup_miss]),
    ),
    st.builds(
        RetryStrategy.exponential_backoff,
        max_attempts=st.integers(1, 6),
        initial_delay=st.floats(0.001, 2),
        max_delay=st.floats(2, 10),
        multiplier=st.floats(1, 3),
        retry_on_result=st.sampled_from([None, lookup_miss]),
    ),
)
on_errors = st.sampled_from(["fail", "emit", "defer"])
timeouts = st.one_of(st.none(), st.floats(0.01, 60))
errors = st.one_of(
    st.builds(Flaky, retryable=st.booleans(), retry_after=st.one_of(st.none(), st.floats(0, 30))),
    st.just(ResultTypeError("expected a list of results, got str")),
)


def _policy(retry: RetryStrategy | None, on_error: str, timeout: float | None) -> OutcomePolicy:
    defer = DeferPolicy(delay=1.0, max_age=100.0) if on_error == "defer" else None
    return OutcomePolicy(retry, on_error, defer, timeout)


def _max_attempts(retry: RetryStrategy) -> int:
    return int(retry.stop.max_attempt_number)  # type: ignore[attr-defined]


@settings(max_examples=400, deadline=None)
@given(
    retry=strategies,
    on_error=on_errors,
    timeout=timeouts,
    exc=errors,
    attempts=st.integers(1, 8),
    elapsed=st.floats(0, 120),
    holding=st.booleans(),
)
def test_an_error_is_retried_only_within_the_strategy_or_ends_by_the_error_policy(
    retry: RetryStrategy | None,
    on_error: str,
    timeout: float | None,
    exc: BaseException,
    attempts: int,
    elapsed: float,
    holding: bool,
) -> None:
    policy = _policy(retry, on_error, timeout)
    started, now, wall = 1000.0, 1000.0 + elapsed, 5_000.0
    decision = policy.after_error(_entry(attempts, started), exc, now, wall, holding)

    retryable = (
        retry is not None
        and not isinstance(exc, ResultTypeError)
        and getattr(exc, "retryable", True)
        and attempts < _max_attempts(retry)
    )
    if not retryable:
        # no attempt left: exactly one of the three ends, chosen by the error policy
        expected = {"fail": Fail, "emit": Emit, "defer": Park}[on_error]
        assert isinstance(decision, expected)
        if isinstance(decision, Fail):
            assert decision.error.key == 7
            assert decision.error.attempts == attempts
        if isinstance(decision, Emit):
            assert decision.failed.key == 7 and decision.failed.attempts == attempts
        if isinstance(decision, Park):
            assert decision.info.attempts == attempts and decision.info.next_try == wall + 1.0
        return
    # a retry was due: a held run keeps the record, a deadline in the way expires it
    if holding:
        assert isinstance(decision, Keep)
        return
    assert isinstance(decision, (Retry, Expire))
    if isinstance(decision, Retry):
        assert decision.delay >= 0
        retry_after = getattr(exc, "retry_after", None)
        if retry_after is not None:
            assert decision.delay >= retry_after  # the service said when to come back
        if timeout is not None:
            assert now + decision.delay < started + timeout  # the next attempt fits before the deadline
    else:
        assert timeout is not None


@settings(max_examples=300, deadline=None)
@given(
    retry=strategies,
    on_error=on_errors,
    timeout=timeouts,
    results=st.lists(st.integers(), max_size=3),
    attempts=st.integers(1, 8),
    holding=st.booleans(),
)
def test_results_stand_unless_the_result_predicate_asks_for_another_attempt(
    retry: RetryStrategy | None,
    on_error: str,
    timeout: float | None,
    results: list[Any],
    attempts: int,
    holding: bool,
) -> None:
    policy = _policy(retry, on_error, timeout)
    decision = policy.after_results(_entry(attempts, 0.0), results, 0.0, holding)
    wants = (
        retry is not None
        and retry.retry_on_result is lookup_miss
        and not results
        and attempts < _max_attempts(retry)
    )
    if not wants:
        assert decision is DONE  # also when attempts ran out: the last results are emitted (Flink's rule)
    elif holding:
        assert isinstance(decision, Keep)
    else:
        assert isinstance(decision, (Retry, Expire))


@settings(max_examples=200, deadline=None)
@given(on_error=on_errors, attempts=st.integers(1, 5), timeout=st.floats(0.01, 60))
def test_an_expired_record_fails_with_a_timeout_by_the_error_policy(
    on_error: str, attempts: int, timeout: float
) -> None:
    decision = _policy(None, on_error, timeout).expired(_entry(attempts, 0.0), 10.0)
    if isinstance(decision, Fail):
        assert on_error == "fail"
        assert isinstance(decision.error, RecordTimeoutError) and decision.error.attempts == attempts
    elif isinstance(decision, Emit):
        assert on_error == "emit" and decision.failed.error_type == "RecordTimeoutError"
    else:
        assert on_error == "defer" and isinstance(decision, Park)


@settings(max_examples=200, deadline=None)
@given(deferrals=st.integers(0, 10), age=st.floats(0, 300), attempts=st.integers(1, 5))
def test_a_deferral_older_than_its_maximum_age_is_emitted_not_parked_again(
    deferrals: int, age: float, attempts: int
) -> None:
    wall = 10_000.0
    earlier = ParkInfo(attempts=3, deferrals=deferrals, deferred_since=wall - age if deferrals else None)
    policy = OutcomePolicy(None, "defer", DeferPolicy(delay=1.0, max_age=100.0), None)
    decision = policy.failed(_entry(attempts, 0.0, meta=earlier), Flaky(), wall)
    too_old = deferrals > 0 and age >= 100.0
    if too_old:
        assert isinstance(decision, Emit)
        assert isinstance(decision.failed.exception, RecordFailedError)
        assert decision.failed.attempts == 3 + attempts  # attempts of every run, not only this one
    else:
        assert isinstance(decision, Park)
        assert decision.info.deferrals == deferrals + 1
        assert decision.info.attempts == 3 + attempts


def test_an_error_of_a_record_without_a_key_names_the_record_by_its_values() -> None:
    timeout = RecordTimeoutError(None, 1, {"order_id": 7, "seq": 3, "_kaw_chain": object()}, 0.5)
    assert str(timeout).startswith("record {'order_id': 7, 'seq': 3} failed after 1 attempt: timed out")
    failed = RecordFailedError(None, 2, {"n": "x" * 500}, "boom")
    assert str(failed).startswith("record {'n': 'xxx") and len(str(failed)) < 200
    assert str(RecordFailedError(5, 1, {"n": 1}, "boom")).startswith("record with key 5 failed")


def test_an_error_names_what_the_action_did_for_the_record_when_it_says() -> None:
    policy = OutcomePolicy(None, "fail", None, 1.0, describe=lambda record: f"GET /u/{record['id']}")
    decision = policy.expired(_entry(1, 0.0), 2.0)
    assert isinstance(decision, Fail) and decision.error.target == "GET /u/7"
    assert "(GET /u/7) failed after 1 attempt" in str(decision.error)
    broken = OutcomePolicy(None, "fail", None, 1.0, describe=lambda record: record["missing"])
    decision = broken.expired(_entry(1, 0.0), 2.0)  # a record the action cannot describe
    assert isinstance(decision, Fail) and decision.error.target is None

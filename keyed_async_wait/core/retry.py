"""Retry decisions, on tenacity's stop and wait strategies.

A :class:`RetryStrategy` never sleeps: :meth:`RetryStrategy.next_delay` says how long to wait
before the next attempt, or ``None`` when the record is done (tenacity's ``BaseRetrying.iter``
is the model). The operator's asyncio layer does the waiting, so a retrying record costs a timer,
not a task.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import tenacity
from tenacity.stop import stop_base
from tenacity.wait import wait_base

from .exceptions import ConfigError

__all__ = ["RetryStrategy", "is_retryable", "lookup_miss"]

ExceptionPredicate = Callable[[BaseException], bool]
ResultPredicate = Callable[[Sequence[Any]], bool]


def is_retryable(exc: BaseException) -> bool:
    """The default exception predicate: retry unless the error says ``retryable = False``."""
    return bool(getattr(exc, "retryable", True))


def lookup_miss(results: Sequence[Any]) -> bool:
    """Flink's ``lookup_miss`` result predicate: an empty result is a miss worth retrying."""
    return len(results) == 0


def _never(_: Any) -> bool:
    return False


@dataclass(frozen=True)
class RetryStrategy:
    """When to try a record again, and after how long.

    ``stop`` and ``wait`` are tenacity strategies and combine as tenacity's do
    (``stop_after_attempt(5) | stop_after_delay(30)``, ``wait_fixed(1) + wait_random(0, 1)``).
    ``retry_on_exception`` decides whether an exception is worth another attempt (by default
    every exception whose ``retryable`` attribute is not False); ``retry_on_result`` whether a
    result list is (by default none is; :func:`lookup_miss` retries empty results). When the
    attempts are used up on a result predicate, the last result is emitted as it is (Flink's rule);
    on an exception, the record fails. An exception with a ``retry_after`` attribute (seconds)
    is retried no sooner than that.
    """

    stop: stop_base
    wait: wait_base
    retry_on_exception: ExceptionPredicate = is_retryable
    retry_on_result: ResultPredicate = _never

    @classmethod
    def fixed_delay(
        cls,
        max_attempts: int,
        delay: float,
        *,
        jitter: float = 0.0,
        retry_on_exception: ExceptionPredicate | None = None,
        retry_on_result: ResultPredicate | None = None,
    ) -> RetryStrategy:
        """Up to ``max_attempts`` attempts in all, ``delay`` seconds apart (plus up to ``jitter``)."""
        _check_attempts(max_attempts)
        _check_non_negative("delay", delay)
        _check_non_negative("jitter", jitter)
        return cls._of(max_attempts, tenacity.wait_fixed(delay), jitter, retry_on_exception, retry_on_result)

    @classmethod
    def exponential_backoff(
        cls,
        max_attempts: int,
        initial_delay: float,
        max_delay: float,
        multiplier: float = 2.0,
        *,
        jitter: float = 0.0,
        retry_on_exception: ExceptionPredicate | None = None,
        retry_on_result: ResultPredicate | None = None,
    ) -> RetryStrategy:
        """Delays of ``initial_delay * multiplier**n``, capped at ``max_delay``, plus jitter."""
        _check_attempts(max_attempts)
        _check_non_negative("initial_delay", initial_delay)
        _check_non_negative("jitter", jitter)
        if max_delay < initial_delay:
            raise ConfigError("max_delay", max_delay, f"a number >= initial_delay ({initial_delay})")
        ok = isinstance(multiplier, (int, float)) and not isinstance(multiplier, bool)
        if not ok or not math.isfinite(multiplier) or multiplier < 1:
            raise ConfigError("multiplier", multiplier, "a number >= 1")
        wait = tenacity.wait_exponential(
            multiplier=initial_delay, exp_base=multiplier, min=initial_delay, max=max_delay
        )
        return cls._of(max_attempts, wait, jitter, retry_on_exception, retry_on_result)

    @classmethod
    def _of(
        cls,
        max_attempts: int,
        wait: wait_base,
        jitter: float,
        retry_on_exception: ExceptionPredicate | None,
        retry_on_result: ResultPredicate | None,
    ) -> RetryStrategy:
        if jitter:
            wait = wait + tenacity.wait_random(0, jitter)
        return cls(
            stop=tenacity.stop_after_attempt(max_attempts),
            wait=wait,
            retry_on_exception=retry_on_exception or is_retryable,
            retry_on_result=retry_on_result or _never,
        )

    @property
    def checks_results(self) -> bool:
        """Whether any result may be retried (so results need checking at all)."""
        return self.retry_on_result is not _never

    def wants_result_retry(self, results: Sequence[Any]) -> bool:
        return self.retry_on_result is not _never and self.retry_on_result(results)

    def next_delay(
        self,
        attempt: int,
        started: float,
        *,
        exception: BaseException | None = None,
        results: Sequence[Any] | None = None,
        now: float | None = None,
    ) -> float | None:
        """Seconds to wait before attempt ``attempt + 1``, or None to stop trying.

        ``attempt`` is the number of the attempt that just ended (1 for the first); ``started``
        the monotonic time of the first attempt.
        """
        if exception is not None:
            if not self.retry_on_exception(exception):
                return None
        elif results is None or not self.wants_result_retry(results):
            return None
        state = tenacity.RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
        state.start_time = started
        state.attempt_number = attempt
        state.outcome_timestamp = time.monotonic() if now is None else now
        outcome: tenacity.Future = tenacity.Future(attempt)
        if exception is not None:
            outcome.set_exception(exception)
        else:
            outcome.set_result(results)
        state.outcome = outcome
        if self.stop(state):
            return None
        delay = max(0.0, float(self.wait(state)))
        # a service that said when to come back (HTTP Retry-After) is not asked again sooner
        retry_after = getattr(exception, "retry_after", None)
        if retry_after is not None and retry_after > delay:
            delay = float(retry_after)
        return delay


def _check_attempts(max_attempts: int) -> None:
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise ConfigError("max_attempts", max_attempts, "an integer >= 1")


def _check_non_negative(name: str, value: float) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value < 0:
        raise ConfigError(name, value, "a number of seconds >= 0")

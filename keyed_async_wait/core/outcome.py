"""What happens to a record after an attempt: a pure decision, on tenacity's ``iter()`` model.

:class:`OutcomePolicy` is given how an attempt ended (its results, or the exception it raised,
or that its time ran out) together with the record's own history (attempts, first start, its
deferrals) and returns a :data:`Decision`; it never sleeps, schedules or emits anything. The
asyncio runtime carries the decision out.

================  ==============================================================================
``DONE``          the results stand (:class:`Done` carries them)
:class:`Retry`    try again after ``delay`` seconds (the retry strategy said so, and it fits before
                  the record's deadline)
:class:`Expire`   the deadline comes before the next attempt could: the record times out now
:class:`Keep`     a retry was due but the run is held: the record is kept, with its attempts,
                  for the next run
:class:`Park`     ``on_error="defer"``: parked, with its key, until ``info.next_try``
:class:`Fail`     ``on_error="fail"``: the run ends with this error
:class:`Emit`     ``on_error="emit"`` (or a deferral too old): a :class:`FailedRecord` in its place
================  ==============================================================================

Invariants (property-tested): a retry never exceeds the strategy's attempts nor its
predicates; a non-retryable error or a type error is never retried; a held run never retries;
every failure becomes exactly one of Park, Fail or Emit, by the error policy; a Retry's delay is
no shorter than the error's ``retry_after``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from .elements import FailedRecord
from .entry import Entry
from .exceptions import RecordFailedError, RecordTimeoutError, ResultTypeError
from .parking import FRESH, DeferPolicy, ParkInfo
from .retry import RetryStrategy

__all__ = [
    "DONE",
    "Decision",
    "Done",
    "Emit",
    "Expire",
    "Fail",
    "Keep",
    "OutcomePolicy",
    "Park",
    "Retry",
]


@dataclass(frozen=True, slots=True)
class Done:
    results: list[Any]


@dataclass(frozen=True, slots=True)
class Retry:
    delay: float


@dataclass(frozen=True, slots=True)
class Expire:
    pass


@dataclass(frozen=True, slots=True)
class Keep:
    pass


@dataclass(frozen=True, slots=True)
class Park:
    info: ParkInfo


@dataclass(frozen=True, slots=True)
class Fail:
    error: RecordFailedError


@dataclass(frozen=True, slots=True)
class Emit:
    failed: FailedRecord


Decision = Done | Retry | Expire | Keep | Park | Fail | Emit
DONE: Final = Done([])  # the results stand: the caller keeps the list it has (no allocation per record)
_KEEP: Final = Keep()
_EXPIRE: Final = Expire()


class OutcomePolicy:
    """Decides a record's next step from how its attempt ended (pure; see the module doc)."""

    __slots__ = ("defer", "describe", "emit", "retry", "retry_results", "timeout")

    def __init__(
        self,
        retry: RetryStrategy | None,
        on_error: str,
        defer: DeferPolicy | None,
        timeout: float | None,
        describe: Callable[[Any], str | None] | None = None,
    ) -> None:
        self.describe = describe  # what the action does for a record, for its errors
        self.retry = retry
        self.retry_results = retry is not None and retry.checks_results
        self.emit = on_error != "fail"
        self.defer = defer
        self.timeout = timeout

    def after_results(self, entry: Entry, results: list[Any], now: float, holding: bool) -> Decision:
        """The attempt returned ``results`` (``now``: the loop's monotonic time)."""
        if self.retry_results:
            assert self.retry is not None
            delay = self.retry.next_delay(entry.attempts, entry.started, results=results, now=now)
            if delay is not None:
                return self._again(entry, delay, now, holding)
        return DONE

    def after_error(
        self, entry: Entry, exc: BaseException, now: float, wall: float, holding: bool
    ) -> Decision:
        """The attempt raised ``exc`` (``wall``: wall-clock seconds, for deferrals)."""
        retry = self.retry
        if retry is not None and not isinstance(exc, ResultTypeError):
            delay = retry.next_delay(entry.attempts, entry.started, exception=exc, now=now)
            if delay is not None:
                return self._again(entry, delay, now, holding)
        return self.failed(entry, exc, wall)

    def expired(self, entry: Entry, wall: float) -> Decision:
        """The record's time ran out (no fallback, or the fallback gave none)."""
        assert self.timeout is not None
        return self.failed(
            entry,
            RecordTimeoutError(entry.key, entry.attempts, entry.record, self.timeout, self._target(entry)),
            wall,
        )

    def _target(self, entry: Entry) -> str | None:
        """What the action does for ``entry``'s record, if it says; never raises (an error is
        being described: a record its action cannot describe is still named by its values)."""
        if self.describe is None:
            return None
        try:
            return self.describe(entry.record)
        except Exception:  # noqa: BLE001 - describing must never replace the error described
            return None

    def _again(self, entry: Entry, delay: float, now: float, holding: bool) -> Decision:
        if holding:  # no new attempt: kept, with its attempts, for the next run
            return _KEEP
        if self.timeout is not None and now + delay >= entry.started + self.timeout:
            return _EXPIRE  # it would time out before its next attempt: it does so now
        return Retry(delay)

    def failed(self, entry: Entry, exc: BaseException, wall: float) -> Decision:
        """No attempt is left: park (defer), end the run (fail) or emit a failed record."""
        attempts = entry.attempts
        defer = self.defer
        if defer is not None:
            info = defer.defer(entry.meta or FRESH, wall, attempts, f"{type(exc).__name__}: {exc}")
            if not defer.expired(info, wall):
                return Park(info)
            assert info.deferred_since is not None
            exc = RecordFailedError(
                entry.key,
                info.attempts,
                entry.record,
                f"deferred {info.deferrals - 1} times over {wall - info.deferred_since:.0f} s, the maximum "
                f"deferral age; last error {info.error}",
                self._target(entry),
            )
            attempts = info.attempts
        if isinstance(exc, RecordFailedError):
            error: RecordFailedError = exc
        else:
            error = RecordFailedError(
                entry.key, attempts, entry.record, f"{type(exc).__name__}: {exc}", self._target(entry)
            )
            error.__cause__ = exc
        if not self.emit:
            return Fail(error)
        return Emit(
            FailedRecord(
                record=entry.record,
                key=entry.key,
                error_type=type(exc).__name__,
                error_message=str(exc),
                attempts=attempts,
                exception=exc,
            )
        )

"""Read-only statistics of an operator's run, for tests, metrics and logs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.entry import State

__all__ = ["OperatorStats", "stats_of"]


@dataclass(frozen=True)
class OperatorStats:
    """A read-only view of the operator at one moment (for tests, metrics and logs)."""

    inside: int  # records counted against capacity
    in_flight: int  # running an attempt, or between attempts
    waiting_retry: int
    buffered: int  # ready, in the active buffer of a batching action
    blocked_keys: int  # keys with records waiting behind a running one
    blocked_records: int
    finished: int  # results known, not handed out yet
    held_by_watermark: int
    pending_watermarks: int
    records_in: int
    records_out: int
    attempts: int
    retries: int
    timeouts: int
    failures: int
    batches: int
    deferred: int = 0  # records parked by the defer policy
    parked_keys: int = 0  # keys whose records are parked
    parked_records: int = 0


EMPTY = OperatorStats(*([0] * 16))


def stats_of(runtime: Any) -> OperatorStats:
    """The statistics of a :class:`~keyed_async_wait.runtime.runtime.Runtime` now."""
    ctl = runtime.ctl
    counts = [0, 0, 0, 0, 0]
    for entry in ctl.live_entries():
        if not entry.watermark:
            counts[entry.state] += 1
    c = runtime.counters
    return OperatorStats(
        inside=ctl.records_inside,
        in_flight=counts[State.RUNNING] + counts[State.WAITING_RETRY],
        waiting_retry=counts[State.WAITING_RETRY],
        buffered=runtime.buffered,
        blocked_keys=ctl.blocked_keys,
        blocked_records=ctl.blocked_records,
        finished=counts[State.DONE],
        held_by_watermark=ctl.held_by_watermark,
        pending_watermarks=ctl.pending_watermarks,
        records_in=c.records_in,
        records_out=c.records_out,
        attempts=c.attempts,
        retries=c.retries,
        timeouts=c.timeouts,
        failures=c.failures,
        batches=c.batches,
        deferred=c.deferred,
        parked_keys=ctl.parked.keys,
        parked_records=len(ctl.parked),
    )

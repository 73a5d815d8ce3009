"""Timeouts and retry timers of one run.

A record's timeout is an entry in a timer wheel (:mod:`keyed_async_wait.core.deadlines`): one
event-loop timer per time bucket, not per record. A retry is a ``call_later`` timer, not a task.
When either fires, the callbacks the timers were made with take over: ``expired(entry)`` (its
time ran out) and ``retry_now(entry)`` (its retry's delay passed); the dispatcher, which owns
the timers, gives both.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ..core.deadlines import Deadlines
from ..core.entry import Entry, State
from .run import Run

__all__ = ["Timers"]


class Timers:
    """Arms and disarms timeouts, schedules retries (see the module doc)."""

    __slots__ = ("deadlines", "expired", "retry_now", "run", "timeout")

    def __init__(
        self, run: Run, *, expired: Callable[[Entry], None], retry_now: Callable[[Entry], None]
    ) -> None:
        self.run = run
        self.timeout = run.spec.timeout
        self.deadlines = (
            Deadlines(min(0.05, self.timeout / 100), run.loop.call_at, self._fire)
            if self.timeout is not None
            else None
        )
        self.expired = expired
        self.retry_now = retry_now

    def arm(self, entry: Entry) -> None:
        """Watch ``entry`` until its deadline (once: from its first attempt)."""
        if self.deadlines is not None and entry.timer is None:
            assert self.timeout is not None
            entry.timer = self.deadlines.arm(entry, entry.started + self.timeout)

    def arm_many(self, entries: list[Entry], started: float) -> None:
        """:meth:`arm` for a batch's entries; those not yet watched started at ``started``
        (a retried entry keeps its first deadline, and is watched already)."""
        if self.deadlines is None:
            return
        assert self.timeout is not None
        together = [entry for entry in entries if entry.timer is None and entry.started == started]
        if together:
            bucket = self.deadlines.arm_many(together, started + self.timeout)
            for entry in together:
                entry.timer = bucket
        if len(together) < len(entries):
            for entry in entries:
                self.arm(entry)  # the others (arm skips the watched ones)

    def disarm_many(self, entries: list[Entry]) -> None:
        """:meth:`disarm` for many entries, one set update per bucket."""
        if self.deadlines is None:
            return
        buckets: dict[int, list[Entry]] = {}
        for entry in entries:
            if entry.timer is not None:
                group = buckets.get(entry.timer)
                if group is None:
                    group = buckets[entry.timer] = []
                group.append(entry)
                entry.timer = None
        for bucket, group in buckets.items():
            self.deadlines.disarm_many(group, bucket)

    def disarm(self, entry: Entry) -> None:
        if entry.timer is not None:
            assert self.deadlines is not None
            self.deadlines.disarm(entry, entry.timer)
            entry.timer = None

    def _fire(self, entry: Entry) -> None:
        entry.timer = None
        if entry.state == State.DONE or self.run.closing:
            return
        self.expired(entry)

    def schedule_retry(self, entry: Entry, delay: float) -> None:
        self.run.counters.retries += 1
        entry.state = State.WAITING_RETRY
        entry.handle = self.run.loop.call_later(delay, self._retry, entry)
        self.arm(entry)

    def _retry(self, entry: Entry) -> None:
        entry.handle = None
        self.retry_now(entry)

    def hold(self) -> None:
        """No retry starts any more; records not running stop their clocks (they leave as
        leftover, their time restarts in the next run)."""
        for entry in self.run.ctl.live_entries():
            if entry.state == State.WAITING_RETRY and isinstance(entry.handle, asyncio.TimerHandle):
                entry.handle.cancel()
                entry.handle = None
                entry.state = State.READY
            if entry.state != State.RUNNING:
                self.disarm(entry)

    def close(self) -> None:
        if self.deadlines is not None:
            self.deadlines.close()
        for entry in self.run.ctl.live_entries():
            entry.timer = None
            if isinstance(entry.handle, asyncio.TimerHandle):
                entry.handle.cancel()

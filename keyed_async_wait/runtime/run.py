"""The state one ``process()`` call shares between the runtime's parts, and its output side.

:class:`Run` holds the controller, the counters, the waiters and the flags (holding, closing,
the failure); the parts (intake, dispatch, batches, timers, outcomes) read and change it and
nothing else. Its methods are the output side: what the consumer takes, and the wake-ups
between the intake, the work and the consumer.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import Any

from ..core.controller import Controller
from ..core.elements import Watermark
from ..core.entry import Entry, State
from ..core.parking import FRESH, ParkedItem, ParkInfo
from ..core.settings import OperatorSettings
from ..core.snapshot import SnapshotRecord
from .function import FunctionAdapter

__all__ = ["Counters", "Run", "resolve"]


@dataclass(slots=True)
class Counters:
    """What happened in one run (cumulative)."""

    records_in: int = 0
    records_out: int = 0
    attempts: int = 0
    retries: int = 0
    timeouts: int = 0
    failures: int = 0
    batches: int = 0
    deferred: int = 0


def resolve(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


class Run:
    """One ``process()`` call's shared state (see the module doc)."""

    def __init__(
        self,
        settings: OperatorSettings,
        fn: FunctionAdapter,
        replay: list[SnapshotRecord | Watermark],
        parked_replay: list[ParkedItem],
        latency: Any,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.settings = settings
        self.fn = fn
        self.key_of = settings.key_selector()
        # emit_parked: parked records leave as outputs the moment they are parked (bounded memory)
        self.spill: list[ParkedItem] | None = [] if settings.emit_parked else None
        self.ctl = Controller(settings.mode, self.key_of, self.spill)
        self.capacity = settings.capacity
        self.blocked_capacity = settings.blocked_capacity
        self.counters = Counters()
        self.latency = latency
        self.replay = replay
        self.parked_replay = parked_replay
        self.unreplayed: list[ParkedItem] = []  # held before the replay was reached
        self.unadmitted: list[Any] = []  # input read after a hold (without emit_parked)
        self.holding = False  # hold(): start nothing new
        self.closing = False
        self.source_done = False
        self.failure: BaseException | None = None
        # True while every entry that leaves is a finished record with a result list: no
        # watermark or failed record has come in (the batch consumer's fast path)
        self.plain_output = True
        self.ready: deque[Entry] = deque()  # entries that may start, in order
        self.draining = False  # a drain is under way: new ready entries join its queue
        self.running: dict[asyncio.Future[Any], Entry] = {}
        self.batches: dict[asyncio.Future[Any], Any] = {}  # task -> the Batch it runs
        self.presets = 0  # restored entries whose results are known, not yet handed on
        self.output_waiter: asyncio.Future[None] | None = None
        self.capacity_waiter: asyncio.Future[None] | None = None
        self.spill_waiter: asyncio.Future[None] | None = None

    # ------------------------------------------------------------------ wake-ups

    def notify(self) -> None:
        """Something may leave: wake the consumer."""
        resolve(self.output_waiter)

    def room_left(self) -> int:
        """Records the intake may still admit. Invariant: records past BLOCKED (ready, running,
        retrying, finished but not taken) never exceed ``capacity``; up to ``blocked_capacity``
        more may wait behind their keys (KEY_ORDERED), so a window of few keys with many updates
        each does not starve the other keys of concurrency."""
        ctl = self.ctl
        inside = ctl.records_inside
        if self.blocked_capacity:
            inside -= min(ctl.blocked_records, self.blocked_capacity)
        return self.capacity - inside

    def room(self) -> None:
        """A place was freed: wake the intake if it waits for one."""
        waiter = self.capacity_waiter
        if waiter is not None and self.room_left() > 0:
            self.capacity_waiter = None
            resolve(waiter)

    def set_failure(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = exc
        resolve(self.capacity_waiter)
        resolve(self.spill_waiter)
        self.notify()

    async def wait_output(self, bound: float | None = None) -> None:
        """Until something may leave (or ``bound`` seconds pass)."""
        waiter = self.loop.create_future()
        self.output_waiter = waiter
        timer = self.loop.call_later(bound, resolve, waiter) if bound is not None else None
        try:
            await waiter
        finally:
            self.output_waiter = None
            if timer is not None:
                timer.cancel()

    # ------------------------------------------------------------------ output side

    def handed_out(self, entry: Entry) -> None:
        """The consumer has taken ``entry``'s last result: free its place."""
        self.ctl.hand_out(entry)
        if not entry.watermark:
            self.counters.records_out += 1
        self.room()

    def hand_out_all(self) -> list[Entry]:
        """Take every entry that may leave now (for batch consumers)."""
        out = self.ctl.out
        entries = list(out)
        out.clear()
        self.counters.records_out += self.ctl.hand_out_many(entries, records_only=self.plain_output)
        self.room()
        return entries

    def take_spill(self) -> list[ParkedItem]:
        """The parked records to write out now (emit_parked)."""
        spill = self.spill
        if not spill:
            return []
        items = spill[:]
        spill.clear()
        waiter, self.spill_waiter = self.spill_waiter, None
        resolve(waiter)
        return items

    @property
    def finished(self) -> bool:
        if not self.source_done:
            return False
        if self.ctl.idle:
            return True
        # held: done once nothing runs any more and everything that may leave has left
        return self.holding and not self.running and not self.batches and not self.ctl.out and not self.spill

    def leftover(self) -> list[ParkedItem]:
        """Every record that did not finish, in an order that keeps each key's arrival order:
        records still inside (held), parked keys' queues, replay not reached, input not admitted."""
        items: list[ParkedItem] = []
        for entry in self.ctl.live_entries():
            if entry.watermark or entry.state == State.DONE:
                continue
            info = entry.meta or FRESH
            if entry.attempts:
                info = ParkInfo(
                    info.attempts + entry.attempts, info.deferrals, None, info.deferred_since, info.error
                )
            items.append(ParkedItem(entry.record, entry.key, info))
        items.extend(self.ctl.parked.items())
        items.extend(self.unreplayed)
        if self.unadmitted:
            key_of = self.key_of
            assert key_of is not None
            items.extend(ParkedItem(r, key_of(r)) for r in self.unadmitted if type(r) is not Watermark)
        return items

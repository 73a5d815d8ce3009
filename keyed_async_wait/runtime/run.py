"""What one ``process()`` call is, and its output side.

:class:`Run` holds the run itself: its spec and function, the controller that decides, its
counters, whether it holds, closes or failed, and the wake-ups between the intake, the work and
the consumer. The parts of the runtime keep their own state (the dispatcher its ready queue and
running attempts, the batcher its buffer and batches, the intake what it replays and what it
could not admit); they share only this.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core.controller import Controller
from ..core.entry import Entry
from ..core.parking import ParkedItem
from ..core.spec import WaitSpec
from .backend import FunctionAdapter
from .overflow import MemoryOverflow, Overflow

__all__ = ["PROMPT_GROUP", "Counters", "Run", "resolve"]

# a batch consumer's finished records are taken this many at a time at most (an eighth of the
# capacity when smaller). The whole round at once leaves each place idle while the round's other
# records are handed out and admitted; small groups cost CPU: a group's admission has a fixed
# cost, and places refilled apart end apart, so the loop turns (and wakes the consumer) more
# often. Measured at 200 in flight and 20 ms: groups of 8 keep 0.97 of the places busy at +12%
# Python calls per record, groups of 25 0.95-0.96 at +5%, the whole round 0.91-0.93 (slot_use)
PROMPT_GROUP = 25


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
    """One ``process()`` call (see the module doc)."""

    def __init__(
        self, spec: WaitSpec, fn: FunctionAdapter, latency: Any, overflow: Overflow | None = None
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.spec = spec
        self.fn = fn
        self.key_of = spec.selector
        # emit_parked: parked records leave as outputs the moment they are parked (bounded memory)
        self.spill: list[ParkedItem] | None = [] if spec.emit_parked else None
        coalesce = fn.superseded is not None
        self.ctl = Controller(spec.mode, self.key_of, self.spill, spec.blocked_capacity, coalesce)
        # a hot key's records past the waiting bound, until its queue runs dry
        self.overflow: Overflow = overflow if overflow is not None else MemoryOverflow()
        self.capacity = spec.capacity
        self.blocked_capacity = spec.blocked_capacity
        self.counters = Counters()
        self.latency = latency
        self.holding = False  # hold(): start nothing new
        self.closing = False
        self.source_done = False
        self.failure: BaseException | None = None
        self.output_waiter: asyncio.Future[None] | None = None
        self.capacity_waiter: asyncio.Future[None] | None = None
        self.spill_waiter: asyncio.Future[None] | None = None
        self.aside_waiter: asyncio.Future[None] | None = None  # the intake waits for set-aside records
        # a batch consumer (process_batches): finished records are taken as they finish, this
        # many at a time (0: the consumer takes them), into ``taken``, its next chunk
        self.prompt = 0
        self.taken: list[Entry] = []
        self.refill: Callable[[], None] | None = None  # the intake's: admit what it read, now

    # ------------------------------------------------------------------ wake-ups

    def notify(self) -> None:
        """Something may leave: wake the consumer."""
        resolve(self.output_waiter)

    def room_left(self) -> int:
        """Records the intake may still admit (new input, or records set aside coming back).

        Invariants: records running or between attempts never exceed ``capacity``; records
        inside never exceed ``capacity + blocked_capacity``. With a ``blocked_capacity``
        (KEY_ORDERED) up to that many records waiting behind their keys take none of the
        capacity, so a hot key never holds the other keys back (the controller sets aside a hot
        key's records past it); with 0 they count against it."""
        ctl = self.ctl
        inside = ctl.records_inside
        if self.blocked_capacity:
            inside -= min(ctl.blocked_records, self.blocked_capacity)
        return self.capacity - inside

    def room(self) -> None:
        """A place was freed: wake the intake if it waits for one (for new input, or to bring
        back records set aside)."""
        waiter = self.capacity_waiter
        if waiter is not None and self.room_left() > 0:
            self.capacity_waiter = None
            resolve(waiter)
        if self.aside_waiter is not None and self.ctl.aside.due:
            resolve(self.aside_waiter)

    def set_failure(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = exc
        resolve(self.capacity_waiter)
        resolve(self.spill_waiter)
        resolve(self.aside_waiter)
        self.notify()

    async def wait_set_aside(self) -> None:
        """Until a key's records set aside may come back: its queue ran dry or a place was freed
        (or the run holds or failed)."""
        waiter = self.aside_waiter = self.loop.create_future()
        try:
            await waiter
        finally:
            self.aside_waiter = None

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

    def for_batches(self) -> None:
        """The consumer takes chunks (``process_batches``): take its finished records as they
        finish (see :meth:`take_finished`)."""
        self.prompt = max(1, min(PROMPT_GROUP, self.capacity // 8))

    def take_finished(self) -> None:
        """For a batch consumer: the entries that may leave, handed out now into
        :attr:`taken` (the consumer's next chunk) and their places refilled at once, in this
        step, from what the intake read (``refill``). Without it a place freed waits for the
        consumer's turn and then the intake's, behind every other record of its round.

        Invariant: at most ``capacity`` entries wait in :attr:`taken`; past that the consumer
        takes them, as before. A snapshot holds them (they are finished, not yet consumed)."""
        out = self.ctl.out
        if len(self.taken) + len(out) > self.capacity:
            return
        self.taken += self._hand_out(out)
        if self.refill is not None:
            self.refill()
        self.room()

    def hand_out_all(self) -> list[Entry]:
        """Take every entry that may leave now (for batch consumers), their places refilled at
        once from what the intake read."""
        taken, self.taken = self.taken, []
        entries = self._hand_out(self.ctl.out)
        if self.refill is not None and self.prompt:
            self.refill()
        self.room()
        return taken + entries if taken else entries

    def _hand_out(self, out: Any) -> list[Entry]:
        entries = list(out)
        out.clear()
        ctl = self.ctl
        self.counters.records_out += ctl.hand_out_many(entries, records_only=ctl.plain_output)
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

"""The asyncio layer of the operator: it awaits, sleeps and cancels; the core decides.

One :class:`Runtime` exists per ``process()`` call, built from the operator's frozen
:class:`~keyed_async_wait.core.spec.WaitSpec` (it never reads the operator). Its parts are made
in the order they depend on one another, each given what it uses:

- :class:`~.run.Run`: what the run is (spec, function, controller, counters, flags, wake-ups);
- :class:`~.dispatch.Dispatcher` (given the run): ready records start; attempts settle in the
  tasks that run them (one at a time, reused). It makes and owns the :class:`~.timers.Timers`
  (timeouts in a timer wheel; retry timers that come back to it), the
  :class:`~.outcomes.Outcomes` (the pure outcome unit's decisions, carried out) and the
  :class:`~.batches.Batcher` (the active buffer, batch calls);
- :class:`~.intake.Intake` (given the run and the dispatcher): records in, from the replay and
  the source, within the capacity.

So "who restarts a record after a retry" has one answer: the dispatcher, whose timers call
its ``dispatch`` when the delay has passed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Iterable
from operator import attrgetter
from typing import Any

from ..core.elements import Watermark
from ..core.entry import Entry, State
from ..core.parking import FRESH, ParkedItem, ParkInfo
from ..core.snapshot import SnapshotRecord
from ..core.spec import WaitSpec
from .backend import FunctionAdapter
from .dispatch import Dispatcher
from .intake import Intake
from .overflow import Overflow
from .run import Run, resolve

__all__ = ["Runtime"]


class Runtime:
    """Runs one ``process()`` (see the module doc)."""

    def __init__(
        self,
        spec: WaitSpec,
        fn: FunctionAdapter,
        replay: list[SnapshotRecord | Watermark],
        parked_replay: list[ParkedItem],
        latency: Any = None,
        overflow: Overflow | None = None,
    ) -> None:
        run = self.run = Run(spec, fn, latency, overflow)
        self.dispatcher = Dispatcher(run)
        self.intake = Intake(run, self.dispatcher, replay, parked_replay)
        self.loop = run.loop
        self.ctl = run.ctl
        # the consumer's side, bound straight to the run's (one call per record, not two)
        self.handed_out = run.handed_out
        self.hand_out_all = run.hand_out_all
        self.wait_output = run.wait_output
        self.take_spill = run.take_spill
        if fn.bind_release is not None:
            fn.bind_release(self.release_key)

    def release_key(self, record: Any) -> bool:
        """Let the next record of ``record``'s key start now, while ``record`` still runs
        (KEY_ORDERED; elsewhere there is no key order to release). False when ``record`` is
        not running here."""
        dispatcher = self.dispatcher
        entry = next((e for e in dispatcher.running.values() if e.record is record), None)
        if entry is None:
            return False
        nxt = self.ctl.release_early(entry)
        if nxt is not None:
            dispatcher.dispatch(nxt)
        return True

    # ------------------------------------------------------------------ what the operator uses

    @property
    def failure(self) -> BaseException | None:
        return self.run.failure

    @property
    def finished(self) -> bool:
        run = self.run
        if not run.source_done:
            return False
        if self.ctl.idle:
            return True
        # held: done once nothing runs any more and everything that may leave has left
        return run.holding and not self.dispatcher.busy and not self.ctl.out and not run.spill

    @property
    def holding(self) -> bool:
        return self.run.holding

    @property
    def plain_output(self) -> bool:
        return self.ctl.plain_output

    @property
    def spill(self) -> list[ParkedItem] | None:
        return self.run.spill

    @property
    def counters(self) -> Any:
        return self.run.counters

    @property
    def buffered(self) -> int:
        return len(self.dispatcher.batcher.buffer)

    def feed(self, source: Iterable[Any] | AsyncIterable[Any], batches: bool) -> asyncio.Task[None]:
        """Start the intake from ``source`` in a task of its own (``batches``: for a consumer of
        chunks, which has its finished records taken as they finish)."""
        if batches:
            self.run.for_batches()
        return self.loop.create_task(self.intake.feed(source, batches))

    def unconsumed(self) -> list[Entry]:
        """Every entry not yet handed to the consumer, in arrival order: those inside and those
        taken for its next chunk (finished, with their results)."""
        live = self.ctl.live_entries()
        taken = self.run.taken
        if not taken:
            return live
        return sorted(taken + live, key=attrgetter("seq"))

    def pending_entries(self, first_seq: int) -> list[Entry]:
        """What the intake read and has not admitted yet, as entries numbered from
        ``first_seq`` (for a snapshot: they come after every record inside and set aside)."""
        key_of = self.run.key_of
        entries = []
        for i, element in enumerate(self.intake.pending.items()):
            if type(element) is Watermark:
                entries.append(Entry.for_watermark(first_seq + i, element))
            else:
                entries.append(Entry(first_seq + i, element, key_of(element) if key_of else None))
        return entries

    def leftover(self) -> list[ParkedItem]:
        """Every record that did not finish, in an order that keeps each key's arrival order:
        records still inside (held), parked keys' queues, records set aside, then what the
        intake never admitted."""
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
        items.extend(self.run.overflow.items())
        items.extend(self.intake.unread())
        return items

    # ------------------------------------------------------------------ holding and shutdown

    def hold(self) -> None:
        """Start nothing new from now on: running attempts finish (their timeouts still apply),
        retries are not scheduled, and every other record, and all further input, is kept for
        the leftover. The run ends when the source has ended and nothing runs."""
        run = self.run
        if run.holding:
            return
        run.holding = True
        self.dispatcher.hold()
        resolve(run.capacity_waiter)
        resolve(run.aside_waiter)
        run.notify()

    async def close(self, intake: asyncio.Task[None], wait_running: bool) -> None:
        """Stop intake; await or cancel what still runs; leave no task or timer behind."""
        run = self.run
        if not intake.done():
            intake.cancel()
        tasks: list[asyncio.Future[Any]] = [intake, *self.dispatcher.stop_parking()]
        running = self.dispatcher.tasks()
        if wait_running and running:
            await asyncio.wait(running, timeout=run.spec.timeout)
        run.closing = True
        self.dispatcher.close()
        for task in running:
            task.cancel()
        tasks.extend(running)
        await asyncio.gather(*tasks, return_exceptions=True)

"""Intake: records enter from the replay and the source, no more than the capacity allows.

Order: records parked by an earlier run (those given to ``replay_parked``), then records
restored from a snapshot, then the source. A source chunk that is a
:class:`~keyed_async_wait.core.parking.ParkedBatch` replays parked records too. Intake pauses
while the operator is full and reads no record it cannot admit, except for a batch consumer
(:attr:`~.run.Run.prompt`): then it reads up to ``capacity`` records more, which
:meth:`Intake.admit_now` admits the moment finished records free their places, in the same
step. What it read and has not admitted (those, or a watermark waiting for the records set
aside before it, and what follows) is :attr:`Intake.pending`, which a snapshot holds, so a
snapshot never misses one.
After a hold, input is no longer admitted: it is kept for the leftover (:attr:`Intake.unread`),
or, with ``emit_parked``, handed out as parked records as fast as it is read.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, Iterable
from itertools import islice
from typing import Any

from ..core.elements import Watermark
from ..core.parking import ParkedBatch, ParkedItem
from ..core.snapshot import SnapshotRecord
from .dispatch import Dispatcher
from .eager import Resumed, start
from .run import Run

__all__ = ["REFILL", "SPILL_CHUNK", "Intake", "Pending"]

SPILL_CHUNK = 1000  # parked records handed out at a time after a hold
REFILL = 1_000  # records set aside that come back at a time, for a key whose queue ran dry
# records read in a row before the intake lets the loop run: records blocked behind busy keys
# take no capacity, so a source that is always ready (a list, an Arrow batch, a generator that
# never waits) could otherwise be read to its end while no call, timer or consumer runs
READ_TURN = 1_024


class Pending:
    """What the intake read and has not admitted: :attr:`rows` from :attr:`at` on (a position,
    not a copy of the rest: a batch consumer's freed places take records a few at a time)."""

    __slots__ = ("at", "rows")

    def __init__(self) -> None:
        self.rows: list[Any] = []
        self.at = 0

    def __len__(self) -> int:
        return len(self.rows) - self.at

    def items(self) -> list[Any]:
        return self.rows[self.at :] if self.at else self.rows

    def replace(self, rows: list[Any]) -> None:
        self.rows, self.at = rows, 0

    def take(self, count: int) -> list[Any]:
        """The next ``count`` records (fewer if fewer are left), no longer pending."""
        at, rows = self.at, self.rows
        taken = rows[at : at + count]
        at += count
        if at >= len(rows):
            self.rows, self.at = [], 0
        else:
            self.at = at
        return taken


class Intake:
    """Feeds the controller (see the module doc)."""

    __slots__ = (
        "admitting",
        "dispatcher",
        "parked_replay",
        "pending",
        "read_in_turn",
        "replay",
        "run",
        "unadmitted",
        "unreplayed",
    )

    def __init__(
        self,
        run: Run,
        dispatcher: Dispatcher,
        replay: list[SnapshotRecord | Watermark],
        parked_replay: list[ParkedItem],
    ) -> None:
        self.run = run
        self.dispatcher = dispatcher
        self.replay = replay  # restored from a snapshot
        self.parked_replay = parked_replay  # parked by an earlier run
        self.unreplayed: list[ParkedItem] = []  # held before the replay was reached
        self.unadmitted: list[Any] = []  # input read after a hold (without emit_parked)
        # read from the source, not admitted yet: a watermark (and what follows it) waiting for
        # the records set aside before it, or records waiting for room (a snapshot holds them)
        self.pending = Pending()
        self.admitting = False  # the intake is admitting records: admit_now waits its turn
        self.read_in_turn = 0  # records read since the loop last ran
        run.refill = self.admit_now  # a batch consumer's finished records free places at once

    async def feed(self, source: Iterable[Any] | AsyncIterable[Any], batches: bool) -> None:
        run = self.run
        try:
            await self._parked()
            await self._restored()
            if hasattr(source, "__aiter__"):
                await self._from_async(source, batches)  # type: ignore[arg-type]
            elif batches:
                for batch in source:
                    await self._chunk(batch)
            else:
                await self._chunk(source)
            await self._set_aside_back()  # the records a hot key set aside, all of them
            run.source_done = True
            self.dispatcher.batcher.flush_now()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, not swallowed
            run.set_failure(exc)
        finally:
            run.notify()

    def unread(self) -> list[ParkedItem]:
        """What the intake took in but never admitted: the replay not reached, input read after
        a hold; each key's records in arrival order."""
        items = list(self.unreplayed)
        read = self.pending.items() + self.unadmitted
        if read:
            key_of = self.run.key_of
            assert key_of is not None
            items.extend(ParkedItem(r, key_of(r)) for r in read if type(r) is not Watermark)
        return items

    async def _parked(self, replay: list[ParkedItem] | None = None) -> None:
        """Replay parked records (``replay``, else those given to ``replay_parked``) in their
        order; those not due (or behind one that is not) stay parked."""
        run = self.run
        ctl = run.ctl
        if replay is None:
            replay, self.parked_replay = self.parked_replay, []
        defer = run.spec.defer
        now = defer.clock() if defer is not None else time.time()
        for i, item in enumerate(replay):
            if run.room_left() <= 0:
                await self._wait_capacity()
            if run.holding or run.failure is not None:
                if run.spill is not None:
                    await self._spill_out(replay[i:])
                else:
                    self.unreplayed.extend(replay[i:])
                return
            entry = ctl.admit_parked(item, now)
            if entry is not None:
                run.counters.records_in += 1
                self.dispatcher.dispatch(entry)

    async def _restored(self) -> None:
        run = self.run
        ctl, key_of = run.ctl, run.key_of
        for element in self.replay:
            if run.room_left() <= 0:
                await self._wait_capacity()
            if type(element) is Watermark:
                ctl.admit_watermark(element)
                run.notify()
                continue
            assert isinstance(element, SnapshotRecord)
            key = key_of(element.record) if key_of is not None else element.key
            results = list(element.results) if element.results is not None else None
            entry = ctl.admit_restored(element.record, key, results)
            run.counters.records_in += 1
            self.dispatcher.restored(entry, results is not None)
        self.replay = []

    async def _chunk(self, source: Iterable[Any]) -> None:
        if type(source) is ParkedBatch:
            await self._parked(source)
            return
        run = self.run
        ctl = run.ctl
        iterator = iter(source)
        while True:
            if run.holding:
                await self._held(iterator)
                return
            if ctl.aside.due:
                self._bring_back()
            limit = run.overflow.limit
            if limit is not None and ctl.aside and ctl.aside.total >= limit:
                await run.wait_set_aside()  # the store is full: read on once some came back
                if run.failure is not None:
                    return
                continue
            room = run.room_left()
            if room <= 0:
                await self._wait_capacity()
                if run.failure is not None:
                    return
                continue
            # pull no more than fits (a batch consumer's intake: a capacity more, for the places
            # its records free) and hold it as pending, so a snapshot never misses a record read
            chunk = list(islice(iterator, room + run.capacity if run.prompt else room))
            if not chunk:
                return
            self.read_in_turn += len(chunk)
            self.pending.replace(chunk)
            await self._admit_pending()
            if run.failure is not None:
                return
            if self.read_in_turn >= READ_TURN:  # all read is inside: a snapshot misses none
                self.read_in_turn = 0
                await asyncio.sleep(0)  # one turn of the loop: calls, timers and the consumer run

    async def _admit_pending(self) -> None:
        """Admit what was read (:attr:`pending`) in order, no more at a time than there is room
        for. A watermark that meets records set aside waits, with what follows it, until they
        are back, which takes room: what it held back is admitted within the room left then
        (invariant: records inside never exceed ``capacity + blocked_capacity``). After a
        hold, what is pending is kept for the leftover, after the records set aside."""
        run = self.run
        while self.pending:
            if run.holding:
                pending = self.pending.items()
                self.pending.replace([])
                await self._held(iter(pending))
                return
            if run.failure is not None:
                return
            room = run.room_left()
            if room <= 0:
                await self._wait_capacity()
                continue
            if self._admit(room):  # a watermark waits until every record set aside before it is back
                await self._set_aside_back()

    def _admit(self, room: int) -> bool:
        """Admit the next ``room`` pending records and start those that may start; whether a
        watermark among them was held back (it is pending again, with what followed it)."""
        run = self.run
        ctl = run.ctl
        self.admitting = True
        try:
            before = ctl.records_inside
            ready = ctl.admit_many(self.pending.take(room))
            run.counters.records_in += ctl.records_inside - before
            if ctl.set_aside:
                run.overflow.put(ctl.take_set_aside())
            if ready:
                self.dispatcher.dispatch_many(ready)
        finally:
            self.admitting = False
        run.notify()  # watermarks may be ready to leave
        held, ctl.held_back = ctl.held_back, []
        if held:
            self.pending.replace(held + self.pending.items())
        return bool(held)

    def admit_now(self) -> None:
        """Places were freed (a batch consumer's records finished): admit pending records into
        them at once, in this step. Not while the intake admits, nor while records are set
        aside (the intake brings them back first, and a watermark waits for them), nor after
        a hold or a failure: the intake, woken as before (:meth:`~.run.Run.room`), does it."""
        run = self.run
        if self.admitting or not self.pending or run.holding or run.failure is not None or run.ctl.aside:
            return
        room = run.room_left()
        if room <= 0:
            return
        self._admit(room)
        batcher = self.dispatcher.batcher
        if batcher.enabled and run.room_left() <= 0:  # as when the intake waits for room
            run.loop.call_soon(batcher.flush_now)

    def _bring_back(self) -> None:
        """Records set aside come back while there is room: for each key whose queue ran dry
        (first key first), its first records, the first of which runs now."""
        run = self.run
        ctl = run.ctl
        while ctl.aside.due and run.room_left() > 0 and not run.holding:
            key = ctl.aside.due.popleft()
            count = ctl.aside.refill_size(ctl.blocked_records, REFILL, run.room_left())
            self.dispatcher.dispatch(ctl.refill(key, run.overflow.take(key, count)))

    async def _set_aside_back(self) -> None:
        """Until every record set aside is back (or the run holds or failed)."""
        run = self.run
        while run.ctl.aside and not run.holding and run.failure is None:
            self._bring_back()
            if run.ctl.aside:
                await run.wait_set_aside()

    async def _held(self, iterator: Any) -> None:
        run = self.run
        if run.spill is None:
            self.unadmitted.extend(iterator)
            return
        key_of = run.key_of
        assert key_of is not None
        while chunk := list(islice(iterator, SPILL_CHUNK)):
            await self._spill_out([ParkedItem(r, key_of(r)) for r in chunk if type(r) is not Watermark])

    async def _from_async(self, source: AsyncIterable[Any], batches: bool) -> None:
        run = self.run
        iterator = source.__aiter__()
        while True:
            if run.room_left() <= 0:
                await self._wait_capacity()
                if run.failure is not None:
                    return
            try:
                it, first = start(iterator.__anext__())
            except StopIteration as ready:  # the source had an element at hand
                element = ready.value
            except StopAsyncIteration:
                return
            else:  # the source must wait: send what the buffer holds before waiting with it
                self.dispatcher.batcher.flush_now()
                try:
                    element = await Resumed(it, first)
                except StopAsyncIteration:
                    return
            await self._chunk(element if batches else (element,))

    async def _spill_out(self, items: list[ParkedItem]) -> None:
        """Hand parked records to the consumer, waiting while it has not taken the last ones:
        input read after a hold leaves as fast as it is read, never piling up."""
        run = self.run
        assert run.spill is not None
        run.spill.extend(items)
        run.notify()
        if len(run.spill) >= SPILL_CHUNK and run.failure is None:
            waiter = run.loop.create_future()
            run.spill_waiter = waiter
            await waiter

    async def _wait_capacity(self) -> None:
        run = self.run
        if run.holding:
            return
        self.dispatcher.batcher.flush_now()
        waiter = run.loop.create_future()
        run.capacity_waiter = waiter
        await waiter

"""The asyncio layer of the operator: it awaits, sleeps and cancels; the controller decides.

One :class:`Runtime` exists per ``process()`` call. Each attempt runs in a task of its own and
settles inside that task's step (:class:`keyed_async_wait.eager.Settling`): no done callback,
and a record that became ready meanwhile (the next of its key) runs on in the same task. An
eager function is first run up to its first suspension and gets no task if it finishes there.
Retries are ``call_later`` timers; timeouts go into a timer wheel
(:mod:`keyed_async_wait.deadlines`). Work that becomes possible inside a callback is queued and
run by one loop (:meth:`Runtime._drain`), never by recursion, so a long run of synchronously
finishing records of one key cannot overflow the stack.
"""

from __future__ import annotations

import asyncio
import time
import types
from collections import deque
from collections.abc import AsyncIterable, Iterable
from functools import partial
from itertools import islice
from typing import TYPE_CHECKING, Any

from ..core.buffer import ActiveBuffer
from ..core.controller import Controller
from ..core.deadlines import Deadlines
from ..core.elements import FailedRecord, Watermark
from ..core.entry import Entry, State
from ..core.exceptions import RecordFailedError, RecordTimeoutError, ResultTypeError
from ..core.parking import FRESH, ParkedBatch, ParkedItem, ParkInfo
from ..core.snapshot import SnapshotRecord
from .eager import _NOT_YET, Resumed, Settling, start
from .function import FunctionAdapter

if TYPE_CHECKING:
    from .operator import KeyedAsyncWaitOperator

__all__ = ["Runtime"]

_CoroutineType = types.CoroutineType
_SPILL_CHUNK = 1000  # parked records handed out at a time after a hold


class _Batch:
    """One call of ``invoke_batch``: the entries it carries and the task running it."""

    __slots__ = ("entries", "live", "task")

    def __init__(self, entries: list[Entry]) -> None:
        self.entries = entries
        self.live = len(entries)
        self.task: asyncio.Future[Any] | None = None


class Runtime:
    """Runs one ``process()``: intake, invocation, retries, timeouts, batching, shutdown."""

    def __init__(self, op: KeyedAsyncWaitOperator, replay: list[SnapshotRecord | Watermark]) -> None:
        self.loop = asyncio.get_running_loop()
        self.op = op
        self.fn: FunctionAdapter = op.function
        # emit_parked: parked records leave as outputs the moment they are parked (bounded memory)
        self.spill: list[ParkedItem] | None = [] if op.settings.emit_parked else None
        self._spill_waiter: asyncio.Future[None] | None = None
        self.ctl = Controller(op.mode, op.key_selector, self.spill)
        self.capacity = op.capacity
        self.timeout = op.timeout
        self.retry = op.retry
        self.deadlines = (
            Deadlines(min(0.05, self.timeout / 100), self.loop.call_at, self._on_timeout)
            if self.timeout is not None
            else None
        )
        self.result_retry = op.retry is not None and op.retry.checks_results
        self.emit_errors = op.on_error != "fail"
        self.defer = op.defer_policy
        # hold(): start nothing new; what arrives from then on is kept for the leftover
        self.holding = False
        self.parked_replay: list[ParkedItem] = op._parked_replay
        self.unreplayed: list[ParkedItem] = []
        self.unadmitted: list[Any] = []
        self.batching = op.batch_size is not None and self.fn.call_batch is not None
        self.buffer = ActiveBuffer(op.batch_size or 1)
        self.buffer_timeout = op.buffer_timeout
        self.replay = replay
        self.latency = op.latency
        self.failure: BaseException | None = None
        self.source_done = False
        self.closing = False
        self._ready: deque[Entry] = deque()
        self._presets = 0  # restored entries whose results are known, not yet handed on
        # True while every entry that leaves is a finished record with a result list: no
        # watermark or failed record has come in (the batch consumer's fast path)
        self.plain_output = True
        self._draining = False
        self._running: dict[asyncio.Future[Any], Entry] = {}
        self._batches: dict[asyncio.Future[Any], _Batch] = {}
        self._flush_handle: asyncio.Handle | None = None
        # the task settling a record right now, and what it was handed to run next
        self._adopter: asyncio.Future[Any] | None = None
        self._adopted: list[Any] = []
        self._output_waiter: asyncio.Future[None] | None = None
        self._capacity_waiter: asyncio.Future[None] | None = None
        self.counters = {
            "records_in": 0,
            "records_out": 0,
            "attempts": 0,
            "retries": 0,
            "timeouts": 0,
            "failures": 0,
            "batches": 0,
            "deferred": 0,
        }

    # ------------------------------------------------------------------ intake

    async def intake(self, source: Iterable[Any] | AsyncIterable[Any], batches: bool) -> None:
        """Feed the controller from the replay and the source, pausing while it is full."""
        try:
            await self._intake_parked()
            await self._intake_replay()
            if hasattr(source, "__aiter__"):
                await self._intake_async(source, batches)  # type: ignore[arg-type]
            elif batches:
                for batch in source:
                    await self._intake_sync(batch)
            else:
                await self._intake_sync(source)
            self.source_done = True
            self._flush_now()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, not swallowed
            self._set_failure(exc)
        finally:
            self._notify()

    async def _intake_parked(self, replay: list[ParkedItem] | None = None) -> None:
        """Replay parked records (``replay``, else those given to ``replay_parked``) in their
        order; those not due (or behind one that is not) stay parked."""
        ctl = self.ctl
        if replay is None:
            replay, self.parked_replay = self.parked_replay, []
        now = self.defer.clock() if self.defer is not None else time.time()
        for i, item in enumerate(replay):
            if ctl.records_inside >= self.capacity:
                await self._wait_capacity()
            if self.holding or self.failure is not None:
                if self.spill is not None:
                    await self._spill_out(replay[i:])
                else:
                    self.unreplayed.extend(replay[i:])
                return
            entry = ctl.admit_parked(item, now)
            if entry is not None:
                self.counters["records_in"] += 1
                self._dispatch(entry)
            else:
                self.plain_output = False

    async def _intake_replay(self) -> None:
        ctl, key_of = self.ctl, self.op.key_selector
        for element in self.replay:
            if ctl.records_inside >= self.capacity:
                await self._wait_capacity()
            if type(element) is Watermark:
                self.plain_output = False
                ctl.admit_watermark(element)
                self._notify()
                continue
            assert isinstance(element, SnapshotRecord)
            key = key_of(element.record) if key_of is not None else element.key
            results = list(element.results) if element.results is not None else None
            entry = ctl.admit_restored(element.record, key, results)
            if results is not None:
                self._presets += 1
            self.counters["records_in"] += 1
            if entry is not None:
                self._dispatch(entry)
        self.replay = []

    async def _intake_sync(self, source: Iterable[Any]) -> None:
        if type(source) is ParkedBatch:
            await self._intake_parked(source)
            return
        ctl, capacity, counters = self.ctl, self.capacity, self.counters
        iterator = iter(source)
        while True:
            if self.holding:
                if self.spill is None:
                    self.unadmitted.extend(iterator)
                    return
                key_of = self.op.key_selector
                assert key_of is not None
                while chunk := list(islice(iterator, _SPILL_CHUNK)):
                    await self._spill_out(
                        [ParkedItem(r, key_of(r)) for r in chunk if type(r) is not Watermark]
                    )
                return
            room = capacity - ctl.records_inside
            if room <= 0:
                await self._wait_capacity()
                if self.failure is not None:
                    return
                continue
            # pull no more than fits: a record taken from the source is always inside, so a
            # snapshot never misses one
            chunk = list(islice(iterator, room))
            if not chunk:
                return
            before = ctl.records_inside
            ready = ctl.admit_many(chunk)
            admitted = ctl.records_inside - before
            counters["records_in"] += admitted
            if admitted != len(chunk):
                self.plain_output = False
                self._notify()  # watermarks may be ready to leave
            if ready:
                self._dispatch_many(ready)

    async def _intake_async(self, source: AsyncIterable[Any], batches: bool) -> None:
        iterator = source.__aiter__()
        while True:
            if self.ctl.records_inside >= self.capacity:
                await self._wait_capacity()
                if self.failure is not None:
                    return
            try:
                it, first = start(iterator.__anext__())
            except StopIteration as ready:  # the source had an element at hand
                element = ready.value
            except StopAsyncIteration:
                return
            else:  # the source must wait: send what the buffer holds before waiting with it
                self._flush_now()
                try:
                    element = await Resumed(it, first)
                except StopAsyncIteration:
                    return
            if batches:
                await self._intake_sync(element)
            else:
                await self._intake_sync((element,))

    async def _spill_out(self, items: list[ParkedItem]) -> None:
        """Hand parked records to the consumer, waiting while it has not taken the last ones:
        input read after a hold leaves as fast as it is read, never piling up."""
        assert self.spill is not None
        self.spill.extend(items)
        self._notify()
        if len(self.spill) >= _SPILL_CHUNK and self.failure is None:
            waiter = self.loop.create_future()
            self._spill_waiter = waiter
            await waiter

    def take_spill(self) -> list[ParkedItem]:
        """The parked records to write out now (emit_parked)."""
        spill = self.spill
        if not spill:
            return []
        items = spill[:]
        spill.clear()
        waiter, self._spill_waiter = self._spill_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        return items

    async def _wait_capacity(self) -> None:
        if self.holding:
            return
        self._flush_now()
        waiter = self.loop.create_future()
        self._capacity_waiter = waiter
        await waiter

    # ------------------------------------------------------------------ output side

    def handed_out(self, entry: Entry) -> None:
        """The consumer has taken ``entry``'s last result: free its place."""
        self.ctl.hand_out(entry)
        if not entry.watermark:
            self.counters["records_out"] += 1
        waiter = self._capacity_waiter
        if waiter is not None and self.ctl.records_inside < self.capacity:
            self._capacity_waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def hand_out_all(self) -> list[Entry]:
        """Take every entry that may leave now (for batch consumers)."""
        out = self.ctl.out
        entries = list(out)
        out.clear()
        self.counters["records_out"] += self.ctl.hand_out_many(entries, records_only=self.plain_output)
        waiter = self._capacity_waiter
        if waiter is not None and self.ctl.records_inside < self.capacity:
            self._capacity_waiter = None
            if not waiter.done():
                waiter.set_result(None)
        return entries

    async def wait_output(self, bound: float | None = None) -> None:
        """Until something may leave (or ``bound`` seconds pass)."""
        waiter = self.loop.create_future()
        self._output_waiter = waiter
        timer = self.loop.call_later(bound, _resolve, waiter) if bound is not None else None
        try:
            await waiter
        finally:
            self._output_waiter = None
            if timer is not None:
                timer.cancel()

    def _notify(self) -> None:
        waiter = self._output_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _set_failure(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = exc
        for waiter in (self._capacity_waiter, self._spill_waiter):
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
        self._notify()

    @property
    def finished(self) -> bool:
        if not self.source_done:
            return False
        if self.ctl.idle:
            return True
        # held: done once nothing runs any more and everything that may leave has left
        return (
            self.holding and not self._running and not self._batches and not self.ctl.out and not self.spill
        )

    # ------------------------------------------------------------------ holding and parking

    def hold(self) -> None:
        """Start nothing new from now on: running attempts finish (their timeouts still apply),
        retries are not scheduled, and every other record, and all further input, is kept for
        :meth:`leftover`. The run ends when the source has ended and nothing runs."""
        if self.holding:
            return
        self.holding = True
        for entry in self.ctl.live_entries():
            if entry.state == State.WAITING_RETRY and isinstance(entry.handle, asyncio.TimerHandle):
                entry.handle.cancel()
                entry.handle = None
                entry.state = State.READY
            if entry.state != State.RUNNING and entry.timer is not None:
                self._disarm(entry)
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        waiter = self._capacity_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        self._notify()

    def _park(self, entry: Entry, info: ParkInfo) -> None:
        if entry.timer is not None:
            self._disarm(entry)
        self.counters["deferred"] += 1
        self.plain_output = False
        self.ctl.park(entry, info)
        self._notify()

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
        key_of = self.op.key_selector
        if self.unadmitted:
            assert key_of is not None
            items.extend(ParkedItem(r, key_of(r)) for r in self.unadmitted if type(r) is not Watermark)
        return items

    # ------------------------------------------------------------------ dispatch

    def _dispatch_many(self, entries: list[Entry]) -> None:
        self._ready.extend(entries)
        if not self._draining:
            self._drain()

    def _dispatch(self, entry: Entry) -> None:
        """``entry`` may start: run it now, or after the running callback when one is active."""
        self._ready.append(entry)
        if not self._draining:
            self._drain()

    def _drain(self) -> None:
        if self.holding:
            return  # held entries stay in the ready queue for the leftover
        self._draining = True
        try:
            ready, now = self._ready, -1.0
            while ready:
                if self.batching and not self.closing:
                    self._drain_into_buffer()
                    continue
                entry = ready.popleft()
                if self.closing:
                    continue
                if entry.attempts == 0:
                    if now < 0:
                        now = self.loop.time()
                    entry.started = now
                    if entry.preset is not None:
                        self._presets -= 1
                        self._succeed(entry, entry.preset)
                        continue
                self._attempt(entry)
        finally:
            self._draining = False

    def _drain_into_buffer(self) -> None:
        ready = self._ready
        if self._presets:
            fresh = []
            while ready:
                entry = ready.popleft()
                if entry.attempts == 0 and entry.preset is not None:
                    self._presets -= 1
                    entry.started = self.loop.time()
                    self._succeed(entry, entry.preset)
                else:
                    fresh.append(entry)
        else:
            fresh = list(ready)
            ready.clear()
        for batch in self.buffer.extend(fresh):
            self._send_batch(batch)
        idle = self.buffer_timeout is not None or not self._batches
        if len(self.buffer) and self._flush_handle is None and idle:
            self._schedule_flush()

    def _attempt(self, entry: Entry) -> None:
        entry.attempts += 1
        self.counters["attempts"] += 1
        entry.state = State.RUNNING
        try:
            awaitable, first = self._prepare(self.fn.call, entry.record)
        except StopIteration as done:
            self._on_value(entry, done.value)
            return
        except (Exception, asyncio.CancelledError) as exc:  # noqa: BLE001 - the outcome of the action
            self._on_error(entry, exc)
            return
        if isinstance(awaitable, asyncio.Future):
            task: asyncio.Future[Any] = awaitable
            task.add_done_callback(self._on_future_done)
        else:
            step = (
                awaitable,
                first,
                partial(self._settle_record, entry),
                partial(_cancelled_by_us, self, entry),
            )
            if self._adopter is not None and not self._adopted:
                # a task is settling a record right now: it runs this one next, no new task
                task = self._adopter
                self._adopted.append(step)
            else:
                task = self.loop.create_task(Settling(*step))
        entry.handle = task
        self._running[task] = entry
        if self.timeout is not None and entry.timer is None:
            self._arm_timeout(entry)

    def _prepare(self, call: Any, argument: Any) -> tuple[Any, Any]:
        """Call the action: ``(iterator, first yielded or _NOT_YET)`` to drive in a task, or
        ``(future, None)`` to wait on; raises StopIteration carrying an instant value.

        A coroutine runs in a task of its own (so ``asyncio.current_task()`` is right inside it),
        except that an eager action first runs up to its first suspension here.
        """
        awaitable = call(argument)
        if type(awaitable) is _CoroutineType:
            if not self.fn.eager:
                return awaitable, _NOT_YET
            return start(awaitable)
        if isinstance(awaitable, asyncio.Future):
            return awaitable, None
        if hasattr(awaitable, "__await__"):
            return awaitable.__await__(), _NOT_YET
        raise _not_awaitable(self.fn.name, awaitable)

    def _settle_record(self, entry: Entry, value: Any, failure: BaseException | None) -> Any:
        """Settle ``entry`` inside its task's step; return the next attempt for that task to run
        (one that became ready while settling), or None to end the task."""
        task = entry.handle
        if self.closing or task is None:
            return None  # timed out while finishing
        self._running.pop(task, None)
        entry.handle = None
        self._adopter, self._adopted = task, []
        try:
            self._settle(entry, value, failure)
        finally:
            adopted, self._adopter, self._adopted = self._adopted, None, []
        return adopted[0] if adopted else None

    def _on_future_done(self, future: asyncio.Future[Any]) -> None:
        entry = self._running.pop(future, None)
        if entry is None or self.closing:
            if not future.cancelled():
                future.exception()  # retrieved: it was cancelled too late to matter
            return
        entry.handle = None
        if future.cancelled():
            self._settle(entry, None, asyncio.CancelledError())
        else:
            self._settle(entry, future.result() if future.exception() is None else None, future.exception())

    def _settle(self, entry: Entry, value: Any, failure: BaseException | None) -> None:
        self._draining = True
        try:
            if failure is None:
                self._on_value(entry, value)
            else:
                self._on_error(entry, failure)
        finally:
            self._draining = False
        self._drain()

    # ------------------------------------------------------------------ batches

    def _schedule_flush(self) -> None:
        if self.buffer_timeout:
            self._flush_handle = self.loop.call_later(self.buffer_timeout, self._flush_callback)
        else:
            self._flush_handle = self.loop.call_soon(self._flush_callback)

    def _flush_callback(self) -> None:
        self._flush_handle = None
        self._flush_now()

    def _flush_now(self) -> None:
        if not self.batching or not len(self.buffer) or self.closing or self.holding:
            return
        self._draining = True
        try:
            self._send_batch(self.buffer.take())
        finally:
            self._draining = False
        self._drain()

    def _send_batch(self, entries: list[Entry]) -> None:
        batch = _Batch(entries)
        counters = self.counters
        counters["batches"] += 1
        counters["attempts"] += len(entries)
        running, now = State.RUNNING, self.loop.time()
        records = []
        for entry in entries:
            if entry.attempts == 0:
                entry.started = now
            entry.attempts += 1
            entry.state = running
            entry.handle = batch
            records.append(entry.record)
        try:
            assert self.fn.call_batch is not None
            awaitable, first = self._prepare(self.fn.call_batch, records)
        except StopIteration as done:
            self._on_batch_value(batch, done.value)
            return
        except (Exception, asyncio.CancelledError) as exc:  # noqa: BLE001 - the outcome of the action
            self._on_batch_error(batch, exc)
            return
        if isinstance(awaitable, asyncio.Future):
            awaitable = awaitable.__await__()
            first = _NOT_YET
        task: asyncio.Future[Any] = self.loop.create_task(
            Settling(
                awaitable,
                first,
                partial(self._settle_batch, batch),
                partial(_batch_cancelled_by_us, self, batch),
            )
        )
        batch.task = task
        self._batches[task] = batch
        if self.timeout is not None:
            for entry in entries:
                if entry.timer is None:
                    self._arm_timeout(entry)

    def _settle_batch(self, batch: _Batch, values: Any, failure: BaseException | None) -> None:
        if self.closing:
            return
        if batch.task is not None:
            self._batches.pop(batch.task, None)
        self._draining = True
        try:
            if failure is None:
                self._on_batch_value(batch, values)
            else:
                self._on_batch_error(batch, failure)
        finally:
            self._draining = False
        self._drain()
        self._flush_when_idle()

    def _flush_when_idle(self) -> None:
        """Without a buffer timeout (backlog): a part-filled buffer leaves once no batch is in
        flight that could still fill it, so nothing waits on a timer and nothing waits forever."""
        waiting = len(self.buffer) and self._flush_handle is None
        if waiting and self.buffer_timeout is None and not self._batches:
            self._schedule_flush()

    def _on_batch_value(self, batch: _Batch, values: Any) -> None:
        entries = batch.entries
        if not isinstance(values, (list, tuple)) or len(values) != len(entries):
            got = f"{len(values)} values" if isinstance(values, (list, tuple)) else type(values).__name__
            error = ResultTypeError(
                f"{self.fn.name}.invoke_batch() must return one result list (or exception) per "
                f"record: sent {len(entries)} records, got {got}"
            )
            for entry in entries:
                if entry.handle is batch:
                    entry.handle = None
                    self._fail(entry, error)
            return
        done: list[Entry] = []
        fast, timed, finished = not self.result_retry, self.timeout is not None, State.DONE
        for entry, value in zip(entries, values, strict=True):
            if entry.handle is not batch:
                continue  # timed out while the batch ran
            entry.handle = None
            if fast and type(value) is list:
                if timed and entry.timer is not None:
                    self._disarm(entry)
                entry.results = value
                entry.state = finished
                done.append(entry)
            elif isinstance(value, BaseException):
                self._on_error(entry, value)
            else:
                self._on_value(entry, value)
        if done:
            if self.latency is not None:
                now = self.loop.time()
                self.latency.add_many(now - entry.started for entry in done)
            nxt = self.ctl.finish_many(done, marked=True)
            if nxt:
                self._dispatch_many(nxt)
            self._notify()

    def _on_batch_error(self, batch: _Batch, exc: BaseException) -> None:
        for entry in batch.entries:
            if entry.handle is batch:
                entry.handle = None
                self._on_error(entry, exc)

    # ------------------------------------------------------------------ outcomes

    def _on_value(self, entry: Entry, value: Any) -> None:
        try:
            results = self.fn.to_results(value)
        except ResultTypeError as exc:
            self._fail(entry, exc)
            return
        if self.result_retry:
            assert self.retry is not None
            delay = self.retry.next_delay(entry.attempts, entry.started, results=results)
            if delay is not None:
                self._schedule_retry(entry, delay)
                return
        self._succeed(entry, results)

    def _on_error(self, entry: Entry, exc: BaseException) -> None:
        retry = self.retry
        if retry is not None and not isinstance(exc, ResultTypeError):
            delay = retry.next_delay(entry.attempts, entry.started, exception=exc)
            if delay is not None:
                self._schedule_retry(entry, delay)
                return
        self._fail(entry, exc)

    def _schedule_retry(self, entry: Entry, delay: float) -> None:
        if self.holding:  # no new attempt: the record is kept, with its attempts, for the leftover
            entry.state = State.READY
            if entry.timer is not None:
                self._disarm(entry)
            return
        self.counters["retries"] += 1
        entry.state = State.WAITING_RETRY
        entry.handle = self.loop.call_later(delay, self._retry_now, entry)
        if self.timeout is not None and entry.timer is None:
            self._arm_timeout(entry)

    def _retry_now(self, entry: Entry) -> None:
        entry.handle = None
        self._dispatch(entry)

    def _succeed(self, entry: Entry, results: list[Any]) -> None:
        if entry.timer is not None:
            self._disarm(entry)
        entry.results = results
        if self.latency is not None:
            self.latency.add(self.loop.time() - entry.started)
        nxt = self.ctl.finish(entry)
        if nxt is not None:
            self._dispatch(nxt)
        self._notify()

    def _fail(self, entry: Entry, exc: BaseException) -> None:
        if self.defer is not None:
            now = self.defer.clock()
            info = self.defer.defer(entry.meta or FRESH, now, entry.attempts, f"{type(exc).__name__}: {exc}")
            if not self.defer.expired(info, now):
                self._park(entry, info)
                return
            assert info.deferred_since is not None
            exc = RecordFailedError(
                entry.key,
                info.attempts,
                entry.record,
                f"deferred {info.deferrals - 1} times over {now - info.deferred_since:.0f} s, the maximum "
                f"deferral age; last error {info.error}",
            )
            entry.attempts = info.attempts
        self.counters["failures"] += 1
        if isinstance(exc, RecordFailedError):
            error: RecordFailedError = exc
        else:
            error = RecordFailedError(entry.key, entry.attempts, entry.record, f"{type(exc).__name__}: {exc}")
            error.__cause__ = exc
        if not self.emit_errors:
            if entry.timer is not None:
                self._disarm(entry)
            self._set_failure(error)
            return
        self.plain_output = False
        entry.failure = FailedRecord(
            record=entry.record,
            key=entry.key,
            error_type=type(exc).__name__,
            error_message=str(exc),
            attempts=entry.attempts,
            exception=exc,
        )
        self._succeed(entry, [])

    # ------------------------------------------------------------------ timeouts

    def _arm_timeout(self, entry: Entry) -> None:
        assert self.timeout is not None and self.deadlines is not None
        entry.timer = self.deadlines.arm(entry, entry.started + self.timeout)

    def _disarm(self, entry: Entry) -> None:
        assert self.deadlines is not None
        self.deadlines.disarm(entry, entry.timer)
        entry.timer = None

    def _on_timeout(self, entry: Entry) -> None:
        entry.timer = None
        if entry.state == State.DONE or self.closing:
            return
        handle, entry.handle = entry.handle, None
        if isinstance(handle, _Batch):
            handle.live -= 1
            if handle.live == 0 and handle.task is not None:
                self._batches.pop(handle.task, None)
                handle.task.cancel()
        elif isinstance(handle, asyncio.Future):
            self._running.pop(handle, None)
            handle.cancel()
        elif handle is not None:
            handle.cancel()  # a retry timer
        elif entry.state == State.READY:
            self.buffer.remove(entry)
        self.counters["timeouts"] += 1
        self._draining = True
        try:
            fallback = self.fn.fallback
            if fallback is None:
                assert self.timeout is not None
                self._fail(entry, RecordTimeoutError(entry.key, entry.attempts, entry.record, self.timeout))
            else:
                try:
                    results = self.fn.to_results(fallback(entry.record))
                except Exception as exc:  # noqa: BLE001 - the record fails with it
                    self._fail(entry, exc)
                else:
                    self._succeed(entry, results)
        finally:
            self._draining = False
        self._drain()
        self._flush_when_idle()

    # ------------------------------------------------------------------ shutdown

    async def close(self, intake: asyncio.Task[None], wait_running: bool) -> None:
        """Stop intake; await or cancel what still runs; leave no task or timer behind."""
        if not intake.done():
            intake.cancel()
        tasks: list[asyncio.Future[Any]] = [intake]
        running = list(self._running) + list(self._batches)
        if wait_running and running:
            bound = self.timeout if self.timeout is not None else None
            await asyncio.wait(running, timeout=bound)
        self.closing = True
        if self._flush_handle is not None:
            self._flush_handle.cancel()
        if self.deadlines is not None:
            self.deadlines.close()
        for entry in self.ctl.live_entries():
            entry.timer = None
            if isinstance(entry.handle, asyncio.TimerHandle):
                entry.handle.cancel()
        for task in running:
            task.cancel()
        tasks.extend(running)
        self._running.clear()
        self._batches.clear()
        await asyncio.gather(*tasks, return_exceptions=True)


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _cancelled_by_us(runtime: Runtime, entry: Entry) -> bool:
    return runtime.closing or entry.handle is None


def _batch_cancelled_by_us(runtime: Runtime, batch: _Batch) -> bool:
    return runtime.closing or batch.live == 0


def _not_awaitable(name: str, value: Any) -> ResultTypeError:
    return ResultTypeError(
        f"{name}(record) must return an awaitable (use async def), got {type(value).__name__}"
    )

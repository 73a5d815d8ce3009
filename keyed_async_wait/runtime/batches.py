"""Batching: ready records gathered in the active buffer and sent to ``invoke_batch`` together.

A batch leaves when the buffer is full; with ``buffer_timeout=0`` also as soon as no more
records are at hand; with a positive ``buffer_timeout`` at most that late; with ``None``
(backlog) only when the intake must wait or no batch is in flight (no timer at all). One key
still has at most one record in a batch and in flight (the controller readies one per key).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from typing import Any

from ..core.buffer import ActiveBuffer
from ..core.entry import Entry, State
from ..core.exceptions import ResultTypeError
from .eager import NOT_YET, Settling, prepare
from .outcomes import Outcomes
from .run import Run
from .timers import Timers

__all__ = ["Batch", "Batcher"]


class Batch:
    """One call of ``invoke_batch``: the entries it carries and the task running it."""

    __slots__ = ("entries", "live", "task")

    def __init__(self, entries: list[Entry]) -> None:
        self.entries = entries
        self.live = len(entries)  # entries still waiting on it (the others timed out)
        self.task: asyncio.Future[Any] | None = None


class Batcher:
    """The active buffer and the batches in flight (see the module doc). ``drain`` is the
    dispatcher's: it runs what a settled batch made ready."""

    __slots__ = (
        "batches",
        "buffer",
        "buffer_timeout",
        "drain",
        "enabled",
        "flush_handle",
        "outcomes",
        "run",
        "timers",
    )

    def __init__(self, run: Run, outcomes: Outcomes, timers: Timers, *, drain: Callable[[], None]) -> None:
        spec = run.spec
        self.run = run
        self.outcomes = outcomes
        self.timers = timers
        self.drain = drain
        self.enabled = spec.batch_size is not None and run.fn.call_batch is not None
        self.buffer = ActiveBuffer(spec.batch_size or 1)
        self.buffer_timeout = spec.buffer_timeout
        self.flush_handle: asyncio.Handle | None = None
        self.batches: dict[asyncio.Future[Any], Batch] = {}  # task -> the batch it runs

    def take(self, fresh: list[Entry]) -> None:
        """Put ready entries into the buffer; send the full batches."""
        for batch in self.buffer.extend(fresh):
            self._send(batch)
        idle = self.buffer_timeout is not None or not self.batches
        if len(self.buffer) and self.flush_handle is None and idle:
            self._schedule_flush()

    def _schedule_flush(self) -> None:
        loop = self.run.loop
        if self.buffer_timeout:
            self.flush_handle = loop.call_later(self.buffer_timeout, self._flush_callback)
        else:
            self.flush_handle = loop.call_soon(self._flush_callback)

    def _flush_callback(self) -> None:
        self.flush_handle = None
        self.flush_now()

    def flush_now(self) -> None:
        """Send what the buffer holds, full or not."""
        run = self.run
        if not self.enabled or not len(self.buffer) or run.closing or run.holding:
            return
        self._send(self.buffer.take())
        self.drain()

    def flush_when_idle(self) -> None:
        """Without a buffer timeout (backlog): a part-filled buffer leaves once no batch is in
        flight that could still fill it, so nothing waits on a timer and nothing waits forever."""
        waiting = len(self.buffer) and self.flush_handle is None
        if waiting and self.buffer_timeout is None and not self.batches:
            self._schedule_flush()

    def _send(self, entries: list[Entry]) -> None:
        run = self.run
        batch = Batch(entries)
        counters = run.counters
        counters.batches += 1
        counters.attempts += len(entries)
        running, now = State.RUNNING, run.loop.time()
        records = []
        for entry in entries:
            if entry.attempts == 0:
                entry.started = now
            entry.attempts += 1
            entry.state = running
            entry.handle = batch
            records.append(entry.record)
        fn = run.fn
        try:
            assert fn.call_batch is not None
            awaitable, first = prepare(fn.call_batch, records, fn.eager, f"{fn.name}.invoke_batch")
        except StopIteration as done:
            self._values(batch, done.value)
            return
        except (Exception, asyncio.CancelledError) as exc:  # noqa: BLE001 - the outcome of the action
            self._error(batch, exc)
            return
        if isinstance(awaitable, asyncio.Future):
            awaitable, first = awaitable.__await__(), NOT_YET
        task: asyncio.Future[Any] = run.loop.create_task(
            Settling(awaitable, first, partial(self._settle, batch), partial(_ours, run, batch))
        )
        batch.task = task
        self.batches[task] = batch
        self.timers.arm_many(entries, now)

    def _settle(self, batch: Batch, values: Any, failure: BaseException | None) -> None:
        if batch.task is not None:
            self.batches.pop(batch.task, None)
            # the task holds this batch (its callback): left set, every batch and its entries
            # would wait in a reference cycle for the collector instead of being freed
            batch.task = None
        if self.run.closing:
            return
        if failure is None:
            self._values(batch, values)
        else:
            self._error(batch, failure)
        self.drain()
        self.flush_when_idle()

    def _values(self, batch: Batch, values: Any) -> None:
        entries, outcomes = batch.entries, self.outcomes
        if not isinstance(values, (list, tuple)) or len(values) != len(entries):
            got = f"{len(values)} values" if isinstance(values, (list, tuple)) else type(values).__name__
            error = ResultTypeError(
                f"{self.run.fn.name}.invoke_batch() must return one result list (or exception) per "
                f"record: sent {len(entries)} records, got {got}"
            )
            for entry in entries:
                if entry.handle is batch:
                    entry.handle = None
                    outcomes.apply(entry, outcomes.policy.failed(entry, error, outcomes.wall()))
            return
        done: list[Entry] = []
        fast, finished = not outcomes.result_retry, State.DONE
        for entry, value in zip(entries, values, strict=True):
            if entry.handle is not batch:
                continue  # timed out while the batch ran
            entry.handle = None
            if fast and type(value) is list:
                entry.results = value
                entry.state = finished
                done.append(entry)
            elif isinstance(value, BaseException):
                outcomes.error(entry, value)
            else:
                outcomes.value(entry, value)
        if done:
            self.timers.disarm_many(done)
            outcomes.succeed_many(done)

    def _error(self, batch: Batch, exc: BaseException) -> None:
        for entry in batch.entries:
            if entry.handle is batch:
                entry.handle = None
                self.outcomes.error(entry, exc)

    def expire(self, entry: Entry, batch: Batch) -> None:
        """``entry`` timed out while ``batch`` ran: the batch ends when no entry waits on it."""
        batch.live -= 1
        if batch.live == 0 and batch.task is not None:
            self.batches.pop(batch.task, None)
            batch.task.cancel()

    def hold(self) -> None:
        if self.flush_handle is not None:
            self.flush_handle.cancel()
            self.flush_handle = None

    def close(self) -> None:
        """Stop the flush timer and forget the batches (the caller cancels their tasks)."""
        if self.flush_handle is not None:
            self.flush_handle.cancel()
        self.batches.clear()


def _ours(run: Run, batch: Batch) -> bool:
    """A cancellation the runtime made (a close, or every entry timed out): not an outcome."""
    return run.closing or batch.live == 0

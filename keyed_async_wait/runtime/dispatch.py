"""Invocation and settling: ready records start, and each attempt settles inside its task.

The :class:`Dispatcher` owns the work side of a run, wired when it is made: the ready queue,
the :class:`~.timers.Timers` (a fired timeout comes back to :meth:`Dispatcher.expire`, a retry
whose delay passed to :meth:`Dispatcher.dispatch`), the :class:`~.outcomes.Outcomes` (which put
the next record of a key into the ready queue) and the :class:`~.batches.Batcher`.

Each attempt runs in a task of the operator's and settles inside that task's step
(:class:`~keyed_async_wait.runtime.eager.Settling`): no done callback, and a record that
became ready meanwhile (the next of its key) runs on in the same task. An eager function is
first run up to its first suspension and gets no task if it finishes there. Work that becomes
possible while settling is queued and run by one loop (:meth:`Dispatcher.drain`), never by
recursion, so a long run of synchronously finishing records of one key cannot overflow the
stack.

A task whose attempt ended with nothing to run next is parked, not ended, and the next attempt
that needs a task takes a parked one (making and registering a task costs several times more).
Invariants: a parked task holds no entry and is in no entry's ``handle``; a task is parked at
most once and is in ``running`` or parked, never both; so the tasks alive never outnumber the
attempts that ran at once. Closing stops the parking first (a task that finishes then ends, so
waiting for the running tasks ends), then cancels the parked ones.
"""

from __future__ import annotations

import asyncio
from collections import deque
from functools import partial
from typing import Any

from ..core.entry import Entry, State
from .batches import Batch, Batcher
from .eager import Settling, prepare
from .outcomes import Outcomes
from .run import Run, resolve
from .timers import Timers

__all__ = ["Dispatcher"]


class Dispatcher:
    """Starts ready entries and settles their attempts (see the module doc)."""

    __slots__ = (
        "_adopted",
        "_adopter",
        "_idle",
        "_parking",
        "batcher",
        "draining",
        "outcomes",
        "presets",
        "ready",
        "run",
        "running",
        "timers",
    )

    def __init__(self, run: Run) -> None:
        self.run = run
        self.ready: deque[Entry] = deque()  # entries that may start, in order
        self.draining = False  # a drain or a settlement is under way: new entries only queue
        self.running: dict[asyncio.Future[Any], Entry] = {}
        self.presets = 0  # restored entries whose results are known, not yet handed on
        self.timers = Timers(run, expired=self.expire, retry_now=self.dispatch)
        self.outcomes = Outcomes(run, self.timers, self.ready)
        self.batcher = Batcher(run, self.outcomes, self.timers, drain=self.drain)
        # the task settling a record right now, and what it was handed to run next
        self._adopter: asyncio.Future[Any] | None = None
        self._adopted: list[Any] = []
        self._idle: list[Settling] = []  # parked tasks, the last parked on top
        self._parking = True

    def dispatch(self, entry: Entry) -> None:
        """``entry`` may start: run it now, or after the running settlement when one is active."""
        self.ready.append(entry)
        if not self.draining:
            self.drain()

    def dispatch_many(self, entries: list[Entry]) -> None:
        self.ready.extend(entries)
        if not self.draining:
            self.drain()

    def restored(self, entry: Entry | None, preset: bool) -> None:
        """A record restored from a snapshot was admitted (``entry``: it may start now; None:
        it waits behind its key); ``preset``: its results are known, it needs no invocation."""
        if preset:
            self.presets += 1
        if entry is not None:
            self.dispatch(entry)

    @property
    def busy(self) -> bool:
        """Whether an attempt or a batch still runs."""
        return bool(self.running or self.batcher.batches)

    def drain(self) -> None:
        run = self.run
        if run.ctl.superseded:  # finished (coalesced away): results now, held or not
            self.outcomes.supersede()
        if run.holding:
            return  # held entries stay in the ready queue for the leftover
        self.draining = True
        try:
            ready, now, batcher = self.ready, -1.0, self.batcher
            parked, superseded = run.ctl.aside_parked, run.ctl.superseded  # changed in place
            while ready or parked or superseded:
                if superseded:
                    self.outcomes.supersede()
                    continue
                if parked:
                    self._park_set_aside()
                    continue
                if batcher.enabled and not run.closing:
                    batcher.take(self._fresh())
                    continue
                entry = ready.popleft()
                if run.closing:
                    continue
                if entry.attempts == 0:
                    if now < 0:
                        now = run.loop.time()
                    entry.started = now
                    if entry.preset is not None:
                        self.presets -= 1
                        self.outcomes.succeed(entry, entry.preset)
                        continue
                self._attempt(entry)
        finally:
            self.draining = False
        if run.ctl.aside.due:  # a hot key's queue ran dry: the intake brings its records back
            resolve(run.aside_waiter)

    def _park_set_aside(self) -> None:
        """The records a key had set aside, parked behind it (the key was parked)."""
        ctl, overflow = self.run.ctl, self.run.overflow
        while ctl.aside_parked:
            key = ctl.aside_parked.popleft()
            ctl.park_set_aside(key, overflow.take(key, ctl.aside.counts.get(key, 0)))
        if not ctl.aside:
            resolve(self.run.aside_waiter)

    def _fresh(self) -> list[Entry]:
        """Every ready entry, those restored with their results settled on the way."""
        ready = self.ready
        if not self.presets:
            fresh = list(ready)
            ready.clear()
            return fresh
        fresh = []
        while ready:
            entry = ready.popleft()
            if entry.attempts == 0 and entry.preset is not None:
                self.presets -= 1
                entry.started = self.run.loop.time()
                self.outcomes.succeed(entry, entry.preset)
            else:
                fresh.append(entry)
        return fresh

    def _attempt(self, entry: Entry) -> None:
        run, fn = self.run, self.run.fn
        entry.attempts += 1
        run.counters.attempts += 1
        entry.state = State.RUNNING
        try:
            awaitable, first = prepare(fn.call, entry.record, fn.eager, fn.name)
        except StopIteration as done:
            self.outcomes.value(entry, done.value)
            return
        except (Exception, asyncio.CancelledError) as exc:  # noqa: BLE001 - the outcome of the action
            self.outcomes.error(entry, exc)
            return
        if isinstance(awaitable, asyncio.Future):
            task: asyncio.Future[Any] = awaitable
            task.add_done_callback(self._future_done)
        else:
            step = (awaitable, first, partial(self._settle_in_task, entry), partial(_ours, run, entry))
            if self._adopter is not None and not self._adopted:
                # a task is settling a record right now: it runs this one next, no new task
                task = self._adopter
                self._adopted.append(step)
            else:
                task = self._reuse(step)
        entry.handle = task
        self.running[task] = entry
        if entry.timer is None and self.timers.deadlines is not None:
            self.timers.arm(entry)

    def _reuse(self, step: tuple[Any, Any, Any, Any]) -> asyncio.Future[Any]:
        """A parked task running ``step`` from the loop's next turn, else a new task."""
        idle = self._idle
        while idle:
            settling = idle.pop()
            if settling.idle:
                return settling.resume(*step)
        settling = Settling(*step, park=self._park)
        task: asyncio.Future[Any] = self.run.loop.create_task(settling)
        settling.task = task
        return task

    def _park(self, settling: Settling) -> asyncio.Future[None] | None:
        """A future for ``settling``'s task to wait on until it is reused, or None: it ends."""
        if not self._parking:  # the run is closing
            return None
        parked = self.run.loop.create_future()
        # what a future yielded by a coroutine carries; without it the task refuses to wait
        parked._asyncio_future_blocking = True
        self._idle.append(settling)
        return parked

    def stop_parking(self) -> list[asyncio.Future[Any]]:
        """From now on a task ends when its attempt does; the parked ones are cancelled and
        returned (for the caller to await)."""
        self._parking = False
        idle, self._idle = self._idle, []
        cancelled = [settling.task for settling in idle if settling.idle and settling.task is not None]
        for task in cancelled:
            task.cancel()
        return cancelled

    def _settle_in_task(self, entry: Entry, value: Any, failure: BaseException | None) -> Any:
        """Settle ``entry`` inside its task's step; return the next attempt for that task to run
        (one that became ready while settling), or None: the task parks or ends."""
        task = entry.handle
        if self.run.closing or task is None:
            return None  # timed out while finishing
        self.running.pop(task, None)
        entry.handle = None
        self._adopter, self._adopted = task, []
        try:
            self.settle(entry, value, failure)
        finally:
            adopted, self._adopter, self._adopted = self._adopted, None, []
        return adopted[0] if adopted else None

    def _future_done(self, future: asyncio.Future[Any]) -> None:
        entry = self.running.pop(future, None)
        if entry is None or self.run.closing:
            if not future.cancelled():
                future.exception()  # retrieved: it was cancelled too late to matter
            return
        entry.handle = None
        if future.cancelled():
            self.settle(entry, None, asyncio.CancelledError())
        else:
            self.settle(entry, future.result() if future.exception() is None else None, future.exception())

    def settle(self, entry: Entry, value: Any, failure: BaseException | None) -> None:
        self.draining = True
        try:
            if failure is None:
                self.outcomes.value(entry, value)
            else:
                self.outcomes.error(entry, failure)
        finally:
            self.draining = False
        self.drain()

    def expire(self, entry: Entry) -> None:
        """``entry``'s time ran out: stop what runs it, then its timeout outcome."""
        handle, entry.handle = entry.handle, None
        if isinstance(handle, Batch):
            self.batcher.expire(entry, handle)
        elif isinstance(handle, asyncio.Future):
            self.running.pop(handle, None)
            handle.cancel()
        elif handle is not None:
            handle.cancel()  # a retry timer
        elif entry.state == State.READY:
            self.batcher.buffer.remove(entry)
        self.draining = True
        try:
            self.outcomes.timed_out(entry)
        finally:
            self.draining = False
        self.drain()
        self.batcher.flush_when_idle()

    def hold(self) -> None:
        """Start nothing new: no retry, no flush."""
        self.timers.hold()
        self.batcher.hold()

    def tasks(self) -> list[asyncio.Future[Any]]:
        """The tasks running attempts and batches now."""
        return list(self.running) + list(self.batcher.batches)

    def close(self) -> None:
        """Stop every timer and forget the running tasks (the caller cancels them)."""
        self.batcher.close()
        self.timers.close()
        self.running.clear()


def _ours(run: Run, entry: Entry) -> bool:
    """A cancellation the runtime made (a timeout or a close): not an outcome of the action."""
    return run.closing or entry.handle is None

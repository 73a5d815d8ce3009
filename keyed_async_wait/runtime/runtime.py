"""The asyncio layer of the operator: it awaits, sleeps and cancels; the core decides.

One :class:`Runtime` exists per ``process()`` call, built from the operator's frozen
:class:`~keyed_async_wait.core.settings.OperatorSettings` (it never reads the operator). Its
parts, one concern each, share the run's state (:class:`~.run.Run`):

- :class:`~.intake.Intake`: records in, from the replay and the source, within the capacity;
- :class:`~.dispatch.Dispatcher`: ready records start; attempts settle in their own tasks;
- :class:`~.batches.Batcher`: the active buffer and the batch calls;
- :class:`~.timers.Timers`: timeouts (a timer wheel) and retry timers;
- :class:`~.outcomes.Outcomes`: what the pure outcome unit decides after an attempt, carried out.

The parts call one another only through the callbacks wired here, so no module imports one
that imports it back.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Iterable
from typing import Any

from ..core.elements import Watermark
from ..core.parking import ParkedItem
from ..core.settings import OperatorSettings
from ..core.snapshot import SnapshotRecord
from .batches import Batcher
from .dispatch import Dispatcher
from .function import FunctionAdapter
from .intake import Intake
from .outcomes import Outcomes
from .run import Run, resolve
from .timers import Timers

__all__ = ["Runtime"]


class Runtime:
    """Runs one ``process()``: the parts of the asyncio layer, wired (see the module doc)."""

    def __init__(
        self,
        settings: OperatorSettings,
        fn: FunctionAdapter,
        replay: list[SnapshotRecord | Watermark],
        parked_replay: list[ParkedItem],
        latency: Any = None,
    ) -> None:
        run = self.run = Run(settings, fn, replay, parked_replay, latency)
        self.timers = Timers(run)
        self.outcomes = Outcomes(run, self.timers)
        self.batcher = Batcher(run, self.outcomes, self.timers)
        self.dispatcher = Dispatcher(run, self.outcomes, self.timers, self.batcher)
        self.intake = Intake(run, self.dispatcher, self.batcher)
        self.outcomes.dispatch = self.dispatcher.dispatch
        self.batcher.drain = self.dispatcher.drain
        self.timers.retry_now = self.dispatcher.dispatch
        self.timers.expired = self.dispatcher.expire
        self.loop = run.loop
        self.ctl = run.ctl
        # the consumer's side, bound straight to the run's (one call per record, not two)
        self.handed_out = run.handed_out
        self.hand_out_all = run.hand_out_all
        self.wait_output = run.wait_output
        self.take_spill = run.take_spill
        self.leftover = run.leftover
        if fn.bind_release is not None:
            fn.bind_release(self.release_key)

    def release_key(self, record: Any) -> bool:
        """Let the next record of ``record``'s key start now, while ``record`` still runs
        (KEY_ORDERED; elsewhere there is no key order to release). False when ``record`` is
        not running here."""
        run = self.run
        entry = next((e for e in run.running.values() if e.record is record), None)
        if entry is None:
            return False
        nxt = run.ctl.release_early(entry)
        if nxt is not None:
            self.dispatcher.dispatch(nxt)
        return True

    # ------------------------------------------------------------------ what the operator uses

    @property
    def capacity(self) -> int:
        return self.run.capacity

    @property
    def failure(self) -> BaseException | None:
        return self.run.failure

    @property
    def finished(self) -> bool:
        return self.run.finished

    @property
    def holding(self) -> bool:
        return self.run.holding

    @property
    def plain_output(self) -> bool:
        return self.run.plain_output

    @property
    def spill(self) -> list[ParkedItem] | None:
        return self.run.spill

    @property
    def counters(self) -> Any:
        return self.run.counters

    @property
    def buffered(self) -> int:
        return len(self.batcher.buffer)

    def feed(self, source: Iterable[Any] | AsyncIterable[Any], batches: bool) -> asyncio.Task[None]:
        """Start the intake from ``source`` in a task of its own."""
        return self.loop.create_task(self.intake.feed(source, batches))

    # ------------------------------------------------------------------ holding and shutdown

    def hold(self) -> None:
        """Start nothing new from now on: running attempts finish (their timeouts still apply),
        retries are not scheduled, and every other record, and all further input, is kept for
        the leftover. The run ends when the source has ended and nothing runs."""
        run = self.run
        if run.holding:
            return
        run.holding = True
        self.timers.hold()
        self.batcher.hold()
        resolve(run.capacity_waiter)
        run.notify()

    async def close(self, intake: asyncio.Task[None], wait_running: bool) -> None:
        """Stop intake; await or cancel what still runs; leave no task or timer behind."""
        run = self.run
        if not intake.done():
            intake.cancel()
        tasks: list[asyncio.Future[Any]] = [intake]
        running = list(run.running) + list(run.batches)
        if wait_running and running:
            await asyncio.wait(running, timeout=run.settings.timeout)
        run.closing = True
        self.batcher.close()
        self.timers.close()
        for task in running:
            task.cancel()
        tasks.extend(running)
        run.running.clear()
        run.batches.clear()
        await asyncio.gather(*tasks, return_exceptions=True)

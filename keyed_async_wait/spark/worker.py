"""What a Spark Python worker process keeps: one event loop, one instance of each function.

This module keeps its state at module level on purpose: with ``spark.python.worker.reuse`` (the
default) a worker process runs many tasks, and its loop and clients serve all of them.
Importing it does not import pyspark; pyarrow is imported where batches are built.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import gc
import logging
import os
import time
from collections.abc import Callable, Generator
from typing import Any

from ..runtime.backend import FunctionAdapter
from .instances import Instances

__all__ = [
    "MIDDLE_THRESHOLD",
    "YOUNG_THRESHOLD",
    "CollectorWatch",
    "drive",
    "shared",
    "tune_collector",
    "worker_loop",
]

log = logging.getLogger(__name__)


class _WorkerLoop:
    """The process's event loop and function instances, for the life of the worker process.

    The task thread drives the loop itself (``run_until_complete`` until the next output chunk),
    as a hand-written ``asyncio.run`` per batch would, but the loop and its clients outlive the
    task. No second thread: measured, handing the GIL between a loop thread and the task
    thread cost about a sixth of the throughput of CPU-bound lookups.
    """

    def __init__(self) -> None:
        self.collector = CollectorWatch()
        self.loop = new_loop()
        self.instances = Instances(self.loop)
        atexit.register(self.shutdown)

    def function(self, token: str, function: Any) -> FunctionAdapter:
        """The process's instance of ``function`` (one per ``token``), opened once in the loop."""
        return self.instances.function(token, function)

    def shutdown(self) -> None:
        if self.loop.is_closed() or self.loop.is_running():
            return
        with contextlib.suppress(Exception):  # best effort at process exit
            self.loop.run_until_complete(asyncio.wait_for(self.instances.close_all(), 10))
        self.loop.close()


_WORKER: _WorkerLoop | None = None


def new_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop when it is installed (the ``fast`` extra), else asyncio's;
    ``KAW_EVENT_LOOP=asyncio`` forces asyncio's."""
    if os.environ.get("KAW_EVENT_LOOP", "auto") != "asyncio":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
            return loop
    return asyncio.new_event_loop()


# Young objects the collector lets accumulate before it runs (Python's default is 700).
YOUNG_THRESHOLD = 20_000
# Young collections before the middle generation is collected too (Python's default is 10).
MIDDLE_THRESHOLD = 50


def tune_collector() -> bool:
    """Let the garbage collector run less often in this worker process (True when it did).

    Why: a lookup in flight holds a few dozen container objects (request, response, futures,
    coroutines) for the service's round trip. With the default threshold of 700 allocations,
    hundreds of records in flight keep the young generation full, so the collector runs every
    few records and promotes live requests into the older generations, whose collections walk
    every object of the process. Measured (``./run bench cpu_profile``): 650 young and 5 full
    collections per 10,000 HTTP lookups, a quarter of the task's CPU; at 20,000 about one.
    Batched lookups hold thousands of records in flight, and every middle collection promoted
    them into the oldest generation, soon followed by a full collection (70 ms in a worker):
    with the middle generation collected every 50 young collections instead of 10, a task of
    100,000 Redis MGET rows spends 38 ms collecting instead of 90 (``cpu_profile --path
    redis_mget``). A larger young threshold was measured too: each young collection then walks
    more live objects (cache misses), and the total grew. Reference cycles are still
    collected; they wait longer. Each threshold is only raised; ``KAW_GC=default`` leaves
    Python's settings as they are.
    """
    if os.environ.get("KAW_GC", "auto") == "default":
        return False
    young, middle, old = gc.get_threshold()
    if young == 0:  # automatic collection is off: not ours to turn on
        return True
    gc.set_threshold(max(young, YOUNG_THRESHOLD), max(middle, MIDDLE_THRESHOLD), old)
    return True


class CollectorWatch:
    """Collections per generation and their CPU seconds in this process (for the task log)."""

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.seconds = 0.0
        self._started = 0.0
        gc.callbacks.append(self._observe)

    def _observe(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        self.collections[info["generation"]] += 1
        self.seconds += time.perf_counter() - self._started

    def close(self) -> None:
        """Stop counting."""
        if self._observe in gc.callbacks:
            gc.callbacks.remove(self._observe)

    def sample(self) -> tuple[int, int, int, float]:
        """(young, middle, full collections, seconds) so far; subtract two for a task's."""
        young, middle, full = self.collections
        return young, middle, full, self.seconds


def worker_loop() -> _WorkerLoop:
    """The process's loop; called at the start of every task, which (re)tunes the collector."""
    global _WORKER
    tune_collector()
    if _WORKER is None:
        _WORKER = _WorkerLoop()
    return _WORKER


def shared(adapter: FunctionAdapter) -> FunctionAdapter:
    """The adapter without open/close: the process owns those, not the task."""
    return adapter.replaced(open=None, close=None, bind_release=None)


def drive(
    loop: asyncio.AbstractEventLoop,
    outputs: Any,
    rows: int,
    on_chunk: Callable[[], None] | None = None,
) -> Generator[list[Any], None, None]:
    """The chunks of an operator's ``process_batches`` joined into lists of at least ``rows``
    items (the last: what is left), the caller's thread driving ``loop``; ``on_chunk()`` is
    called in the loop after each chunk. Close it (``contextlib.closing``) to close the
    operator's run in the loop, also early.

    Why lists: the operator hands out what is ready, often a few dozen records at a time, and
    each Arrow batch built and sent to Spark has a fixed cost (measured: a tenth of the task's
    CPU on per-row HTTP lookups). Why joined inside the loop: every ``run_until_complete``
    costs about 30 us on uvloop (it sets up signal handling each time in the main thread), a
    few microseconds a row when taken per chunk. A finished record counts against no capacity
    while it waits here."""
    try:
        while True:
            joined, more = loop.run_until_complete(_joined(outputs, rows, on_chunk))
            if joined:
                yield joined
            if not more:
                return
    finally:
        loop.run_until_complete(outputs.aclose())


async def _joined(outputs: Any, rows: int, on_chunk: Callable[[], None] | None) -> tuple[list[Any], bool]:
    """(chunks of ``outputs`` joined up to at least ``rows`` items, whether more may come)."""
    pending: list[Any] = []
    step = outputs.__anext__
    while len(pending) < rows:
        try:
            chunk = await step()
        except StopAsyncIteration:
            return pending, False
        if on_chunk is not None:
            on_chunk()
        pending += chunk
    return pending, True

"""What a Spark Python worker process keeps: one event loop, one instance of each function.

This module keeps its state at module level on purpose: with ``spark.python.worker.reuse`` (the
default) a worker process runs many tasks, and its loop and clients serve all of them.
Importing it does not import pyspark; pyarrow is imported where batches are built.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
from collections.abc import Generator
from typing import Any

from ..runtime.function import FunctionAdapter, adapt_function

__all__ = ["drive", "shared", "worker_loop"]

log = logging.getLogger(__name__)


class _WorkerLoop:
    """The process's event loop and function instances, for the life of the worker process.

    The task thread drives the loop itself (``run_until_complete`` until the next output chunk),
    as a hand-written ``asyncio.run`` per batch would, but the loop and its clients outlive the
    task. No second thread: measured, handing the GIL between a loop thread and the task
    thread cost about a sixth of the throughput of CPU-bound lookups.
    """

    def __init__(self) -> None:
        self.loop = new_loop()
        self.functions: dict[str, FunctionAdapter] = {}
        atexit.register(self.shutdown)

    def function(self, token: str, function: Any) -> FunctionAdapter:
        """The process's instance of ``function`` (one per ``token``), opened once in the loop."""
        adapter = self.functions.get(token)
        if adapter is None:
            adapter = adapt_function(function)
            if adapter.open is not None:
                self.loop.run_until_complete(_awaited(adapter.open()))
            self.functions[token] = adapter
        return adapter

    def shutdown(self) -> None:
        async def close_all() -> None:
            for adapter in self.functions.values():
                if adapter.close is not None:
                    try:
                        await adapter.close()
                    except Exception:
                        log.warning("closing %s failed", adapter.name, exc_info=True)

        if self.loop.is_closed() or self.loop.is_running():
            return
        with contextlib.suppress(Exception):  # best effort at process exit
            self.loop.run_until_complete(asyncio.wait_for(close_all(), 10))
        self.loop.close()


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


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


def worker_loop() -> _WorkerLoop:
    global _WORKER
    if _WORKER is None:
        _WORKER = _WorkerLoop()
    return _WORKER


def shared(adapter: FunctionAdapter) -> FunctionAdapter:
    """The adapter without open/close: the process owns those, not the task."""
    return FunctionAdapter(
        name=adapter.name,
        call=adapter.call,
        to_results=adapter.to_results,
        call_batch=adapter.call_batch,
        fallback=adapter.fallback,
        eager=adapter.eager,
    )


def drive(loop: asyncio.AbstractEventLoop, outputs: Any) -> Generator[list[Any], None, None]:
    """The chunks of an operator's ``process_batches``, the caller's thread driving ``loop``.
    Close it (``contextlib.closing``) to close the operator's run in the loop, also early."""
    try:
        while True:
            try:
                yield loop.run_until_complete(outputs.__anext__())
            except StopAsyncIteration:
                return
    finally:
        loop.run_until_complete(outputs.aclose())

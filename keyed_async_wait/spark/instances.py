"""The function instances a worker process keeps: one per token, opened once in its loop.

Every DataFrame call (``key_ordered_wait`` and the others) makes a plan with a token of its own,
so a driver that makes such a call again and again (a notebook cell run again, a job an hour in
one long session) would leave, in every worker process, one open instance per call: its
clients, connection pools and sockets. So the instances of plans whose tasks have finished are
closed, least recently used first, once more than :data:`KEEP` of them are held. Instances no
task has acquired (the SQL functions', whose tokens are derived from their spec and are few) are
kept for the life of the process.

Invariant: an instance is never closed while a task holds it (between :meth:`acquire` and
:meth:`release`); a task that comes back for a closed one gets a new one, opened again.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ..runtime.backend import FunctionAdapter, adapt_function

__all__ = ["KEEP", "Instances"]

log = logging.getLogger(__name__)

KEEP = 8  # instances of finished plans kept open (each may hold a connection pool)


class Instances:
    """The instances of one worker process (see the module doc)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._held: dict[str, FunctionAdapter] = {}  # least recently used first
        self._tasks: dict[str, int] = {}  # token -> tasks holding it (tokens tasks acquire)

    def function(self, token: str, function: Any) -> FunctionAdapter:
        """The instance for ``token``, made and opened on first use."""
        adapter = self._held.pop(token, None)
        if adapter is None:
            adapter = adapt_function(function)
            if adapter.open is not None:
                self.loop.run_until_complete(_awaited(adapter.open()))
        self._held[token] = adapter
        return adapter

    def acquire(self, token: str, function: Any) -> FunctionAdapter:
        """:meth:`function`, held by a task until it calls :meth:`release`."""
        adapter = self.function(token, function)
        self._tasks[token] = self._tasks.get(token, 0) + 1
        self._close_idle()
        return adapter

    def release(self, token: str) -> None:
        self._tasks[token] -= 1

    def _close_idle(self) -> None:
        idle = [t for t in self._held if self._tasks.get(t, -1) == 0]
        for token in idle[: max(0, len(idle) - KEEP)]:
            del self._tasks[token]
            self.loop.run_until_complete(_close(self._held.pop(token)))

    def held(self) -> list[FunctionAdapter]:
        """Every instance held, least recently used first."""
        return list(self._held.values())

    async def close_all(self) -> None:
        """Close every instance held (the worker process is ending)."""
        for adapter in self.held():
            await _close(adapter)


async def _close(adapter: FunctionAdapter) -> None:
    """Close ``adapter``'s instance; a failure is logged, not raised (nothing waits on it)."""
    if adapter.close is not None:
        try:
            await adapter.close()
        except Exception:
            log.warning("closing %s failed", adapter.name, exc_info=True)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable

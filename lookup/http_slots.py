"""The lean client's request slots: at most ``size`` requests under way, the rest waiting in line.

What ``asyncio.Semaphore`` does for the client, with a fast path a request can test and take in
two attribute reads: the client asks "is a slot free?" before every request, and the
semaphore's ``locked()`` builds a generator over its waiters each time (measured: 2% of a
worker's CPU on per-row lookups, with the ``acquire`` and ``release`` around it).

Invariants:

- ``free + held == size``, where ``held`` counts the takers that have not given their slot
  back; a waiter that was handed a slot holds it, even when it is cancelled before it runs
  (it then gives it to the next).
- ``free > 0`` only while nobody waits: a slot given back goes to the first waiter still
  waiting, so a newcomer's ``take_now`` never overtakes the line (first come, first served).

What it does not do: check that every ``give`` matches a ``take`` (as ``asyncio.Semaphore``,
unlike ``BoundedSemaphore``: the client gives back only what it took, in a ``finally``), or
serve more than one event loop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from typing import Any

__all__ = ["Slots"]


class Slots:
    """``size`` slots for one event loop; ``async with slots:`` holds one for the block."""

    __slots__ = ("_waiters", "free")

    def __init__(self, size: int) -> None:
        self.free = size
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def take_now(self) -> bool:
        """Take a slot if one is free (then nobody waits); never suspends."""
        if self.free > 0:
            self.free -= 1
            return True
        return False

    async def take(self) -> None:
        """Take a slot, waiting in line for one if none is free."""
        if self.take_now():
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.give()  # handed a slot as it was cancelled: the next in line has it
            else:
                with contextlib.suppress(ValueError):  # a later give may have dropped it already
                    self._waiters.remove(waiter)
            raise

    def give(self) -> None:
        """Give a slot back: to the first waiter still waiting, else it is free."""
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.free += 1

    async def __aenter__(self) -> None:
        await self.take()

    async def __aexit__(self, *exc: Any) -> None:
        self.give()

    def __repr__(self) -> str:
        return f"Slots(free={self.free}, waiting={len(self._waiters)})"

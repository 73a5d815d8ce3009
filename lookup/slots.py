"""Slots for requests: an asyncio semaphore whose free case costs no coroutine.

Why: :class:`asyncio.Semaphore` asks ``locked()`` (a generator over its waiters) and runs a
coroutine even when a slot is free, a few microseconds of a lean request's CPU; here taking a
free slot is a method call.
"""

from __future__ import annotations

import asyncio
import collections

__all__ = ["Slots"]


class Slots:
    """At most ``count`` holders at a time; waiters are served first come, first served.

    Invariants: ``free`` plus the holders is always ``count``; a slot given back while somebody
    waits goes to the first waiter still waiting (never back to ``free``, so :meth:`try_take`
    cannot jump the queue); a waiter cancelled after its slot came passes the slot on, so no
    slot is lost to a cancellation.
    """

    __slots__ = ("_loop", "_waiters", "free")

    def __init__(self, count: int, loop: asyncio.AbstractEventLoop) -> None:
        self.free = count
        self._loop = loop
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def try_take(self) -> bool:
        """Take a slot if one is free and nobody waits for one."""
        if self.free > 0 and not self._waiters:
            self.free -= 1
            return True
        return False

    async def take(self) -> None:
        """Take a slot, waiting for one when none is free."""
        if self.try_take():
            return
        waiter = self._loop.create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # the slot came, then the cancellation
                self.give()
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            raise

    def give(self) -> None:
        """Give a slot back: to the first waiter still waiting, else to ``free``."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.free += 1

    async def __aenter__(self) -> None:
        await self.take()

    async def __aexit__(self, *exc: object) -> None:
        self.give()

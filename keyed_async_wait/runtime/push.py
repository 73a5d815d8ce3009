"""Driving the operator from synchronous code that is handed records one group at a time.

Spark's table functions call ``eval`` once per row and ``terminate`` once at the end; there is
no iterator to pull from. :class:`PushDriver` turns those calls into the operator's batch
source while the caller's thread drives the event loop, as the ``mapInArrow`` path does.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from .operator import KeyedAsyncWaitOperator

__all__ = ["PushDriver"]


class PushDriver:
    """Push records in, take outputs out, from one thread that owns ``loop`` (not running).

    Invariant: :meth:`push` returns once the operator has admitted every record pushed so far
    (so the records in flight never exceed the operator's capacity, and nothing waits outside
    it), and returns every output that was ready by then, without waiting for more. Records
    stay in flight between pushes; :meth:`finish` waits for all of them. Outputs come out in
    the operator's order (``process_batches`` chunks, concatenated).
    """

    def __init__(self, op: KeyedAsyncWaitOperator, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._pending: deque[list[Any]] = deque()
        self._input_done = False
        self._wake: asyncio.Future[None] | None = None  # the source waits on it for input
        self._hungry: asyncio.Future[None] = loop.create_future()  # set when all input is taken
        self._ready: list[Any] = []
        self._outputs = op.process_batches(self._source())
        self._consumer = loop.create_task(self._consume())

    async def _source(self) -> AsyncIterator[list[Any]]:
        while True:
            if self._pending:
                yield self._pending.popleft()
                continue
            if self._input_done:
                return
            _resolve(self._hungry)
            self._wake = self._loop.create_future()
            await self._wake

    async def _consume(self) -> None:
        try:
            async for chunk in self._outputs:
                self._ready.extend(chunk)
        finally:
            _resolve(self._hungry)  # a failure must not leave push() waiting

    def push(self, records: list[Any]) -> list[Any]:
        """Hand ``records`` to the operator; the outputs ready so far (raises the first failure)."""
        if self._input_done:
            raise RuntimeError("push() after finish()")
        if records:
            self._pending.append(records)
        self._hungry = self._loop.create_future()
        if self._wake is not None:
            _resolve(self._wake)
        self._loop.run_until_complete(self._hungry)
        self._raise_failure()
        return self.take()

    def finish(self) -> list[Any]:
        """No more input: wait for every record in flight; the remaining outputs."""
        self._input_done = True
        if self._wake is not None:
            _resolve(self._wake)
        self._loop.run_until_complete(asyncio.wait([self._consumer]))
        self._raise_failure()
        return self.take()

    def abort(self) -> None:
        """Stop without waiting (the caller failed): cancel the work in flight, close cleanly."""
        self._input_done = True
        if not self._consumer.done():
            self._consumer.cancel()
            self._loop.run_until_complete(asyncio.wait([self._consumer]))
        if not self._consumer.cancelled():
            self._consumer.exception()  # retrieved: the caller's own error is the one that matters
        self._loop.run_until_complete(self._outputs.aclose())

    def take(self) -> list[Any]:
        ready, self._ready = self._ready, []
        return ready

    def _raise_failure(self) -> None:
        if self._consumer.done() and not self._consumer.cancelled():
            exc = self._consumer.exception()
            if exc is not None:
                raise exc


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)

"""The convenience base of an action the operator runs per record (Flink's ``AsyncFunction``).

Any object with ``async invoke(record)`` will do, and so will a plain ``async def``: the engine
reads every action through one protocol (:mod:`keyed_async_wait.runtime.backend`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic, TypeVar

__all__ = ["AsyncFunction"]


IN = TypeVar("IN")
OUT = TypeVar("OUT")


class AsyncFunction(Generic[IN, OUT]):
    """An asynchronous action per record (Flink's ``AsyncFunction``).

    Override :meth:`invoke`; optionally :meth:`invoke_batch` (then the operator gathers ready
    records into batches), :meth:`timeout` (a fallback result instead of a timeout error),
    and :meth:`open` / :meth:`close`, which run inside the event loop that runs the actions,
    so clients belong there.
    """

    async def open(self) -> None:
        """Called once in the event loop before the first record."""

    async def close(self) -> None:
        """Called once in the event loop after the last record, also after a failure."""

    async def invoke(self, record: IN) -> Sequence[OUT] | None:
        """The results for one record: a list (empty, or None, for a miss)."""
        raise NotImplementedError(f"{type(self).__name__} must implement invoke(record)")

    #: True when :meth:`invoke` may be started eagerly: its code up to the first suspension then
    #: runs outside any task, so it must suspend (``await asyncio.sleep(0)``) before anything
    #: that needs ``asyncio.current_task()`` (``asyncio.timeout``, aiohttp requests). A call that
    #: finishes without suspending (a cache hit) then costs no task at all.
    eager_start = False

    # Optional (the backend protocol, keyed_async_wait.runtime.backend, lists every member):
    #   async def invoke_batch(self, records: list[IN]) -> list[Sequence[OUT] | BaseException]
    #   def timeout(self, record: IN) -> Sequence[OUT] | None

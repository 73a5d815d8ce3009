"""Where a run keeps the records it set aside (:mod:`keyed_async_wait.core.set_aside`): a hot
key's records past the waiting bound, until its queue runs dry and they come back.

:class:`Overflow` is what the runtime asks of such a store; :class:`MemoryOverflow`, the
operator's own, keeps them in memory (the Spark edge gives its tasks a store that spills them to
local disk, ``keyed_async_wait.spark.spill``). Either way per key the records come back in the
order they were put in.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from typing import Any, Protocol

from ..core.parking import ParkedItem

__all__ = ["MemoryOverflow", "Overflow"]


class Overflow(Protocol):
    """Records set aside, per key, first in first out. ``limit``: records it holds at most
    (None: no bound, a store on disk); at the limit the intake reads nothing more until some
    come back (back-pressure)."""

    @property
    def limit(self) -> int | None:
        """Records it holds at most (None: no bound)."""
        ...

    def put(self, items: list[tuple[Hashable, Any]]) -> None:
        """Keep ``(key, record)`` items, in this order."""
        ...

    def take(self, key: Hashable, count: int) -> list[Any]:
        """The first ``count`` records of ``key`` (fewer if it has fewer), taken out."""
        ...

    def items(self) -> list[ParkedItem]:
        """Every record still kept, taken out: key by key, each key's in order."""
        ...

    def peek(self) -> list[ParkedItem]:
        """Every record still kept, left in: key by key, each key's in order (a snapshot)."""
        ...

    def close(self) -> None:
        """Nothing more is asked: free what is held."""
        ...


class MemoryOverflow:
    """Records set aside, kept in this process's memory, ``limit`` at most (None: no bound)."""

    __slots__ = ("_keys", "limit")

    def __init__(self, limit: int | None = None) -> None:
        self._keys: dict[Hashable, deque[Any]] = {}
        self.limit = limit

    def put(self, items: list[tuple[Hashable, Any]]) -> None:
        keys = self._keys
        for key, record in items:
            queue = keys.get(key)
            if queue is None:
                keys[key] = queue = deque()
            queue.append(record)

    def take(self, key: Hashable, count: int) -> list[Any]:
        queue = self._keys.get(key)
        if not queue:
            return []
        taken = [queue.popleft() for _ in range(min(count, len(queue)))]
        if not queue:
            del self._keys[key]
        return taken

    def items(self) -> list[ParkedItem]:
        keys, self._keys = self._keys, {}
        return [ParkedItem(record, key) for key, queue in keys.items() for record in queue]

    def peek(self) -> list[ParkedItem]:
        return [ParkedItem(record, key) for key, queue in self._keys.items() for record in queue]

    def close(self) -> None:
        self._keys = {}

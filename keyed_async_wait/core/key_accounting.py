"""Key accounting (FLIP-425): at most one record per key in flight, the rest queued per key."""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["KeyAccounting"]

T = TypeVar("T")


class KeyAccounting(Generic[T]):
    """Which record of each key may run.

    Invariant: a key is *occupied* from the moment :meth:`acquire` admits an item for it until
    :meth:`release` finds no item waiting; while occupied, every further item of that key waits
    in a FIFO queue and :meth:`release` hands them on one at a time in arrival order. So two
    items of one key are never admitted together, and per key they are admitted in arrival order.
    """

    __slots__ = ("_blocked_items", "_keys")

    def __init__(self) -> None:
        # key -> None or an empty deque (occupied, nobody waiting), or a deque of waiting items;
        # a deque that empties is kept while its key is occupied: a key whose records keep
        # coming reuses it instead of making (and dropping) one per blocked record
        self._keys: dict[Hashable, deque[T] | None] = {}
        self._blocked_items = 0

    def acquire(self, key: Hashable, item: T) -> bool:
        """True if ``item`` may run now; otherwise it is queued behind its key."""
        keys = self._keys
        if key in keys:
            waiting = keys[key]
            if waiting is None:
                keys[key] = waiting = deque()
            waiting.append(item)
            self._blocked_items += 1
            return False
        keys[key] = None
        return True

    def acquire_many(self, item_keys: list[Hashable], items: list[T]) -> list[T]:
        """:meth:`acquire` for many items in order: the items that may run now."""
        keys = self._keys
        fresh = dict.fromkeys(item_keys)
        if len(fresh) == len(item_keys) and keys.keys().isdisjoint(fresh):
            keys.update(fresh)  # distinct keys, none occupied: all run, decided in C
            return list(items)
        free = []
        blocked = 0
        for key, item in zip(item_keys, items, strict=True):
            if key in keys:
                waiting = keys[key]
                if waiting is None:
                    keys[key] = waiting = deque()
                waiting.append(item)
                blocked += 1
            else:
                keys[key] = None
                free.append(item)
        self._blocked_items += blocked
        return free

    def release_many(self, keys_done: list[Hashable]) -> list[T]:
        """:meth:`release` for many keys: the items that run next."""
        keys = self._keys
        nxt: list[T] = []
        if not self._blocked_items:  # nobody waits anywhere: every key is simply free again
            for key in keys_done:
                del keys[key]
            return nxt
        for key in keys_done:
            waiting = keys[key]
            if waiting:
                nxt.append(waiting.popleft())
            else:
                del keys[key]
        self._blocked_items -= len(nxt)
        return nxt

    def release(self, key: Hashable, hold: bool = False) -> T | None:
        """The running item of ``key`` is done: the next one of the key (now running), or None.
        ``hold``: with nobody waiting the key stays occupied (its next items come back later,
        :meth:`requeue`)."""
        keys = self._keys
        waiting = keys[key]
        if waiting:
            item = waiting.popleft()
            self._blocked_items -= 1
            return item
        if not hold:
            del keys[key]
        return None

    def older(self, key: Hashable) -> list[T]:
        """Every item waiting behind ``key`` but the newest, taken out, oldest first (coalescing:
        only the newest of a run of waiting items runs)."""
        waiting = self._keys[key]
        if waiting is None or len(waiting) < 2:
            return []
        taken = [waiting.popleft() for _ in range(len(waiting) - 1)]
        self._blocked_items -= len(taken)
        return taken

    def requeue(self, key: Hashable, items: list[T]) -> None:
        """``items`` wait behind ``key``, occupied and held, in this order."""
        if not items:
            return
        waiting = self._keys[key]
        if waiting is None:
            self._keys[key] = waiting = deque()
        waiting.extend(items)
        self._blocked_items += len(items)

    def occupied(self, key: Hashable) -> bool:
        return key in self._keys

    def waiting(self, key: Hashable) -> int:
        """Items queued behind ``key`` (0 for a free key)."""
        queue = self._keys.get(key)
        return len(queue) if queue else 0

    def take(self, key: Hashable) -> list[T]:
        """Free ``key`` at once (its running item is parked): the items that waited behind it,
        in arrival order, taken out with it."""
        waiting = self._keys.pop(key)
        if not waiting:
            return []
        self._blocked_items -= len(waiting)
        return list(waiting)

    @property
    def occupied_keys(self) -> int:
        return len(self._keys)

    @property
    def blocked_keys(self) -> int:
        return sum(1 for waiting in self._keys.values() if waiting)

    @property
    def blocked_items(self) -> int:
        return self._blocked_items

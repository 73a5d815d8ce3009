"""Records set aside: a hot key's records past the waiting bound (pure bookkeeping).

In KEY_ORDERED mode a record whose key is busy waits behind it, in memory and outside the
capacity, up to ``bound`` records in all. Past the bound, a busy key's further records are set
aside instead (the runtime spills them to disk, or parks them in a stream), so a hot key never
stops the intake of the other keys, and memory stays bounded.

Invariants (property-tested through the operator):

* while a key has records set aside, every new record of that key is set aside too, so per key
  the set-aside records are the latest ones, in arrival order;
* a key whose queue in memory runs dry while it has records set aside stays occupied, and is
  due a refill (:attr:`SetAside.due`): its records come back first record first, before any
  record that arrived after them;
* records waiting in memory never exceed ``bound`` (a refill brings back at most what fits, and
  at least one record, which runs at once).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

REFILL_LEAST = 16  # records a refill brings back at least

__all__ = ["SetAside"]


class SetAside:
    """How many records of each key are set aside, and which keys are due a refill."""

    __slots__ = ("bound", "counts", "due", "total")

    def __init__(self, bound: int) -> None:
        self.bound = bound  # records that may wait in memory (0: none are ever set aside)
        self.counts: dict[Hashable, int] = {}
        self.due: deque[Hashable] = deque()  # keys whose queue ran dry: bring theirs back
        self.total = 0  # records set aside, every key's

    def add(self, key: Hashable) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1
        self.total += 1

    def holds(self, key: Hashable) -> bool:
        return key in self.counts

    def back(self, key: Hashable, count: int) -> None:
        """``count`` records of ``key`` were brought back (or moved elsewhere)."""
        left = self.counts[key] - count
        self.total -= min(count, self.counts[key])
        if left > 0:
            self.counts[key] = left
        else:
            del self.counts[key]

    def refill_size(self, blocked: int, chunk: int, room: int) -> int:
        """Records to bring back for a key whose queue ran dry: up to ``chunk``, as many as fit
        beside the ``blocked`` records waiting in memory, or up to ``REFILL_LEAST`` of the
        ``room`` left in the capacity (past the bound they take capacity): a hot key brought
        back one record at a time would pay a turn of the loop on every record. One at least:
        it runs at once."""
        fits = max(self.bound - blocked + 1, min(REFILL_LEAST, room))
        return max(1, min(chunk, fits))

    def __bool__(self) -> bool:
        return bool(self.counts)

    def __len__(self) -> int:
        return self.total

"""The active buffer (FLIP-425): records that may start, gathered for a batching action."""

from __future__ import annotations

from .entry import Entry

__all__ = ["ActiveBuffer"]


class ActiveBuffer:
    """Ready entries waiting to be sent together.

    Invariant: holds at most ``size`` entries, and at most one per key (the controller only
    puts in entries whose key it has admitted). :meth:`extend` returns the full batches to send now.
    """

    __slots__ = ("_entries", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: list[Entry] = []

    def extend(self, entries: list[Entry]) -> list[list[Entry]]:
        """Add many entries: the full batches to send now (the rest stays)."""
        pending = self._entries + entries if self._entries else entries
        size = self.size
        cut = len(pending) - len(pending) % size
        self._entries = pending[cut:]
        return [pending[i : i + size] for i in range(0, cut, size)]

    def take(self) -> list[Entry]:
        entries, self._entries = self._entries, []
        return entries

    def remove(self, entry: Entry) -> bool:
        try:
            self._entries.remove(entry)
        except ValueError:
            return False
        return True

    def __len__(self) -> int:
        return len(self._entries)

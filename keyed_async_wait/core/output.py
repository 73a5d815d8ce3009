"""Output queues: which finished entries may leave, and when.

Both queues take entries in arrival order (:meth:`add`) and hear when one finishes
(:meth:`complete`); whatever may leave is appended to the shared ``out`` deque, where the
operator hands it to the consumer. Watermark entries are always finished.
"""

from __future__ import annotations

from collections import deque

from .entry import Entry, State

__all__ = ["EpochManager", "OrderedQueue"]


class OrderedQueue:
    """ORDERED mode.

    Invariant: ``out`` receives entries in exactly the order :meth:`add` saw them; an entry
    leaves when it and every entry before it are finished.
    """

    __slots__ = ("_out", "_slots")

    def __init__(self, out: deque[Entry]) -> None:
        self._out = out
        self._slots: deque[Entry] = deque()

    def add(self, entry: Entry) -> None:
        if entry.watermark and not self._slots:
            self._out.append(entry)
        else:
            self._slots.append(entry)

    def add_records(self, entries: list[Entry]) -> None:
        """:meth:`add` for many record entries (no watermarks)."""
        self._slots.extend(entries)

    def complete(self, entry: Entry) -> None:
        slots = self._slots
        if slots and slots[0] is entry:
            out = self._out
            out.append(slots.popleft())
            while slots and slots[0].state == State.DONE:
                out.append(slots.popleft())

    def complete_many(self, entries: list[Entry]) -> None:
        """Entries already marked DONE: release whatever is now at the head."""
        slots, out = self._slots, self._out
        while slots and slots[0].state == State.DONE:
            out.append(slots.popleft())

    @property
    def held(self) -> int:
        return len(self._slots)


class _Epoch:
    __slots__ = ("first_seq", "held", "pending", "watermark")

    def __init__(self, first_seq: int) -> None:
        self.first_seq = first_seq  # records with seq >= this (up to the next epoch) belong here
        self.pending = 0  # records of this epoch not finished yet
        self.held: list[Entry] = []  # finished, waiting for an earlier epoch to close
        self.watermark: Entry | None = None  # the watermark that closed this epoch


class EpochManager:
    """UNORDERED and KEY_ORDERED modes: results leave as they finish, never across a watermark.

    Each watermark closes the open epoch and opens the next (FLIP-425). Invariants: a record of
    epoch n leaves only after the watermark closing epoch n-1 has left; that watermark leaves
    only after every record of epochs up to n-1 has left. Records of later epochs may *run*
    before a watermark leaves: only their output waits.

    An entry's epoch is found from its arrival number, so nothing is stored per entry, and
    while no watermark is pending there is a single epoch and no search at all.
    """

    __slots__ = ("_epochs", "_out")

    def __init__(self, out: deque[Entry]) -> None:
        self._out = out
        self._epochs: deque[_Epoch] = deque([_Epoch(0)])

    def add(self, entry: Entry) -> None:
        epoch = self._epochs[-1]
        if entry.watermark:
            epoch.watermark = entry
            self._epochs.append(_Epoch(entry.seq + 1))
            self._advance()
        else:
            epoch.pending += 1

    def add_records(self, entries: list[Entry]) -> None:
        """:meth:`add` for many record entries (no watermarks)."""
        self._epochs[-1].pending += len(entries)

    def _epoch_of(self, entry: Entry) -> _Epoch:
        epochs = self._epochs
        if len(epochs) == 1:
            return epochs[0]
        seq = entry.seq
        for epoch in reversed(epochs):  # few epochs are ever pending at once
            if seq >= epoch.first_seq:
                return epoch
        raise AssertionError(f"no epoch for {entry!r}")

    def complete(self, entry: Entry) -> None:
        epoch = self._epoch_of(entry)
        epoch.pending -= 1
        epochs = self._epochs
        if epoch is epochs[0]:
            self._out.append(entry)
            if epoch.pending == 0 and epoch.watermark is not None:
                self._advance()
        else:
            epoch.held.append(entry)

    def complete_many(self, entries: list[Entry]) -> None:
        epochs, out = self._epochs, self._out
        head = epochs[0]
        if len(epochs) == 1:
            head.pending -= len(entries)
            out.extend(entries)
            return
        for entry in entries:
            epoch = self._epoch_of(entry)
            epoch.pending -= 1
            if epoch is head:
                out.append(entry)
            else:
                epoch.held.append(entry)
        if head.pending == 0 and head.watermark is not None:
            self._advance()

    def _advance(self) -> None:
        epochs, out = self._epochs, self._out
        while epochs[0].pending == 0 and epochs[0].watermark is not None:
            out.append(epochs.popleft().watermark)  # type: ignore[arg-type]
            head = epochs[0]
            if head.held:
                out.extend(head.held)
                head.held = []

    @property
    def held(self) -> int:
        return sum(len(e.held) for e in self._epochs)

    @property
    def pending_watermarks(self) -> int:
        return len(self._epochs) - 1

"""The KEY_ORDERED part of the controller (:class:`~.controller.Controller` is one): records
past the waiting bound set aside and brought back, a key's next record released, the older
records of a key superseded by its newest (``coalesce``). Pure: it decides, never waits.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from typing import Any

from .entry import Entry, State
from .key_accounting import KeyAccounting
from .output import EpochManager, OrderedQueue
from .parking import ParkedItem, ParkedKeys
from .set_aside import SetAside

__all__ = ["KeyedControl"]


class KeyedControl:
    """The controller's keyed decisions (its state is the controller's)."""

    __slots__ = (
        "_keys",
        "_live",
        "_output",
        "_seq",
        "aside",
        "aside_parked",
        "coalesce",
        "parked",
        "plain_output",
        "records_inside",
        "set_aside",
        "superseded",
    )

    _keys: KeyAccounting[Entry] | None
    _live: dict[int, Entry]
    _output: OrderedQueue | EpochManager
    _seq: int
    aside: SetAside
    aside_parked: deque[Hashable]
    coalesce: bool
    parked: ParkedKeys
    plain_output: bool
    records_inside: int
    set_aside: list[tuple[Hashable, Any]]
    superseded: list[Entry]

    def _within_bound(self, records: list[Any], keys: list[Hashable]) -> tuple[list[Any], list[Hashable]]:
        """The records that may be admitted and their keys. Past the waiting bound, a record of
        a hot key (one with twice the records waiting that the other keys have on average) is
        set aside, as is every later record of a key with records set aside or parked; other
        records are admitted, and what waits past the bound takes capacity (the intake slows
        down instead: with keys alike, setting aside would only move every key's records to
        disk and back)."""
        accounting, aside = self._keys, self.aside
        assert accounting is not None
        blocked, bound = accounting.blocked_items, aside.bound
        started: set[Hashable] = set()
        kept: list[Any] = []
        kept_keys: list[Hashable] = []
        for record, key in zip(records, keys, strict=True):
            busy = key in started or accounting.occupied(key)
            hot = busy and blocked >= bound and _hot(accounting, key, blocked)
            if aside.holds(key) or key in self.parked or hot:
                self._put_aside(key, record)
                continue
            if busy:
                blocked += 1
            else:
                started.add(key)
            kept.append(record)
            kept_keys.append(key)
        return kept, kept_keys

    def _full(self, key: Hashable) -> bool:
        """Whether a record of ``key`` would have to wait with no room left behind busy keys."""
        accounting = self._keys
        return (
            accounting is not None
            and bool(self.aside.bound)
            and accounting.occupied(key)
            and accounting.blocked_items >= self.aside.bound
        )

    def _put_aside(self, key: Hashable, record: Any) -> None:
        if self.parked.spill is not None:  # parked records leave at once: parked as keyed state
            self.parked.park([ParkedItem(record, key)])
            self.plain_output = False
        else:
            self.aside.add(key)
            self.set_aside.append((key, record))

    def take_set_aside(self) -> list[tuple[Hashable, Any]]:
        """The records set aside since the last call, ``(key, record)`` in arrival order."""
        items, self.set_aside = self.set_aside, []
        return items

    def refill(self, key: Hashable, records: list[Any]) -> Entry:
        """``records`` of ``key`` (the first ones set aside, in order), back from where they were
        set aside: the first, READY, runs now; the rest wait behind it."""
        accounting = self._keys
        assert accounting is not None and records
        self.aside.back(key, len(records))
        seq = self._seq
        entries = [Entry(seq + i, record, key) for i, record in enumerate(records)]
        self._seq = seq + len(entries)
        self._live.update((entry.seq, entry) for entry in entries)
        self.records_inside += len(entries)
        self._output.add_records(entries)
        accounting.requeue(key, entries[1:])
        entries[0].state = State.READY
        return entries[0]

    def park_set_aside(self, key: Hashable, records: list[Any]) -> None:
        """``records`` of a parked key, back from where they were set aside: parked behind it."""
        self.aside.back(key, len(records))
        self.parked.park([ParkedItem(record, key) for record in records])

    def _release(self, key: Hashable) -> Entry | None:
        """The next entry of ``key`` to run, or None; a key with records set aside stays held
        when its queue runs dry, and is due a refill."""
        assert self._keys is not None
        if self.coalesce:
            older = self._keys.older(key)
            if older:
                self._supersede(older)
        if not self.aside.holds(key):
            return self._keys.release(key)
        nxt = self._keys.release(key, hold=True)
        if nxt is None:
            self.aside.due.append(key)
        return nxt

    def _supersede(self, entries: list[Entry]) -> None:
        for entry in entries:
            entry.state = State.DONE
        self._output.complete_many(entries)
        self.superseded += entries

    def release_early(self, entry: Entry) -> Entry | None:
        """KEY_ORDERED: ``entry``, still running, lets the next entry of its key start (its
        function reached the point after which order does not matter); that entry, now READY,
        or None. The key is released once per entry: :meth:`finish` then releases nothing."""
        keys = self._keys
        if keys is None or entry.released or entry.state == State.DONE:
            return None
        entry.released = True
        nxt = self._release(entry.key)
        if nxt is not None:
            nxt.state = State.READY
        return nxt


def _hot(accounting: KeyAccounting[Entry], key: Hashable, blocked: int) -> bool:
    """Whether ``key`` has at least twice as many records waiting as the other occupied keys
    have on average (and two at least)."""
    waiting = accounting.waiting(key)
    others = (blocked - waiting) / max(1, accounting.occupied_keys - 1)
    return waiting >= max(2.0, 2.0 * others)

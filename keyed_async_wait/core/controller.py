"""The async execution controller (FLIP-425's AEC), without any I/O.

It decides; the asyncio layer in :mod:`keyed_async_wait.runtime.operator` acts on its decisions.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from itertools import repeat
from typing import Any

from .elements import OutputMode, Watermark
from .entry import Entry, State
from .key_accounting import KeyAccounting
from .keyed_control import KeyedControl
from .keys import KeySelector, keys_of_many
from .output import EpochManager, OrderedQueue
from .parking import FRESH, PARKED, ParkedItem, ParkedKeys, ParkInfo
from .set_aside import SetAside

__all__ = ["Controller"]


class Controller(KeyedControl):
    """Admits records and watermarks, and says which entry may start and which may leave.

    Invariants (checked by the property tests):

    * every admitted entry reaches ``out`` exactly once, and leaves the controller only through
      :meth:`hand_out`; ``records_inside`` counts records admitted and not yet handed out;
    * KEY_ORDERED: at most one entry per key is past BLOCKED and not yet DONE, and per key entries
      start in arrival order (see :class:`KeyAccounting`);
    * ORDERED: ``out`` order is arrival order; UNORDERED / KEY_ORDERED: never across a watermark
      (see :class:`EpochManager`);
    * ``plain_output`` stays True while every entry that leaves is a finished record with a
      result list: no watermark came in, no record failed or was parked (the batch consumer's
      fast path);
    * KEY_ORDERED with ``coalesce``: a key's records still start in arrival order, but of those
      that waited behind one run only the newest runs; the older are done, superseded, and leave
      before it (:attr:`superseded`);
    * KEY_ORDERED with a ``blocked_bound``: past it a hot key's records are set aside
      (:mod:`.set_aside`: listed in :attr:`set_aside` for the runtime to spill, or parked when
      parked records leave at once) and come back, in order, when the key's queue runs dry
      (:meth:`refill`); other records still wait in memory, and the runtime counts those past
      the bound against its capacity (see :class:`.keyed_control.KeyedControl`).
    """

    __slots__ = ("_key_of", "held_back", "mode", "out")  # and the keyed part's

    def __init__(
        self,
        mode: OutputMode,
        key_of: KeySelector | None,
        spill: list[ParkedItem] | None = None,
        blocked_bound: int = 0,
        coalesce: bool = False,
    ) -> None:
        self.mode = mode
        self._key_of = key_of
        self.out: deque[Entry] = deque()
        self._output = OrderedQueue(self.out) if mode is OutputMode.ORDERED else EpochManager(self.out)
        self._keys: KeyAccounting[Entry] | None = KeyAccounting() if mode is OutputMode.KEY_ORDERED else None
        self._live: dict[int, Entry] = {}
        self._seq = 0
        self.records_inside = 0
        self.parked = ParkedKeys(spill)
        self.plain_output = True
        self.aside = SetAside(blocked_bound if self._keys is not None else 0)
        self.set_aside: list[tuple[Hashable, Any]] = []  # for the runtime to spill (take_set_aside)
        self.aside_parked: deque[Hashable] = deque()  # parked keys whose set-aside records follow
        self.held_back: list[Any] = []  # from a watermark on: admitted once nothing is set aside
        # KEY_ORDERED: when a key's record finishes, only the newest of those waiting behind it
        # runs; the older ones are done at once, superseded (the runtime gives their results)
        self.coalesce = coalesce and self._keys is not None
        self.superseded: list[Entry] = []

    def admit_parked(self, item: ParkedItem, now: float) -> Entry | None:
        """Take in a record replayed from parked state: it stays parked while its key is, or
        while it is not due (``now``: wall-clock seconds); else as :meth:`admit_restored`."""
        if self.parked.take_if_parked(item.key, item.record, item.info):
            self.plain_output = False
            return None
        if not item.info.due(now) or self._full(item.key):
            self.parked.park([item])  # not due, or no room behind its busy key: parked again
            self.plain_output = False
            return None
        entry = Entry(self._seq, item.record, item.key)
        entry.meta = item.info
        return self._admit(entry)

    def park(self, entry: Entry, info: ParkInfo) -> list[Entry]:
        """KEY_ORDERED: park ``entry`` (it ran, or was deferred) and every record waiting behind
        its key. They leave through ``out`` marked PARKED (no output; their places are freed
        when handed out), and later records of the key are parked as they arrive."""
        assert self._keys is not None, "parking needs KEY_ORDERED"
        behind = self._keys.take(entry.key)
        if self.aside.holds(entry.key):
            self.aside_parked.append(entry.key)  # its set-aside records join the parked queue
        self.parked.park(
            [ParkedItem(entry.record, entry.key, info)]
            + [ParkedItem(e.record, e.key, e.meta or FRESH) for e in behind]
        )
        entries = [entry, *behind]
        self.plain_output = False
        for e in entries:
            e.state = State.DONE
            e.failure = PARKED
            e.results = []
        self._output.complete_many(entries)
        return entries

    def admit_restored(self, record: Any, key: Hashable, results: list[Any] | None) -> Entry | None:
        """Take in a record from a snapshot; with ``results`` it needs no new invocation."""
        if self.parked.take_if_parked(key, record):
            return None
        entry = Entry(self._seq, record, key)
        entry.preset = results
        return self._admit(entry)

    def _admit(self, entry: Entry) -> Entry | None:
        self._seq += 1
        self._live[entry.seq] = entry
        self.records_inside += 1
        self._output.add(entry)
        keys = self._keys
        if keys is None or keys.acquire(entry.key, entry):
            entry.state = State.READY
            return entry
        return None

    def admit_many(self, elements: list[Any]) -> list[Entry]:
        """Take in records and watermarks in order: the entries that may start now.

        The same decisions as admitting each record and :meth:`admit_watermark` one by one, made per run
        of records between watermarks. A watermark that comes while records are set aside stops
        the admission: it and what follows it are left in :attr:`held_back`.
        """
        ready: list[Entry] = []
        start = 0
        for i, element in enumerate(elements):
            if type(element) is Watermark:
                ready += self._admit_records(elements[start:i])
                if self.aside:  # a watermark never overtakes a record set aside before it
                    self.held_back = elements[i:]
                    return ready
                self.admit_watermark(element)
                start = i + 1
        ready += self._admit_records(elements[start:] if start else elements)
        return ready

    def _admit_records(self, records: list[Any]) -> list[Entry]:
        if not records:
            return []
        key_of, seq = self._key_of, self._seq
        keys: list[Hashable] = keys_of_many(key_of, records) if key_of else [None] * len(records)
        if self.parked:  # records of parked keys join their queues instead
            take = self.parked.take_if_parked
            kept = [(r, k) for r, k in zip(records, keys, strict=True) if not take(k, r)]
            if len(kept) != len(records):
                self.plain_output = False
            records, keys = [r for r, _ in kept], [k for _, k in kept]
            if not records:
                return []
        bound = self.aside.bound
        if bound and (self.aside or self._keys.blocked_items + len(records) > bound):  # type: ignore[union-attr]
            records, keys = self._within_bound(records, keys)
            if not records:
                return []
        # without key accounting every record may start at once
        state = State.READY if self._keys is None else State.BLOCKED
        entries = list(map(Entry, range(seq, seq + len(records)), records, keys, repeat(state)))
        self._seq = seq + len(entries)
        self._live.update(zip(range(seq, seq + len(entries)), entries, strict=True))
        self.records_inside += len(entries)
        self._output.add_records(entries)
        if self._keys is None:
            return entries
        ready = self._keys.acquire_many(keys, entries)
        for entry in ready:
            entry.state = State.READY
        return ready

    def admit_watermark(self, watermark: Watermark) -> None:
        self.plain_output = False
        entry = Entry.for_watermark(self._seq, watermark)
        self._seq += 1
        self._live[entry.seq] = entry
        self._output.add(entry)

    def finish(self, entry: Entry) -> Entry | None:
        """``entry`` has its results or failure: the next entry of its key, now READY, or None."""
        entry.state = State.DONE
        if entry.failure is not None:
            self.plain_output = False
        self._output.complete(entry)
        if self._keys is None or entry.released:
            return None
        nxt = self._release(entry.key)
        if nxt is not None:
            nxt.state = State.READY
        return nxt

    def finish_many(self, entries: list[Entry], marked: bool = False) -> list[Entry]:
        """:meth:`finish` for many entries: the next entries of their keys, now READY.

        ``marked``: the caller already set every entry's state to DONE.
        """
        if not marked:
            for entry in entries:
                entry.state = State.DONE
        self._output.complete_many(entries)
        if self._keys is None:
            return []
        if self.aside or self.coalesce:  # a key may be held or coalesced: one by one
            held = [self._release(entry.key) for entry in entries if not entry.released]
            ready = [entry for entry in held if entry is not None]
        else:
            ready = self._keys.release_many([entry.key for entry in entries if not entry.released])
        for entry in ready:
            entry.state = State.READY
        return ready

    def hand_out_many(self, entries: list[Entry], records_only: bool = False) -> int:
        """:meth:`hand_out` for many entries; returns how many were records.

        ``records_only``: the caller knows no watermark is among them.
        """
        live = self._live
        if records_only:
            for entry in entries:
                del live[entry.seq]
            self.records_inside -= len(entries)
            return len(entries)
        records = 0
        for entry in entries:
            del live[entry.seq]
            if not entry.watermark:
                records += 1
        self.records_inside -= records
        return records

    def hand_out(self, entry: Entry) -> None:
        """``entry`` has left the operator (all its results were taken)."""
        del self._live[entry.seq]
        if not entry.watermark:
            self.records_inside -= 1

    def live_entries(self) -> list[Entry]:
        """Every entry not yet handed out, in arrival order."""
        return list(self._live.values())

    @property
    def blocked_keys(self) -> int:
        return self._keys.blocked_keys if self._keys is not None else 0

    @property
    def blocked_records(self) -> int:
        return self._keys.blocked_items if self._keys is not None else 0

    @property
    def held_by_watermark(self) -> int:
        out = self._output
        return out.held if isinstance(out, EpochManager) else 0

    @property
    def pending_watermarks(self) -> int:
        return sum(1 for e in self._live.values() if e.watermark)

    @property
    def idle(self) -> bool:
        return not self._live

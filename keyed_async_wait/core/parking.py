"""Parked records: held back, per key and in arrival order, for a later run (FLIP-455, FLIP-519).

A record is *parked* when a run stops starting work (a time cap, :meth:`hold`) before it
finished, or when its retries are exhausted under the ``defer`` error policy. Its key is parked
with it: every later record of that key joins the same queue instead of running, so per key the
order stays the arrival order. The queues are plain data; the Spark layer writes them as keyed
state and replays them, per key, before new records of those keys.

Pure decisions, no I/O: :class:`DeferPolicy` says when a deferred record may try again and when
it has waited too long; :class:`ParkedKeys` keeps the queues.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from .exceptions import ConfigError

__all__ = ["PARKED", "DeferPolicy", "ParkInfo", "ParkedBatch", "ParkedItem", "ParkedKeys"]


class _Parked:
    """The ``failure`` mark of an entry that left the operator parked (it produces no output)."""

    def __repr__(self) -> str:
        return "PARKED"


PARKED = _Parked()


@dataclass(frozen=True, slots=True)
class ParkInfo:
    """What a parked record carries into the next run.

    ``attempts``: attempts made in earlier runs; ``deferrals``: how often it was deferred;
    ``next_try``: wall-clock seconds before which it must not run (None: at once);
    ``deferred_since``: when it was first deferred (for the maximum age); ``error``: the last
    error, ``"Type: message"``.
    """

    attempts: int = 0
    deferrals: int = 0
    next_try: float | None = None
    deferred_since: float | None = None
    error: str | None = None

    def due(self, now: float) -> bool:
        return self.next_try is None or self.next_try <= now


FRESH = ParkInfo()


@dataclass(frozen=True, slots=True)
class ParkedItem:
    record: Any
    key: Hashable
    info: ParkInfo = FRESH


@dataclass(frozen=True)
class DeferPolicy:
    """When a deferred record may try again: ``delay`` after its first deferral, then growing by
    ``multiplier`` up to ``max_delay``; after ``max_age`` seconds of deferral (None: never) it
    becomes an error-output row instead."""

    delay: float = 5.0
    max_delay: float = 300.0
    multiplier: float = 2.0
    max_age: float | None = None
    clock: Callable[[], float] = field(default=time.time, repr=False, compare=False)  # wall clock

    def __post_init__(self) -> None:
        for name in ("delay", "max_delay"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"defer {name}", getattr(self, name), "seconds > 0")
        if self.multiplier < 1:
            raise ConfigError("defer multiplier", self.multiplier, "a number >= 1")
        if self.max_age is not None and not self.max_age > 0:
            raise ConfigError("max_defer_age", self.max_age, "seconds > 0, or None (no limit)")

    def defer(self, info: ParkInfo, now: float, attempts: int, error: str) -> ParkInfo:
        """``info`` after one more deferral at wall-clock ``now`` (``attempts`` made this run)."""
        wait = min(self.max_delay, self.delay * self.multiplier**info.deferrals)
        return replace(
            info,
            attempts=info.attempts + attempts,
            deferrals=info.deferrals + 1,
            next_try=now + wait,
            deferred_since=info.deferred_since if info.deferred_since is not None else now,
            error=error,
        )

    def expired(self, info: ParkInfo, now: float) -> bool:
        return (
            self.max_age is not None
            and info.deferred_since is not None
            and now - info.deferred_since >= self.max_age
        )


class ParkedBatch(list[ParkedItem]):
    """A chunk of a source that holds parked records to replay (:class:`ParkedItem` s, in their
    order), not new records: an operator's source may mix these with plain chunks."""


class ParkedKeys:
    """Per key, the parked records in arrival order.

    Invariant: once a key has a queue here, every later record of the key is appended to it
    (:meth:`take_if_parked`), so nothing of that key runs until the whole queue is replayed in
    a later run, first record first.

    With a ``spill`` list, the queues are not kept: each parked record goes to ``spill`` the
    moment it is parked (for the caller to write out at once, so memory stays bounded), and
    only the parked keys are remembered. The per-key order is then the order of ``spill``.
    """

    __slots__ = ("_keys", "_records", "spill")

    def __init__(self, spill: list[ParkedItem] | None = None) -> None:
        self._keys: dict[Hashable, list[ParkedItem]] = {}
        self._records = 0
        self.spill = spill

    def park(self, items: list[ParkedItem]) -> None:
        """Append ``items`` (in arrival order) to their keys' queues."""
        keys, spill = self._keys, self.spill
        for item in items:
            queue = keys.get(item.key)
            if queue is None:
                keys[item.key] = queue = []
            if spill is None:
                queue.append(item)
        if spill is not None:
            spill.extend(items)
        self._records += len(items)

    def take_if_parked(self, key: Hashable, record: Any, info: ParkInfo = FRESH) -> bool:
        """Park ``record`` behind its key if the key is parked; False if it is not."""
        queue = self._keys.get(key)
        if queue is None:
            return False
        item = ParkedItem(record, key, info)
        if self.spill is None:
            queue.append(item)
        else:
            self.spill.append(item)
        self._records += 1
        return True

    def __contains__(self, key: Hashable) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return self._records

    def __bool__(self) -> bool:
        return bool(self._keys)

    @property
    def keys(self) -> int:
        return len(self._keys)

    def items(self) -> Iterator[ParkedItem]:
        """Every parked record not spilled, key by key, each key's in arrival order."""
        for queue in self._keys.values():
            yield from queue

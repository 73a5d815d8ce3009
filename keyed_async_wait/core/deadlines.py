"""A timer wheel for per-record timeouts: one event-loop timer per time bucket, not per record.

Arming or disarming a record is a set add or discard (a batch's records: one set update); the
loop gets one ``call_at`` for each bucket that has records in it. A timeout fires at most one
``resolution`` late (the operator uses 1% of the timeout, at most 50 ms).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable
from typing import Any

__all__ = ["Deadlines"]


class Deadlines:
    """Records grouped by the bucket their deadline falls in.

    Invariant: every armed record is in exactly one bucket, the one ``bucket_of(deadline)``
    names, and every non-empty bucket has a scheduled wake-up at its end.
    """

    __slots__ = ("_buckets", "_handles", "_on_expired", "_resolution", "_schedule")

    def __init__(
        self,
        resolution: float,
        schedule: Callable[[float, Callable[[int], None], int], Any],
        on_expired: Callable[[Any], None],
    ) -> None:
        self._resolution = resolution
        self._schedule = schedule  # (when, callback, bucket) -> cancellable handle
        self._on_expired = on_expired
        self._buckets: dict[int, set[Hashable]] = {}
        self._handles: dict[int, Any] = {}

    def bucket_of(self, deadline: float) -> int:
        return math.ceil(deadline / self._resolution)

    def arm(self, item: Hashable, deadline: float) -> int:
        """Watch ``item`` until ``deadline``; returns the bucket to pass to :meth:`disarm`."""
        bucket = math.ceil(deadline / self._resolution)  # bucket_of, inline (once per call)
        members = self._buckets.get(bucket)
        if members is None:
            members = self._members(bucket)
        members.add(item)
        return bucket

    def arm_many(self, items: Iterable[Hashable], deadline: float) -> int:
        """:meth:`arm` for many items with one deadline (a batch started together)."""
        bucket = self.bucket_of(deadline)
        self._members(bucket).update(items)
        self._drop_if_empty(bucket)  # nothing armed: no wake-up for an empty bucket
        return bucket

    def disarm(self, item: Hashable, bucket: int) -> None:
        members = self._buckets.get(bucket)
        if members is not None:
            members.discard(item)
            if not members:  # inline: once per call of a record's path, not a method call more
                del self._buckets[bucket]
                self._handles.pop(bucket).cancel()

    def disarm_many(self, items: Iterable[Hashable], bucket: int) -> None:
        """:meth:`disarm` for many items of one bucket."""
        members = self._buckets.get(bucket)
        if members is not None:
            members.difference_update(items)
            self._drop_if_empty(bucket)

    def _members(self, bucket: int) -> set[Hashable]:
        """The bucket's set, made (with its wake-up) when it is new."""
        members = self._buckets.get(bucket)
        if members is None:
            members = self._buckets[bucket] = set()
            self._handles[bucket] = self._schedule(bucket * self._resolution, self._fire, bucket)
        return members

    def _drop_if_empty(self, bucket: int) -> None:
        if not self._buckets[bucket]:
            del self._buckets[bucket]
            self._handles.pop(bucket).cancel()

    def _fire(self, bucket: int) -> None:
        self._handles.pop(bucket, None)
        members = self._buckets.pop(bucket, ())
        for item in members:
            self._on_expired(item)

    def close(self) -> None:
        for handle in self._handles.values():
            handle.cancel()
        self._handles.clear()
        self._buckets.clear()

    def __len__(self) -> int:
        return sum(len(m) for m in self._buckets.values())

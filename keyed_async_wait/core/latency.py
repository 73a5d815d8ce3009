"""A latency histogram of fixed size: percentiles of any number of records in 217 counters.

Buckets grow by 2**(1/8) (about 9%) from 100 µs to about 3 h, so a percentile read from it is
at most one bucket (9%) above the true value, and a task of a billion records costs the same
memory as one of ten. Histograms of many tasks merge by adding their counts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Final

__all__ = ["LatencyHistogram"]

_LOWEST: Final = 1e-4  # seconds: bucket 0 holds everything up to here
_STEPS_PER_DOUBLING: Final = 8
_BUCKETS: Final = 1 + 27 * _STEPS_PER_DOUBLING  # up to 1e-4 * 2**27 s (about 3.7 h), then overflow


class LatencyHistogram:
    """Counts of latencies (seconds) per bucket; ``counts[i]`` holds values up to :meth:`bound` (i)."""

    __slots__ = ("counts",)

    SIZE: Final = _BUCKETS + 1  # the last counter holds everything above the highest bound

    def __init__(self, counts: Sequence[int] | None = None) -> None:
        if counts is not None and len(counts) != self.SIZE:
            raise ValueError(f"a latency histogram has {self.SIZE} counters, got {len(counts)}")
        self.counts: list[int] = list(counts) if counts is not None else [0] * self.SIZE

    @staticmethod
    def bucket(seconds: float) -> int:
        if seconds <= _LOWEST:
            return 0
        index = math.ceil(math.log2(seconds / _LOWEST) * _STEPS_PER_DOUBLING - 1e-9)
        return index if index < _BUCKETS else _BUCKETS

    @staticmethod
    def bound(index: int) -> float:
        """The largest latency bucket ``index`` holds (inf for the overflow bucket)."""
        if index >= _BUCKETS:
            return math.inf
        return float(_LOWEST * 2 ** (index / _STEPS_PER_DOUBLING))

    def add(self, seconds: float) -> None:
        self.counts[self.bucket(seconds)] += 1

    def add_many(self, seconds: Iterable[float]) -> None:
        counts, bucket = self.counts, self.bucket
        for value in seconds:
            counts[bucket(value)] += 1

    def merge(self, other: LatencyHistogram | Sequence[int]) -> None:
        counts = other.counts if isinstance(other, LatencyHistogram) else other
        if len(counts) != self.SIZE:
            raise ValueError(f"a latency histogram has {self.SIZE} counters, got {len(counts)}")
        self.counts = [a + b for a, b in zip(self.counts, counts, strict=True)]

    def __len__(self) -> int:
        return sum(self.counts)

    def percentile(self, p: float) -> float | None:
        """The upper bound of the bucket holding the ``p``-th percentile (None when empty)."""
        total = len(self)
        if not total:
            return None
        rank, seen = total * p / 100, 0
        for index, count in enumerate(self.counts):
            seen += count
            if count and seen >= rank:
                return self.bound(index)
        return math.inf  # pragma: no cover - seen reaches total within the loop

    def __repr__(self) -> str:
        return f"LatencyHistogram(n={len(self)}, p50={self.percentile(50)}, p99={self.percentile(99)})"

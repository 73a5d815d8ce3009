"""Task counters summed on the driver: :class:`AsyncWaitMetrics` (Spark accumulators)."""

from __future__ import annotations

from typing import Any

from pyspark import AccumulatorParam, SparkContext
from pyspark.sql import SparkSession

from ..core.latency import LatencyHistogram

__all__ = ["AsyncWaitMetrics"]


class _ListAdd(AccumulatorParam):
    def zero(self, value: list[int]) -> list[int]:
        return [0] * len(value)

    def addInPlace(self, a: list[int], b: list[int]) -> list[int]:
        return [x + y for x, y in zip(a, b, strict=True)]


class _ListMax(AccumulatorParam):
    def zero(self, value: list[int]) -> list[int]:
        return [0] * len(value)

    def addInPlace(self, a: list[int], b: list[int]) -> list[int]:
        return [max(x, y) for x, y in zip(a, b, strict=True)]


class AsyncWaitMetrics:
    """Counters summed over every task, through Spark accumulators (read them on the driver
    after an action): records, rows out, attempts, retries, timeouts, failures, lookups made,
    cache hits, the peak records in flight and blocked keys of any task, and latency
    percentiles from a fixed-size histogram (:class:`LatencyHistogram`, within 9%)."""

    COUNTERS = (
        "records",
        "rows_out",
        "attempts",
        "retries",
        "timeouts",
        "failures",
        "lookups",
        "cache_hits",
        "backlog_tasks",  # tasks that ran in the backlog gear (FLIP-327), with backlog= set
        "caught_up_tasks",
    )
    PEAKS = ("peak_in_flight", "peak_blocked_keys")  # the highest any one task saw

    def __init__(self, spark: SparkSession | SparkContext) -> None:
        sc = spark.sparkContext if isinstance(spark, SparkSession) else spark
        self._counters = sc.accumulator([0] * len(self.COUNTERS), _ListAdd())
        self._histogram = sc.accumulator([0] * LatencyHistogram.SIZE, _ListAdd())
        self._peaks = sc.accumulator([0] * len(self.PEAKS), _ListMax())

    def add_task(self, *, latency: LatencyHistogram | None = None, **counts: int) -> None:
        self._counters.add([int(counts.get(name, 0)) for name in self.COUNTERS])
        if latency is not None:
            self._histogram.add(latency.counts)
        self._peaks.add([int(counts.get(name, 0)) for name in self.PEAKS])

    @property
    def value(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(zip(self.COUNTERS, self._counters.value, strict=True))
        out.update(zip(self.PEAKS, self._peaks.value, strict=True))
        histogram = LatencyHistogram(self._histogram.value)
        for p in (50, 95, 99):
            out[f"latency_p{p}_s"] = histogram.percentile(p)
        return out

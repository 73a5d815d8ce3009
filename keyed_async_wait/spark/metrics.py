"""Task counters summed on the driver: :class:`AsyncWaitMetrics` (accumulators or observed metrics)."""

from __future__ import annotations

import uuid
from typing import Any

from pyspark import AccumulatorParam, SparkContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, LongType, StructField, StructType

from ..core.exceptions import ConfigError
from ..core.latency import LatencyHistogram
from .compat import observed_progress

__all__ = ["BACKEND_COUNTERS", "TASK_COLUMN", "AsyncWaitMetrics", "is_connect", "task_struct"]


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


TASK_COLUMN = "_kaw_task"  # observed metrics: one row per task carries its counts here

# the counters a backend reports itself (its counters(), per process; a task adds its share)
BACKEND_COUNTERS = (
    "lookups",
    "cache_hits",
    "rejected_429",
    "unavailable_5xx",
    "short_circuited",
    "throttled_ms",
    "writes_applied",
    "writes_stale",
    "writes_superseded",
    "shared_cache_hits",
    "budget_waits",
    "budget_wait_ms",
    "budget_units",
)


class AsyncWaitMetrics:
    """Counters summed over every task: records, rows out, attempts, retries, timeouts,
    failures, lookups made, cache hits, the peak records in flight and blocked keys of any task,
    and latency percentiles from a fixed-size histogram (:class:`LatencyHistogram`, within 9%).
    Read :attr:`value` on the driver after an action.

    Parameters
    ----------
    spark : SparkSession or SparkContext
        The session of the waits it counts (classic or Spark Connect).
    via : {"auto", "accumulators", "observe"}
        How tasks report. ``accumulators`` (classic sessions): every task adds its counts as it
        ends, also in streaming queries; one instance may count several waits. ``observe``
        (the only way on Spark Connect, which has no accumulators): each task emits one extra
        row that Spark's observed metrics sum (:class:`pyspark.sql.Observation`) and that is
        filtered out before anything else sees it; one instance counts one wait, in a batch
        query (:attr:`value` after the action) or a streaming one (:meth:`track` the query),
        and its output columns become nullable. ``auto``: accumulators where there are
        any, else observe.

    Raises
    ------
    ConfigError
        An unknown ``via``, accumulators on Spark Connect, or an observing instance given to a
        second wait.
    """

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
        "rejected_429",  # with lookup limits: answers of 429, of 5xx, records failed at once by an
        "unavailable_5xx",  # open circuit, and milliseconds calls waited for a rate, a pause or
        "short_circuited",  # the adaptive limit
        "throttled_ms",
        "writes_applied",  # write actions (RedisWrite, HttpWrite): applied, and refused as stale
        "writes_stale",  # (the store held that version or a newer one), and skipped as superseded
        "writes_superseded",  # (coalesce=True: a newer record of the key waited)
        "set_aside",  # KEY_ORDERED: records of hot keys past blocked_capacity, spilled to local disk
        "shared_cache_hits",  # answers found in a lookup's shared cache (L2, in Redis), and
        "shared_flight_waits",  # answers another worker's call of the key brought (single flight)
        "budget_waits",  # with a job-wide Budget: asks it refused (the call waited), milliseconds
        "budget_wait_ms",  # waited for it, and cost units charged (settled by the answers)
        "budget_units",
    )
    PEAKS = ("peak_in_flight", "peak_blocked_keys")  # the highest any one task saw

    def __init__(self, spark: SparkSession | SparkContext, via: str = "auto") -> None:
        connect = is_connect(spark)
        if via not in ("auto", "accumulators", "observe"):
            raise ConfigError("via", via, "'auto', 'accumulators', 'observe'")
        if via == "accumulators" and connect:
            raise ConfigError("via", via, "'observe' or 'auto' on Spark Connect (it has no accumulators)")
        self.via = "observe" if via == "observe" or connect else "accumulators"
        self._observation: Any = None
        self._query: Any = None
        self._used = False
        self.name = f"kaw_metrics_{uuid.uuid4().hex[:12]}"
        if self.via == "accumulators":
            sc = spark.sparkContext if isinstance(spark, SparkSession) else spark
            self._counters = sc.accumulator([0] * len(self.COUNTERS), _ListAdd())
            self._histogram = sc.accumulator([0] * LatencyHistogram.SIZE, _ListAdd())
            self._peaks = sc.accumulator([0] * len(self.PEAKS), _ListMax())

    @property
    def observed(self) -> bool:
        return self.via == "observe"

    def __getstate__(self) -> dict[str, Any]:
        if self.observed:  # the tasks report through their rows; nothing of this travels
            raise TypeError("an observing AsyncWaitMetrics is not sent to the tasks")
        return self.__dict__.copy()

    def add_task(self, *, latency: LatencyHistogram | None = None, **counts: int) -> None:
        self._counters.add([int(counts.get(name, 0)) for name in self.COUNTERS])
        if latency is not None:
            self._histogram.add(latency.counts)
        self._peaks.add([int(counts.get(name, 0)) for name in self.PEAKS])

    def observe(self, df: DataFrame) -> DataFrame:
        """``df`` (a wait's output with :data:`TASK_COLUMN`) observed, and without the task rows."""
        from pyspark.sql import Observation

        if self._used:
            raise ConfigError("metrics", "an observing AsyncWaitMetrics used twice", "one per wait")
        self._used = True
        task = F.col(TASK_COLUMN)
        measures = [F.sum(task[name]).alias(name) for name in self.COUNTERS]
        measures += [F.max(task[name]).alias(name) for name in self.PEAKS]
        measures += [F.sum(task["latency"][i]).alias(f"h{i}") for i in range(LatencyHistogram.SIZE)]
        if df.isStreaming:  # per micro-batch, in the query's progress (see track())
            observed = df.observe(self.name, *measures)
        else:
            self._observation = Observation(self.name)
            observed = df.observe(self._observation, *measures)
        return observed.where(task.isNull()).drop(TASK_COLUMN)

    def track(self, query: Any) -> None:
        """Count a streaming query's micro-batches (observing metrics): :attr:`value` then sums
        what its progress reports (the last ``spark.sql.streaming.numRecentProgressUpdates``)."""
        self._query = query

    def _named(self, named: dict[str, Any]) -> dict[str, Any]:
        """A progress's observed row by measure name (Spark Connect's carries the values in the
        order of the measures, and their schema)."""
        if isinstance(named.get("values"), list) and set(named) <= {"values", "schema"}:
            names = [*self.COUNTERS, *self.PEAKS, *(f"h{i}" for i in range(LatencyHistogram.SIZE))]
            return dict(zip(names, named["values"], strict=True))
        return named

    def _observed(self) -> dict[str, Any]:
        if self._observation is not None:
            return dict(self._observation.get)
        total: dict[str, int] = {}
        seen: set[int] = set()
        for batch_id, observed in observed_progress(getattr(self._query, "recentProgress", None)):
            row = observed.get(self.name)
            if row is None or batch_id in seen:
                continue
            seen.add(batch_id)
            for key, value in self._named(row).items():
                value = int(value or 0)
                total[key] = max(total.get(key, 0), value) if key in self.PEAKS else total.get(key, 0) + value
        return total

    @property
    def value(self) -> dict[str, Any]:
        if self.observed:
            got = self._observed()
            counters = [int(got.get(name) or 0) for name in self.COUNTERS]
            peaks = [int(got.get(name) or 0) for name in self.PEAKS]
            counts = [int(got.get(f"h{i}") or 0) for i in range(LatencyHistogram.SIZE)]
        else:
            counters, peaks, counts = self._counters.value, self._peaks.value, self._histogram.value
        out: dict[str, Any] = dict(zip(self.COUNTERS, counters, strict=True))
        out.update(zip(self.PEAKS, peaks, strict=True))
        histogram = LatencyHistogram(counts)
        for p in (50, 95, 99):
            out[f"latency_p{p}_s"] = histogram.percentile(p)
        return out


def task_struct() -> StructType:
    """The type of :data:`TASK_COLUMN`."""
    fields = [StructField(name, LongType()) for name in (*AsyncWaitMetrics.COUNTERS, *AsyncWaitMetrics.PEAKS)]
    return StructType([*fields, StructField("latency", ArrayType(LongType()))])


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session (no JVM, no SparkContext, no accumulators)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")

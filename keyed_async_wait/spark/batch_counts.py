"""A micro-batch's counts (rows out, rows parked) once its sink ran, without another Spark job
where the session allows it.

- Classic: an accumulator the tasks add to (:class:`TaskCounts`), which also carries the peak
  memory a task added, and a bit per partition whose task read its input to the end. Trusted
  only when every partition's bit is set (where the partitions are known: the output of a
  repartition into them): a sink that read part of its DataFrame (a ``limit``) stops some tasks
  early and never runs others, and their parked rows would go uncounted, so unwritten.
- Spark Connect has no accumulators. Its output is observed instead (:class:`ObservedCounts`):
  the counts are computed while the sink's job builds the persisted output, and arrive with
  that job's answer. Trusted only when every partition of the output reported (a bit per
  partition): a sink that read part of its DataFrame, an empty partition, or a Spark whose
  Connect server does not send metrics observed under a cached plan (4.0) leave a hole, and
  then the counts come from a job over the persisted output, as before (on a local Connect
  server, such a job costs a 2,500-row micro-batch about 0.1 s: ``./run bench connect_stream``).
"""

from __future__ import annotations

import logging
import math
import uuid
from dataclasses import dataclass
from typing import Any

from pyspark import AccumulatorParam
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from .metrics import is_connect
from .parked import STATE_COLUMN

__all__ = ["ObservedCounts", "TaskCounts", "counted", "every_partition_read", "task_counts"]

log = logging.getLogger(__name__)

_BITS = 63  # partitions a mask covers: a long's bits, but for its sign


class TaskCounts(AccumulatorParam):
    """[new rows, replayed rows, peak KiB a task added, rows out, rows parked, partitions read
    to the end (a bit each)]: summed, except the peak (the largest) and the bits (or-ed: a task
    run again sets its bit again). Rows parked decide whether the state is written; the
    state's own counts come from its files."""

    def zero(self, value: list[int]) -> list[int]:
        return [0] * 6

    def addInPlace(self, a: list[int], b: list[int]) -> list[int]:
        return [a[0] + b[0], a[1] + b[1], max(a[2], b[2]), a[3] + b[3], a[4] + b[4], a[5] | b[5]]


def every_partition_read(read: int, partitions: int) -> bool:
    """Whether the or-ed bits of :class:`TaskCounts` hold each of ``partitions`` (and no other)."""
    return read == (1 << partitions) - 1


def task_counts(spark: Any) -> Any:
    """An accumulator for the tasks' counts, or None on Spark Connect (it has none)."""
    return None if is_connect(spark) else spark.sparkContext.accumulator([0] * 6, TaskCounts())


@dataclass(frozen=True)
class ObservedCounts:
    """Spark Connect: a micro-batch's output observed while the sink's job computes it.

    Invariant: :meth:`counts` returns counts only when every one of the output's
    ``partitions`` produced a row under the observation, so a count never misses a partition
    that ran no task (its parked rows would not be written); anything short of that gives
    None, and the caller counts with a job. What a server reports after several actions over
    the persisted output differs by version (measured, a ``limit`` and then a full read: 4.3
    reports the second action's partitions alone, which the bits catch; 4.2 the whole; 4.0
    the whole at the ``limit``, and nothing observed under a persisted plan), so the partitions
    must be known in advance: the output of a repartition into them."""

    partitions: int
    observation: Any

    @classmethod
    def made(cls, spark: Any, partitions: int) -> ObservedCounts | None:
        """An observation on a Spark Connect session (pyspark 4.0 or later), else None."""
        if not is_connect(spark):
            return None
        try:
            from pyspark.sql.connect.observation import Observation
        except ImportError:  # pyspark 3.5's Connect client observes through a JVM it lacks
            return None
        return cls(partitions, Observation(f"kaw_counts_{uuid.uuid4().hex}"))

    def on(self, df: DataFrame) -> DataFrame:
        """``df`` (the lookups' output, before it is persisted) observed."""
        state = f"`{STATE_COLUMN}`"
        pid = "spark_partition_id()"
        measures = [
            F.expr(f"count(IF({state} IS NULL, 1, NULL))").alias("out"),
            F.expr(f"count({state})").alias("parked"),
            F.expr(f"max({pid})").alias("top"),  # no partition past the masks
        ]
        for j in range(math.ceil(self.partitions / _BITS)):
            bit = f"IF({pid} DIV {_BITS} = {j}, shiftleft(1L, {pid} % {_BITS}), 0L)"
            measures.append(F.expr(f"bit_or({bit})").alias(f"p{j}"))
        return df.observe(self.observation, *measures)

    def counts(self) -> tuple[int, int] | None:
        """(rows out, rows parked), or None unless every partition reported."""
        from pyspark.errors import PySparkException

        try:
            got = dict(self.observation.get)
        except PySparkException as exc:  # no action observed it, or its metrics failed: count instead
            log.debug("key_ordered_stream: no observed counts (%s); counting with a job", exc)
            return None
        partitions = self.partitions
        if got.get("top") != partitions - 1:
            return None
        for j in range(math.ceil(partitions / _BITS)):
            bits = min(_BITS, partitions - j * _BITS)
            if got.get(f"p{j}") != (1 << bits) - 1:
                return None
        if got.get("out") is None or got.get("parked") is None:
            return None
        return int(got["out"]), int(got["parked"])


def counted(
    enriched: DataFrame, counts: Any, observed: ObservedCounts | None, partitions: int | None
) -> tuple[int, int, int]:
    """(rows out, rows parked, peak KiB a task added) of a micro-batch whose sink ran: from the
    accumulator when each of the output's ``partitions`` (None: the output's own, as planned)
    read its input to the end, or the observation, or else by counting the (persisted) output;
    the peak is known from the accumulator alone (else 0)."""
    peak_kib = 0
    if counts is not None:
        _, _, peak_kib, rows_out, reparked, read = counts.value
        partitions = enriched.rdd.getNumPartitions() if partitions is None else partitions
        if every_partition_read(read, partitions):
            return rows_out, reparked, peak_kib
        log.info("key_ordered_stream: the sink left tasks unread; counting the output with a job")
    got = observed.counts() if observed is not None else None
    if got is not None:
        return got[0], got[1], 0
    state = F.col(STATE_COLUMN)
    row = enriched.agg(
        F.count(F.when(state.isNull(), 1)).alias("out"), F.count(state).alias("parked")
    ).first()
    assert row is not None
    return int(row.out), int(row.parked), peak_kib

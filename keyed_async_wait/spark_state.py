"""Rescale-safe streaming on Spark: unfinished records kept as keyed state across micro-batches.

    stream = AsyncDataStream.key_ordered_stream(orders, users, key="order_id", order_by="seq",
                                                sink=write_batch, checkpoint_location=path,
                                                time_cap=5.0, on_error="defer")
    query = stream.start(processingTime="2 seconds")

Each micro-batch (``foreachBatch``):

1. reads the parked rows the previous micro-batch left (version ``< batch_id``), unions them
   with the new rows, repartitions by the key and sorts: per key, parked rows first, in order;
2. runs the key-ordered operator per partition (``mapInArrow``) with the time cap and the error
   policy; rows that do not finish, and every later row of their keys, come out parked;
3. hands the finished rows to ``sink(df, batch_id)`` and writes the parked rows as version
   ``batch_id`` under ``<checkpoint>/async_state/`` (parquet through Spark, so any filesystem
   Spark supports), then drops versions older than the last ``keep_versions``.

A re-run of a batch id (after a crash) reads the same earlier version again and overwrites its
own, so it is idempotent given an idempotent sink (one that overwrites per batch id). Parked
rows carry their key group (the core's stable hash), but no partitioning is stored: every
micro-batch repartitions parked and new rows together by key, so a restart with another
``spark.sql.shuffle.partitions``, other executors or another source partitioning keeps each key
whole and in order.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import DoubleType, IntegerType, LongType, StringType, StructField, StructType

from .exceptions import ConfigError
from .parking import DeferPolicy
from .spark_parking import STATE_COLUMN, STATE_FIELDS, ParkingPlan, run_parking_partition

__all__ = ["BatchReport", "KeyedStream", "ParkedState"]

_TYPES = {"long": LongType(), "int": IntegerType(), "double": DoubleType(), "string": StringType()}
STATE_STRUCT = StructType([StructField(name, _TYPES[kind], True) for name, kind in STATE_FIELDS])
_TICK = "_kaw_tick"


class ParkedState:
    """Versions of the parked rows, one per micro-batch id, under ``location``.

    A version is committed when its directory holds ``_SUCCESS`` (Spark's commit marker, or ours
    for an empty version, which also holds ``_EMPTY`` and no data).
    """

    def __init__(self, spark: SparkSession, location: str, keep: int = 3) -> None:
        if keep < 1:
            raise ConfigError("keep_versions", keep, "an integer >= 1")
        self.spark = spark
        self.location = location.rstrip("/")
        self.keep = keep
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        self._Path = jvm.org.apache.hadoop.fs.Path
        root = self._Path(self.location)
        self._fs = root.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())

    def path(self, batch_id: int) -> str:
        return f"{self.location}/batch-{batch_id:012d}"

    def versions(self) -> list[int]:
        """Committed versions, oldest first."""
        root = self._Path(self.location)
        if not self._fs.exists(root):
            return []
        found = []
        for status in self._fs.listStatus(root):
            name = status.getPath().getName()
            if name.startswith("batch-") and self._fs.exists(self._Path(status.getPath(), "_SUCCESS")):
                found.append(int(name[len("batch-") :]))
        return sorted(found)

    def read_before(self, batch_id: int, schema: StructType) -> tuple[int | None, DataFrame | None]:
        """The newest committed version below ``batch_id`` (None if none or empty)."""
        older = [v for v in self.versions() if v < batch_id]
        if not older:
            return None, None
        version = older[-1]
        if self._fs.exists(self._Path(self.path(version), "_EMPTY")):
            return version, None
        return version, self.spark.read.schema(schema).parquet(self.path(version))

    def write(self, batch_id: int, parked: DataFrame, empty: bool) -> None:
        target = self.path(batch_id)
        if empty:
            path = self._Path(target)
            if self._fs.exists(path):
                self._fs.delete(path, True)
            self._fs.mkdirs(path)
            self._fs.create(self._Path(path, "_EMPTY")).close()
            self._fs.create(self._Path(path, "_SUCCESS")).close()
        else:
            parked.sortWithinPartitions(F.col(STATE_COLUMN + ".key_group")).write.mode("overwrite").parquet(
                target
            )
        versions = self.versions()
        for version in versions[: -self.keep]:
            if version < batch_id:
                self._fs.delete(self._Path(self.path(version)), True)


@dataclass(frozen=True)
class BatchReport:
    batch_id: int
    rows_in: int  # new rows of this micro-batch
    replayed: int  # parked rows read back from the previous version
    rows_out: int  # rows handed to the sink
    parked: int  # rows parked for the next micro-batch
    seconds: float


class KeyedStream:
    """A key-ordered async stage over a streaming DataFrame, with parked rows as keyed state.

    :meth:`start` starts the query; :attr:`reports` (one per micro-batch, this run) and
    :meth:`wait_until` follow it."""

    def __init__(
        self,
        df: DataFrame,
        build: Callable[[DataFrame], DataFrame],
        *,
        key_columns: list[str],
        order_by: list[str],
        sink: Callable[[DataFrame, int], None],
        checkpoint_location: str,
        num_partitions: int | None,
        heartbeat: float | None,
        keep_versions: int,
        counts: Any = None,
    ) -> None:
        self._spark = df.sparkSession
        self._build = build
        self._key_columns = key_columns
        self._order_by = order_by
        self._sink = sink
        self._checkpoint = checkpoint_location.rstrip("/")
        self._num_partitions = num_partitions
        self._input_columns = list(df.columns)
        self._state_schema = StructType([*df.schema.fields, StructField(STATE_COLUMN, STATE_STRUCT, True)])
        self.state = ParkedState(self._spark, self._checkpoint + "/async_state", keep_versions)
        self._source = _with_heartbeat(df, heartbeat) if heartbeat else df
        self._heartbeat = heartbeat is not None
        self._counts = counts  # accumulator: [new rows, replayed rows] read by the tasks
        self.reports: list[BatchReport] = []
        self._changed = threading.Condition()

    def start(self, **trigger: Any) -> StreamingQuery:
        """Start the query (``trigger`` as for ``DataStreamWriter.trigger``, e.g.
        ``processingTime="2 seconds"``)."""
        writer = self._source.writeStream.foreachBatch(self._process).option(
            "checkpointLocation", self._checkpoint
        )
        if trigger:
            writer = writer.trigger(**trigger)
        return writer.start()

    def wait_until(self, condition: Callable[[list[BatchReport]], bool], timeout: float) -> bool:
        """Wait (at most ``timeout`` seconds) until ``condition(reports)`` holds."""
        with self._changed:
            return self._changed.wait_for(lambda: condition(self.reports), timeout)

    @property
    def parked(self) -> int:
        return self.reports[-1].parked if self.reports else 0

    def _process(self, batch: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        spark = batch.sparkSession
        if self._heartbeat:
            batch = batch.where(~F.col(_TICK)).drop(_TICK)
        new = batch.withColumn(STATE_COLUMN, F.lit(None).cast(STATE_STRUCT))
        _, parked = self.state.read_before(batch_id, self._state_schema)
        both = new if parked is None else new.unionByName(parked)
        n = self._num_partitions or int(spark.conf.get("spark.sql.shuffle.partitions", "200") or 200)
        origin = F.when(F.col(STATE_COLUMN).isNull(), F.lit(1)).otherwise(F.lit(0))
        both = both.repartition(n, *self._key_columns).sortWithinPartitions(
            origin, F.col(STATE_COLUMN + ".order"), *self._order_by
        )
        before = list(self._counts.value) if self._counts is not None else [0, 0]
        enriched = self._build(both).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            finished = enriched.where(F.col(STATE_COLUMN).isNull()).drop(STATE_COLUMN)
            self._sink(finished, batch_id)
            left = enriched.where(F.col(STATE_COLUMN).isNotNull()).select(*self._input_columns, STATE_COLUMN)
            counts = enriched.select(
                F.count(F.when(F.col(STATE_COLUMN).isNull(), 1)).alias("out"),
                F.count(F.col(STATE_COLUMN)).alias("parked"),
            ).first()
            assert counts is not None
            self.state.write(batch_id, left, empty=counts["parked"] == 0)
            after = list(self._counts.value) if self._counts is not None else [0, 0]
            rows_in, replayed = after[0] - before[0], after[1] - before[1]
        finally:
            enriched.unpersist()
        report = BatchReport(
            batch_id, rows_in, replayed, counts["out"], counts["parked"], time.monotonic() - started
        )
        with self._changed:
            self.reports.append(report)
            self._changed.notify_all()


def _with_heartbeat(df: DataFrame, seconds: float) -> DataFrame:
    """``df`` plus a tick row every ``seconds``, so that micro-batches keep running (and parked
    rows keep being retried) while no new input arrives; the ticks are dropped again."""
    ticks = (
        df.sparkSession.readStream.format("rate")
        .option("rowsPerSecond", 1)
        .option("numPartitions", 1)
        .load()
        .where(F.col("value") % max(1, int(seconds)) == 0)
    )
    ticks = ticks.select(
        *[F.lit(None).cast(f.dataType).alias(f.name) for f in df.schema.fields], F.lit(True).alias(_TICK)
    )
    return df.withColumn(_TICK, F.lit(False)).unionByName(ticks)


def parking_stage(plan: Any, schema: StructType, parking: ParkingPlan) -> Callable[[DataFrame], DataFrame]:
    """The mapInArrow stage a :class:`KeyedStream` runs per micro-batch."""
    return lambda both: both.mapInArrow(partial(run_parking_partition, plan, parking), schema)


def defer_policy(on_error: str, defer: DeferPolicy | None, max_defer_age: float | None) -> DeferPolicy | None:
    if on_error != "defer":
        if defer is not None or max_defer_age is not None:
            raise ConfigError("on_error", on_error, "'defer' when defer= or max_defer_age= is given")
        return None
    policy = defer or DeferPolicy()
    return policy if max_defer_age is None else replace(policy, max_age=max_defer_age)

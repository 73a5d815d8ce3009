"""Rescale-safe streaming on Spark: unfinished records kept as keyed state across micro-batches.

    stream = AsyncDataStream.key_ordered_stream(orders, users, key="order_id", order_by="seq",
                                                sink=write_batch, checkpoint_location=path,
                                                time_cap=5.0, on_error="defer")
    query = stream.start(processingTime="2 seconds")

Each micro-batch ``n`` (``foreachBatch``):

1. opens version ``n - 1`` of the parked state (:mod:`keyed_async_wait.spark.state`; verified
   at the first micro-batch of a run: a missing or damaged version fails here, before any lookup);
2. finds, per parked key, its first row and whether it is due (a deferral's next try has come,
   or it was parked by the time cap); due keys are replayed, oldest first, up to the replay
   budget; every other parked key is *carried*: its rows stay where they are, and new rows of
   it are appended to the state as they are, without going to Python;
3. runs the replayed rows, then the other new rows, per partition (``mapInArrow``), with the
   time cap and the error policy; rows that do not finish come out parked;
4. hands the finished rows to ``sink(df, batch_id)`` and writes version ``n``: a segment with
   the rows parked by this micro-batch (and those of segments leaving the window), the keys it
   took out of older segments, and its manifest, last.

A re-run of micro-batch ``n`` (after a crash) reads version ``n - 1`` again and overwrites its
own, so with an idempotent sink (one that overwrites per batch id) every row reaches the sink
once. No partitioning is stored: every micro-batch repartitions the rows it runs by the key, so
a restart with another ``spark.sql.shuffle.partitions``, other executors or another source
partitioning keeps each key whole and in order.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from pyspark import AccumulatorParam, StorageLevel
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import DoubleType, IntegerType, LongType, StringType, StructField, StructType

from ..core.exceptions import ConfigError
from ..core.parking import DeferPolicy
from .parked import STATE_COLUMN, STATE_FIELDS, ParkingPlan
from .state import DEFAULT_WINDOW, ParkedStore, StateError, Version

__all__ = ["STATE_STRUCT", "BatchReport", "KeyedStream", "TaskCounts", "defer_policy", "parking_stage"]

log = logging.getLogger(__name__)

_TYPES = {"long": LongType(), "int": IntegerType(), "double": DoubleType(), "string": StringType()}
STATE_STRUCT = StructType([StructField(name, _TYPES[kind], True) for name, kind in STATE_FIELDS])
_TICK = "_kaw_tick"


def _state() -> Any:
    """The state column (a Column needs an active session: made on use)."""
    return F.col(STATE_COLUMN)


class TaskCounts(AccumulatorParam):
    """[new rows, replayed rows, peak KiB a task added, rows out, rows parked]: summed, except
    the peak (the largest). For reports; the state's own counts come from its files."""

    def zero(self, value: list[int]) -> list[int]:
        return [0] * 5

    def addInPlace(self, a: list[int], b: list[int]) -> list[int]:
        return [a[0] + b[0], a[1] + b[1], max(a[2], b[2]), a[3] + b[3], a[4] + b[4]]


@dataclass(frozen=True)
class BatchReport:
    batch_id: int
    rows_in: int  # new rows of this micro-batch
    replayed: int  # parked rows read back and run
    rows_out: int  # rows handed to the sink
    parked: int  # rows parked for the next micro-batch (the live rows of version batch_id)
    seconds: float
    carried: int = 0  # parked rows left in place: not due yet, or over the replay budget
    written: int = 0  # state rows this micro-batch wrote (its segment)
    peak_task_mib: float = 0.0  # the most memory any one task added to its Python worker


@dataclass(frozen=True)
class _Replay:
    rows: DataFrame | None  # the parked rows to run
    selected: DataFrame | None  # their keys
    carried_keys: DataFrame | None  # parked keys left in place
    replayed: int
    carried: int
    heads: DataFrame | None = None  # per parked key: its first row and row count (persisted)


class KeyedStream:
    """A key-ordered async stage over a streaming DataFrame, with parked rows as keyed state.

    :meth:`start` starts the query; :meth:`run_available_now` runs what the source has and
    stops; :attr:`reports` (one per micro-batch, this run) and :meth:`wait_until` follow it."""

    def __init__(
        self,
        df: DataFrame,
        build: Callable[[DataFrame, ParkingPlan], DataFrame],
        parking: ParkingPlan,
        *,
        key_columns: list[str],
        order_by: list[str],
        sink: Callable[[DataFrame, int], None],
        checkpoint_location: str,
        num_partitions: int | None,
        heartbeat: float | None,
        keep_versions: int,
        replay_rows: int | None,
        state_window: int = DEFAULT_WINDOW,
    ) -> None:
        self._spark = df.sparkSession
        self._build = build
        self._parking = parking
        self._key_columns = key_columns
        self._order_by = order_by
        self._sink = sink
        self._checkpoint = checkpoint_location.rstrip("/")
        self._num_partitions = num_partitions
        self._input_columns = list(df.columns)
        self._state_schema = StructType([*df.schema.fields, StructField(STATE_COLUMN, STATE_STRUCT, True)])
        self.store = ParkedStore(
            self._spark,
            self._checkpoint,
            keep=keep_versions,
            window=state_window,
            heartbeat=heartbeat is not None,
        )
        self._source = _with_heartbeat(df, heartbeat) if heartbeat else df
        self._heartbeat = heartbeat
        self._replay_rows = replay_rows  # None: as many as 4x what got out last time, at least 10,000
        self.reports: list[BatchReport] = []
        self._failure: BaseException | None = None  # the error a micro-batch ended with
        self._arrived_nothing = False
        self._changed = threading.Condition()

    # ------------------------------------------------------------------ running

    def start(self, **trigger: Any) -> StreamingQuery:
        """Start the query (``trigger`` as for ``DataStreamWriter.trigger``, e.g.
        ``processingTime="2 seconds"``)."""
        self.store.check_query()
        self._failure = None
        writer = self._source.writeStream.foreachBatch(self._process).option(
            "checkpointLocation", self._checkpoint
        )
        if trigger:
            writer = writer.trigger(**trigger)
        return writer.start()

    def run_available_now(self, *, drain_timeout: float | None = None) -> BatchReport | None:
        """Run what the source holds now (``availableNow``) and stop. Rows still parked then
        are replayed by the next run; with ``drain_timeout`` (seconds, needs ``heartbeat``) the
        run goes on, without new input, until none is parked or the time is up. Either way the
        last report, and a warning in the log, say how many rows stay parked."""
        if drain_timeout is not None and self._heartbeat is None:
            allowed = "None, or seconds with a stream made with heartbeat= (without new input only the "
            allowed += "heartbeat makes micro-batches)"
            raise ConfigError("drain_timeout", drain_timeout, allowed)
        query = self.start(availableNow=True)
        query.awaitTermination()
        if query.exception() is not None:
            raise RuntimeError(f"the query failed: {query.exception()}")
        if self.parked and drain_timeout:
            query = self.start(processingTime=f"{self._heartbeat} seconds")
            try:
                self.wait_until(lambda reports: reports[-1].parked == 0, drain_timeout)
            finally:
                query.stop()
        if self.parked:
            log.warning(
                "key_ordered_stream: the run ended with %d rows parked in %s/async_state; the next run "
                "replays them first (run with drain_timeout= and a heartbeat to finish them now)",
                self.parked,
                self._checkpoint,
            )
        return self.reports[-1] if self.reports else None

    def wait_until(self, condition: Callable[[list[BatchReport]], bool], timeout: float) -> bool:
        """Wait (at most ``timeout`` seconds) until ``condition(reports)`` holds; raises the
        error a micro-batch failed with, as soon as one does."""
        with self._changed:
            held = self._changed.wait_for(
                lambda: self._failure is not None or (bool(self.reports) and condition(self.reports)), timeout
            )
            if self._failure is not None:
                raise self._failure
            return held

    @property
    def parked(self) -> int:
        return self.reports[-1].parked if self.reports else 0

    # ------------------------------------------------------------------ one micro-batch

    def _process(self, batch: DataFrame, batch_id: int) -> None:
        try:
            self._run_batch(batch, batch_id)
        except BaseException as exc:
            with self._changed:
                self._failure = exc
                self._changed.notify_all()
            raise

    def _run_batch(self, batch: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        previous = self.store.open(batch_id)  # a missing or damaged version fails here: nothing ran
        if self._heartbeat:
            batch = batch.where(~F.col(_TICK)).drop(_TICK)
        self._arrived_nothing = batch.isEmpty()  # a heartbeat: no new row to park behind a key
        new = batch.withColumn(STATE_COLUMN, F.lit(None).cast(STATE_STRUCT))
        replay = self._replay(previous, batch_id)
        behind, run_new = None, new
        if replay.carried_keys is not None:
            behind = new.join(replay.carried_keys, self._key_columns, "left_semi")
            run_new = new.join(replay.carried_keys, self._key_columns, "left_anti")
        both = run_new if replay.rows is None else run_new.unionByName(replay.rows)
        counts = self._spark.sparkContext.accumulator([0] * 5, TaskCounts())
        parking = replace(self._parking, batch_id=batch_id, counts=counts)
        enriched = self._build(self._ordered(both), parking).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            self._sink(enriched.where(_state().isNull()).drop(STATE_COLUMN), batch_id)
            new_rows, _, peak_kib, rows_out, reparked = counts.value  # the sink ran every task
            written = self._write_parts(enriched, behind, previous, replay, batch_id, reparked)
            version = self.store.commit(
                batch_id, previous, written, replay.replayed, replay.carried == 0 and previous is not None
            )
        finally:
            enriched.unpersist()
            if replay.heads is not None:
                replay.heads.unpersist()
        segment = (
            version.segments[-1] if version.segments and version.segments[-1].batch == batch_id else None
        )
        fresh = segment.fresh if segment is not None else 0
        self._report(
            BatchReport(
                batch_id,
                rows_in=new_rows + fresh - reparked,  # those run, and those parked behind a key
                replayed=replay.replayed,
                rows_out=rows_out,
                parked=version.rows,
                seconds=time.monotonic() - started,
                carried=replay.carried,
                written=segment.rows if segment is not None else 0,
                peak_task_mib=round(peak_kib / 1024, 1),
            )
        )

    def _ordered(self, both: DataFrame) -> DataFrame:
        spark = both.sparkSession
        n = self._num_partitions or int(spark.conf.get("spark.sql.shuffle.partitions", "200") or 200)
        origin = F.when(_state().isNull(), F.lit(1)).otherwise(F.lit(0))
        return both.repartition(n, *self._key_columns).sortWithinPartitions(
            origin, _state().seg, _state().order, *self._order_by
        )

    def _replay(self, previous: Version | None, batch_id: int) -> _Replay:
        """Which parked keys run now (due, oldest first, within the budget) and which stay."""
        parked = self.store.live(previous, self._state_schema, self._key_columns) if previous else None
        if parked is None or previous is None:
            return _Replay(None, None, None, 0, 0)
        now = time.time()
        latest, earliest = previous.latest_try, previous.earliest_try
        if (latest is None or latest <= now) and previous.rows <= self._budget():
            return _Replay(parked, None, None, previous.rows, 0)  # every key is due: all of them run
        if earliest is not None and earliest > now:  # no key is due: all of them stay, unread
            return _Replay(None, None, parked.select(*self._key_columns).distinct(), 0, previous.rows)
        heads = (
            parked.groupBy(*self._key_columns)
            .agg(
                F.min(F.struct(_state().seg, _state().order, _state().next_try)).alias("head"),
                F.count(F.lit(1)).alias("n"),
            )
            .persist()
        )
        due = F.col("head.next_try").isNull() | (F.col("head.next_try") <= F.lit(now))
        summary = (
            heads.groupBy(F.col("head.seg").alias("seg"), due.alias("due"))
            .agg(F.sum("n").alias("rows"))
            .collect()
        )
        total = sum(int(row.rows) for row in summary)
        if total != previous.rows:
            raise StateError(
                f"version {previous.batch} holds {total} live rows, its manifest says {previous.rows}: "
                "rows are missing",
                path=self.store.root,
                batch_id=batch_id,
            )
        cutoff = _cutoff(summary, self._budget())
        chosen = due & (F.col("head.seg") <= F.lit(cutoff)) if cutoff is not None else F.lit(False)
        replayed = sum(int(r.rows) for r in summary if r.due and cutoff is not None and r.seg <= cutoff)
        selected = heads.where(chosen).select(*self._key_columns)
        carried_keys = heads.where(~chosen).select(*self._key_columns)
        rows = parked.join(selected, self._key_columns, "left_semi") if replayed else None
        return _Replay(
            rows,
            selected if replayed else None,
            carried_keys if replayed < total else None,
            replayed,
            total - replayed,
            heads,
        )

    def _budget(self) -> int:
        if self._replay_rows is not None:
            return self._replay_rows
        last = self.reports[-1].rows_out if self.reports else 0
        return max(10_000, 4 * last)

    def _write_parts(
        self,
        enriched: DataFrame,
        behind: DataFrame | None,
        previous: Version | None,
        replay: _Replay,
        batch_id: int,
        reparked: int,
    ) -> list[str]:
        """Write what version ``batch_id`` adds: its segment (re-parked rows, new rows behind
        carried keys, the live rows of segments leaving the window, compacted keeping their
        order) and its removal set (the keys it replayed, when others stay); the parts written."""
        columns = [*self._input_columns, STATE_COLUMN]
        parts = [enriched.where(_state().isNotNull()).select(*columns)] if reparked else []
        if behind is not None and not self._arrived_nothing:
            parts.append(_behind_state(behind, self._key_columns, self._order_by, batch_id).select(*columns))
        aged = self.store.aged(batch_id, previous)
        if aged and previous is not None:
            old = self.store.live(previous, self._state_schema, self._key_columns, only=aged)
            if old is not None:
                if replay.selected is not None:
                    old = old.join(replay.selected, self._key_columns, "left_anti")
                parts.append(old.select(*columns))
        written = []
        if parts:
            segment = parts[0]
            for part in parts[1:]:
                segment = segment.unionByName(part)
            self.store.write("seg", segment, batch_id)
            written.append("seg")
        if replay.selected is not None and replay.carried:  # other keys stay in the older segments
            self.store.write("rm", replay.selected, batch_id)
            written.append("rm")
        return written

    def _report(self, report: BatchReport) -> None:
        log.info("key_ordered_stream: %s", report)
        with self._changed:
            self.reports.append(report)
            self._changed.notify_all()


def _cutoff(summary: list[Any], budget: int) -> int | None:
    """The newest head segment whose due keys are replayed: oldest first, while within the
    budget (at least the oldest segment's, so a budget never starves the backlog)."""
    due = sorted((int(row.seg), int(row.rows)) for row in summary if row.due)
    cutoff, taken = None, 0
    for seg, rows in due:
        if cutoff is not None and taken + rows > budget:
            break
        cutoff, taken = seg, taken + rows
    return cutoff


def _behind_state(behind: DataFrame, keys: list[str], order_by: list[str], batch_id: int) -> DataFrame:
    """New rows of a carried key, parked as they come, after the key's older rows."""
    order = Window.partitionBy(*keys).orderBy(
        *([F.col(c) for c in order_by] or [F.monotonically_increasing_id()])
    )
    state = F.struct(
        F.lit(batch_id).cast("long").alias("seg"),
        F.row_number().over(order).cast("long").alias("order"),
        F.lit(None).cast("int").alias("key_group"),
        F.lit(0).alias("attempts"),
        F.lit(0).alias("deferrals"),
        F.lit(None).cast("double").alias("next_try"),
        F.lit(None).cast("double").alias("deferred_since"),
        F.lit(None).cast("string").alias("error"),
    )
    return behind.withColumn(STATE_COLUMN, state)


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


def parking_stage(plan: Any, schema: StructType) -> Callable[[DataFrame, ParkingPlan], DataFrame]:
    """The mapInArrow stage a :class:`KeyedStream` runs per micro-batch."""
    from functools import partial

    from .parked import run_parking_partition

    return lambda both, parking: both.mapInArrow(partial(run_parking_partition, plan, parking), schema)


def defer_policy(on_error: str, defer: DeferPolicy | None, max_defer_age: float | None) -> DeferPolicy | None:
    if on_error != "defer":
        if defer is not None or max_defer_age is not None:
            raise ConfigError("on_error", on_error, "'defer' when defer= or max_defer_age= is given")
        return None
    policy = defer or DeferPolicy()
    return policy if max_defer_age is None else replace(policy, max_age=max_defer_age)

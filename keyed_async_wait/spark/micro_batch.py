"""One micro-batch of a key-ordered stream with parked rows as keyed state: self-contained, so
that it runs where ``foreachBatch`` runs it (the driver on a classic session; a Python process of
the server on Spark Connect, which pickles it).

Micro-batch ``n``:

1. opens version ``n - 1`` of the parked state (:mod:`keyed_async_wait.spark.state`; verified
   at the first micro-batch of a run: a missing or damaged version fails here, before any lookup);
2. finds, per parked key, its first row and whether it is due (a deferral's next try has come,
   or it was parked by the time cap); due keys are replayed, oldest first, up to the replay
   budget; every other parked key is *carried*: its rows stay where they are, and new rows of
   it are appended to the state as they are, without going to Python;
3. runs the replayed rows, then the other new rows, per partition (``mapInArrow``), with the
   time cap and the error policy; rows that do not finish come out parked (the rows are
   repartitioned by the key first, unless nothing is parked and the stream was told the
   source's partitions hold each key whole, ``assume_partitioned``);
4. hands the finished rows to ``sink(df, batch_id)`` (run in the source's partitions, fails if
   a key ran in two of them: :mod:`.key_spread`) and writes version ``n``: a segment with
   the rows parked by this micro-batch (and those of segments leaving the window), the keys it
   took out of older segments, and its manifest, last (with ``publish``, the manifest also
   holds the micro-batch's report, where a Spark Connect client reads it);
5. returns its :class:`BatchReport`.

It holds no session, lock or accumulator between micro-batches: the session is the batch's, and
the counts come from an accumulator where the session has them (classic), or else as
:mod:`.batch_counts` says (Connect).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, IntegerType, LongType, StringType, StructField, StructType

from .batch_counts import ObservedCounts, counted, task_counts
from .key_hash import placement_columns
from .key_spread import check_key_spread, key_spread
from .parked import STATE_COLUMN, STATE_FIELDS, ParkingPlan
from .plan_values import at_most, one_row, without_adaptive_stages, without_stage_code
from .session import key_partitions
from .state import ParkedStore, Part, StateError, Version, joined_by_key

__all__ = ["STATE_STRUCT", "TICK", "BatchReport", "MicroBatch"]

log = logging.getLogger(__name__)

_TYPES = {"long": LongType(), "int": IntegerType(), "double": DoubleType(), "string": StringType()}
STATE_STRUCT = StructType([StructField(name, _TYPES[kind], True) for name, kind in STATE_FIELDS])
TICK = "_kaw_tick"  # the heartbeat's rows carry it true


# Every micro-batch builds these on the driver, as SQL text: a Column function of PySpark 4 also
# tells the JVM its call site (spark.python.sql.dataFrameDebugging.enabled), several py4j calls.
# Measured alone: the state column 9.6 -> 4.5 ms, the sink's filter 12.3 -> 5.4 ms a micro-batch
_STATE_FIELDS_DDL = ",".join(f"`{f.name}`:{f.dataType.simpleString()}" for f in STATE_STRUCT.fields)
_STATE_DDL = f"struct<{_STATE_FIELDS_DDL}>"
_NULL_STATE = f"CAST(NULL AS {_STATE_DDL})"


def _new_rows(batch: DataFrame, heartbeat: bool) -> DataFrame:
    """The micro-batch's rows (ticks dropped) with a NULL state column."""
    if heartbeat:
        batch = batch.where(f"NOT `{TICK}`").drop(TICK)
    # selectExpr: one analysis of SQL text (withColumn of a Column measured 7.6 ms, this 4.2)
    return batch.selectExpr("*", f"{_NULL_STATE} AS `{STATE_COLUMN}`")


def _finished(enriched: DataFrame) -> DataFrame:
    """What the sink gets: the rows that did not park, without the state column."""
    return enriched.where(f"`{STATE_COLUMN}` IS NULL").drop(STATE_COLUMN)


def _state() -> Any:
    """The state column (a Column needs an active session: made on use)."""
    return F.col(STATE_COLUMN)


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
    peak_task_mib: float = 0.0  # the most memory any one task added to its Python worker (classic)
    run: str = field(default="", repr=False)  # the start() that ran it

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> BatchReport:
        return cls(**json.loads(text))


@dataclass(frozen=True)
class _Replay:
    rows: DataFrame | None  # the parked rows to run
    selected: DataFrame | None  # their keys
    carried_keys: DataFrame | None  # parked keys left in place
    replayed: int
    carried: int
    heads: DataFrame | None = None  # per parked key: its first row and row count (persisted)


@dataclass
class MicroBatch:
    """``foreachBatch``'s function for a :class:`~keyed_async_wait.spark.stream.KeyedStream`."""

    build: Callable[[DataFrame, ParkingPlan], DataFrame]  # the mapInArrow stage
    parking: ParkingPlan
    key_columns: list[str]
    order_by: list[str]
    sink: Callable[[DataFrame, int], None]
    checkpoint: str
    num_partitions: int | None
    input_columns: list[str]
    state_schema: StructType  # the input's columns and the state column
    keep: int
    window: int
    heartbeat: bool
    replay_rows: int | None  # None: as many as 4x what got out last time, at least 10,000
    publish: bool = False  # each report in its manifest (for a Spark Connect client)
    assume_partitioned: bool = False  # the source holds each key's rows in one partition
    whole_record: bool = False  # the key is every input column (a NULL in one is part of it)
    run_id: str = ""
    _store: ParkedStore | None = field(default=None, init=False, repr=False)  # made at the first call
    _last_out: int = field(default=0, init=False)

    def __call__(self, batch: DataFrame, batch_id: int) -> BatchReport:
        """Run micro-batch ``batch_id`` (``foreachBatch``'s function); its report."""
        started = time.monotonic()
        spark = batch.sparkSession
        if self._store is None:
            self._store = ParkedStore(
                spark, self.checkpoint, keep=self.keep, window=self.window, heartbeat=self.heartbeat
            )
        self._store.spark = spark
        if self.parking.journal is not None and batch_id > 0:  # n - 1 committed: its journal is done
            self.parking.journal.forget(self.parking.journal_prefix, batch_id - 1)
        with without_stage_code(spark):  # the state's plans (the sink's are the user's)
            previous = self._store.open(batch_id)  # a missing or damaged version fails here: nothing ran
            new = _new_rows(batch, self.heartbeat)
            # the lookups, and every step over the parked state, run in this many partitions
            n = key_partitions(spark, self.num_partitions)
            replay = self._replay(previous, batch_id, n)
            behind, run_new = None, new
            if replay.carried_keys is not None and not (self.heartbeat and new.isEmpty()):
                # (only a heartbeat makes micro-batches without input: then no row parks behind a key)
                keyed = new.repartition(n, *self._placed())  # partitioned as the carried keys are
                carried = joined_by_key(replay.carried_keys)
                behind = keyed.join(carried, self.key_columns, "left_semi")
                run_new = keyed.join(carried, self.key_columns, "left_anti")
            both = run_new if replay.rows is None else run_new.unionByName(replay.rows)
            only_new = replay.rows is None and behind is None
            in_place = only_new and self.assume_partitioned  # in the source's partitions: checked
            counts, spread = task_counts(spark), key_spread(spark) if in_place else None
            # Connect: counted as the sink's job runs (partitions known: repartitioned into n)
            observed = None if in_place else ObservedCounts.made(spark, n)
            parking = replace(self.parking, batch_id=batch_id, counts=counts, spread=spread)
            ordered = self._ordered(both, n, only_new=only_new)
            with without_adaptive_stages(spark) if only_new else contextlib.nullcontext():
                built = self.build(ordered, parking)
                built = built if observed is None else observed.on(built)
                enriched = built.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            self.sink(_finished(enriched), batch_id)
            # the sink ran (every task of it, or else the counts are a job's)
            rows_out, reparked, peak_kib = counted(enriched, counts, observed, None if in_place else n)
            if in_place:  # before anything is committed
                check_key_spread(enriched, self.key_columns, spread, batch_id, self.whole_record)
            aged = self.store.aged(batch_id, previous)
            # the state's plans, when there are any (three calls to the session's settings saved)
            plans = reparked > 0 or behind is not None or bool(aged) or replay.selected is not None
            with without_stage_code(spark) if plans else contextlib.nullcontext():
                written = self._write_parts(enriched, behind, previous, replay, batch_id, reparked, n, aged)
                counted_rows = (rows_out, reparked, peak_kib)
                report_of = partial(_report, batch_id, replay, counted_rows, started, self.run_id)
                version = self._store.commit(
                    batch_id,
                    previous,
                    written,
                    replay.replayed,
                    replay.carried == 0 and previous is not None,
                    # Connect: the report goes in the manifest, which the client reads
                    note=(lambda v: asdict(report_of(v))) if self.publish else None,
                )
        finally:
            enriched.unpersist()
            if replay.heads is not None:
                replay.heads.unpersist()
        report = report_of(version)
        self._last_out = rows_out
        log.info("key_ordered_stream: %s", report)
        return report

    @property
    def store(self) -> ParkedStore:
        """The parked state (made at the first micro-batch, with its session)."""
        assert self._store is not None, "a micro-batch has not run yet"
        return self._store

    def _ordered(self, both: DataFrame, n: int, *, only_new: bool) -> DataFrame:
        """``both`` by key in ``n`` partitions, each sorted as the task reads it: parked rows
        first, in their order, then new rows (``only_new``: no parked row, and no join has
        reordered the new ones; ordered by ``order_by`` alone, or left in arrival order, and
        with ``assume_partitioned`` left in the source's partitions: no shuffle)."""
        if only_new:
            keyed = both if self.assume_partitioned else both.repartition(n, *self._placed())
            return keyed.sortWithinPartitions(*self.order_by) if self.order_by else keyed
        keyed = both.repartition(n, *self._placed())
        origin = F.when(_state().isNull(), F.lit(1)).otherwise(F.lit(0))
        return keyed.sortWithinPartitions(origin, _state().seg, _state().order, *self.order_by)

    def _placed(self) -> list[Any]:
        """What the rows are repartitioned by to place each key's rows together."""
        return placement_columns(self.state_schema, self.key_columns)

    def _replay(self, previous: Version | None, batch_id: int, n: int) -> _Replay:
        """Which parked keys run now (due, oldest first, within the budget) and which stay."""
        parked = self.store.live(previous, self.state_schema, self.key_columns, n) if previous else None
        if parked is None or previous is None:
            return _Replay(None, None, None, 0, 0)
        now = time.time()
        latest, earliest = previous.latest_try, previous.earliest_try
        if (latest is None or latest <= now) and previous.rows <= self._budget():
            return _Replay(parked, None, None, previous.rows, 0)  # every key is due: all of them run
        if earliest is not None and earliest > now:  # no key is due: all of them stay, unread
            return _Replay(None, None, parked.select(*self.key_columns).distinct(), 0, previous.rows)
        heads = (
            parked.groupBy(*self.key_columns)
            .agg(
                F.min(F.struct(_state().seg, _state().order, _state().next_try)).alias("head"),
                F.count(F.lit(1)).alias("n"),
            )
            .persist()
        )
        due = F.col("head.next_try").isNull() | at_most(F.col("head.next_try"), now)
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
        chosen = due & at_most(F.col("head.seg"), cutoff) if cutoff is not None else F.lit(False)
        replayed = sum(int(r.rows) for r in summary if r.due and cutoff is not None and r.seg <= cutoff)
        selected = heads.where(chosen).select(*self.key_columns)
        carried_keys = heads.where(~chosen).select(*self.key_columns)
        rows = parked.join(joined_by_key(selected), self.key_columns, "left_semi") if replayed else None
        return _Replay(
            rows,
            selected if replayed else None,
            carried_keys if replayed < total else None,
            replayed,
            total - replayed,
            heads,
        )

    def _budget(self) -> int:
        if self.replay_rows is not None:
            return self.replay_rows
        return max(10_000, 4 * self._last_out)

    def _write_parts(
        self,
        enriched: DataFrame,
        behind: DataFrame | None,
        previous: Version | None,
        replay: _Replay,
        batch_id: int,
        reparked: int,
        n: int,
        aged: list[int],
    ) -> dict[str, Part | None]:
        """Write what version ``batch_id`` adds: its segment (re-parked rows, new rows behind
        carried keys, the live rows of segments leaving the window, compacted keeping their
        order) and its removal set (the keys it replayed, when others stay); the parts written
        (as :meth:`ParkedStore.write` returns them)."""
        columns = [*self.input_columns, STATE_COLUMN]
        parts = [enriched.where(_state().isNotNull()).select(*columns)] if reparked else []
        if behind is not None:
            parts.append(_behind_state(behind, self.key_columns, self.order_by, batch_id).select(*columns))
        if aged and previous is not None:
            old = self.store.live(previous, self.state_schema, self.key_columns, n, only=aged)
            if old is not None:
                if replay.selected is not None:
                    old = old.join(joined_by_key(replay.selected), self.key_columns, "left_anti")
                parts.append(old.select(*columns))
        written: dict[str, Part | None] = {}
        if parts:
            segment = parts[0]
            for part in parts[1:]:
                segment = segment.unionByName(part)
            # as many files as the lookups' partitions, not one per part's partition
            written["seg"] = self.store.write("seg", segment.coalesce(n), batch_id)
        if replay.selected is not None and replay.carried:  # other keys stay in the older segments
            written["rm"] = self.store.write("rm", replay.selected, batch_id)
        return written


def _report(
    batch_id: int,
    replay: _Replay,
    counts: tuple[int, int, int],
    started: float,
    run: str,
    version: Version,
) -> BatchReport:
    """Micro-batch ``batch_id``'s report, once ``version`` is made: ``counts`` are its rows out,
    rows parked and the peak KiB a task added."""
    rows_out, reparked, peak_kib = counts
    segment = version.segments[-1] if version.segments and version.segments[-1].batch == batch_id else None
    fresh = segment.fresh if segment is not None else 0
    ran_new = rows_out + reparked - replay.replayed  # every row run leaves: finished or parked
    return BatchReport(
        batch_id,
        rows_in=ran_new + fresh - reparked,  # those run, and those parked behind a key
        replayed=replay.replayed,
        rows_out=rows_out,
        parked=version.rows,
        seconds=time.monotonic() - started,
        carried=replay.carried,
        written=segment.rows if segment is not None else 0,
        peak_task_mib=round(peak_kib / 1024, 1),
        run=run,
    )


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
        F.col("_kaw_batch").alias("seg"),
        F.row_number().over(order).cast("long").alias("order"),
        F.lit(None).cast("int").alias("key_group"),
        F.lit(0).alias("attempts"),
        F.lit(0).alias("deferrals"),
        F.lit(None).cast("double").alias("next_try"),
        F.lit(None).cast("double").alias("deferred_since"),
        F.lit(None).cast("string").alias("error"),
        F.lit(None).cast("string").alias("progress"),
    )
    batch = F.broadcast(one_row(behind.sparkSession, "_kaw_batch", batch_id))
    return behind.crossJoin(batch).withColumn(STATE_COLUMN, state).drop("_kaw_batch")

"""Rescale-safe streaming on Spark: unfinished records kept as keyed state across micro-batches.

    stream = AsyncDataStream.key_ordered_stream(orders, users, key="order_id", order_by="seq",
                                                sink=write_batch, checkpoint_location=path,
                                                time_cap=5.0, defer=DeferPolicy(max_age=3600))
    query = stream.start(processingTime="2 seconds")

Each micro-batch is run by a :class:`~keyed_async_wait.spark.micro_batch.MicroBatch` (what it
does, step by step, is said there). A re-run of micro-batch ``n`` (after a crash) reads version
``n - 1`` again and overwrites its own, so with an idempotent sink (one that overwrites per batch
id) every row reaches the sink once. No partitioning is stored: every micro-batch repartitions
the rows it runs by the key, so a restart with another ``spark.sql.shuffle.partitions``, other
executors or another source partitioning keeps each key whole and in order. (With
``assume_partitioned`` a micro-batch with nothing parked runs its new rows where the source put
them: the user says each key's rows are in one partition, and :mod:`.key_spread` checks it.)

This module is the client's side. On a classic session ``foreachBatch`` calls the micro-batch in
this process, and its reports (and the error a micro-batch fails with) arrive here directly. On
Spark Connect ``foreachBatch`` pickles it into a Python process of the server: the micro-batch
then writes its report under the checkpoint, and the client reads the reports when a
``StreamingQueryListener`` (client side) says a micro-batch ended, and learns a failure from the
query's termination event.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any, cast

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery, StreamingQueryListener
from pyspark.sql.types import StructField, StructType

from ..core.checks import check_choice
from ..core.exceptions import ConfigError
from ..core.parking import DeferPolicy
from .batch_errors import reads_as_a_stop, short_for_spark
from .metrics import is_connect
from .micro_batch import STATE_STRUCT, TICK, BatchReport, MicroBatch
from .parked import STATE_COLUMN, ParkingPlan
from .state import DEFAULT_WINDOW, ParkedStore

__all__ = ["STATE_STRUCT", "BatchReport", "KeyedStream", "error_handling", "parking_stage"]

log = logging.getLogger(__name__)


class KeyedStream:
    """A key-ordered async stage over a streaming DataFrame, with parked rows as keyed state.

    :meth:`start` starts the query; :meth:`run_available_now` runs what the source has and
    stops; :attr:`reports` (one per micro-batch, this object's runs) and :meth:`wait_until`
    follow it. On Spark Connect the sink runs in a Python process of the server: it must be
    picklable, and this library must be installed there."""

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
        assume_partitioned: bool = False,
        whole_record: bool = False,
    ) -> None:
        spark = df.sparkSession
        self._checkpoint = checkpoint_location.rstrip("/")
        self._connect = is_connect(spark)
        self.store = ParkedStore(
            spark, self._checkpoint, keep=keep_versions, window=state_window, heartbeat=heartbeat is not None
        )
        self._batch = MicroBatch(
            build,
            parking,
            key_columns,
            order_by,
            sink,
            self._checkpoint,
            num_partitions,
            list(df.columns),
            StructType([*df.schema.fields, StructField(STATE_COLUMN, STATE_STRUCT, True)]),
            keep_versions,
            state_window,
            heartbeat is not None,
            replay_rows,
            publish=self._connect,
            assume_partitioned=assume_partitioned,
            whole_record=whole_record,
        )
        self._source = _with_heartbeat(df, heartbeat) if heartbeat else df
        self._heartbeat = heartbeat
        self._reports: dict[int, BatchReport] = {}
        self._runs: set[str] = set()
        self._failure: BaseException | None = None  # the error a micro-batch ended with
        self._changed = threading.Condition()
        self._events = 0  # micro-batches ended and queries terminated, as the listener saw them
        self._ended: dict[str, str | None] = {}  # Connect: Spark's run id of a query that ended: its error
        self._query_run = ""  # Connect: Spark's run id of the query started last
        self._listener: _Progress | None = None

    # ------------------------------------------------------------------ running

    def start(self, **trigger: Any) -> StreamingQuery:
        """Start the query (``trigger`` as for ``DataStreamWriter.trigger``, e.g.
        ``processingTime="2 seconds"``)."""
        self.store.check_query()
        self._failure = None
        self._batch.run_id = uuid.uuid4().hex
        self._runs.add(self._batch.run_id)
        if self._connect and self._listener is None:
            self._listener = _Progress(self)
            self.store.spark.streams.addListener(self._listener)
        function = cast(Callable[[DataFrame, int], None], self._batch) if self._connect else self._process
        writer = self._source.writeStream.foreachBatch(function)
        writer = writer.option("checkpointLocation", self._checkpoint)
        if trigger:
            writer = writer.trigger(**trigger)
        query = writer.start()
        self._query_run = str(query.runId)
        return query

    def run_available_now(self, *, drain_timeout: float | None = None) -> BatchReport | None:
        """Run what the source holds now (``availableNow``) and stop. Rows still parked then
        are replayed by the next run; with ``drain_timeout`` (seconds, needs ``heartbeat``) the
        run goes on, without new input, until none is parked or the time is up. Either way the
        last report, and a warning in the log, say how many rows stay parked."""
        if drain_timeout is not None and self._heartbeat is None:
            allowed = "None, or seconds with a stream made with heartbeat= (without new input only the "
            allowed += "heartbeat makes micro-batches)"
            raise ConfigError("drain_timeout", drain_timeout, allowed)
        try:
            query = self.start(availableNow=True)
            query.awaitTermination()
            if query.exception() is not None:
                raise RuntimeError(f"the query failed: {query.exception()}")
            # no report: the source had nothing new (the heartbeat ticks once a second), so
            # what a former run left parked is known only to a micro-batch: run the drain
            if drain_timeout and (self.parked or not self.reports):
                query = self.start(processingTime=f"{self._heartbeat} seconds")
                try:
                    self.wait_until(lambda reports: reports[-1].parked == 0, drain_timeout)
                finally:
                    query.stop()
        finally:
            self.close()
        if self.parked:
            log.warning(
                "key_ordered_stream: the run ended with %d rows parked in %s/async_state; the next run "
                "replays them first (run with drain_timeout= and a heartbeat to finish them now)",
                self.parked,
                self._checkpoint,
            )
        reports = self.reports
        return reports[-1] if reports else None

    def wait_until(self, condition: Callable[[list[BatchReport]], bool], timeout: float) -> bool:
        """Wait (at most ``timeout`` seconds) until ``condition(reports)`` holds; raises the
        error a micro-batch failed with, as soon as one does."""
        if not self._connect:
            with self._changed:
                held = self._changed.wait_for(
                    lambda: self._failure is not None or (bool(self._reports) and condition(self.reports)),
                    timeout,
                )
                self._raise_failure()
                return held
        return self._wait_remote(condition, timeout)

    def _wait_remote(self, condition: Callable[[list[BatchReport]], bool], timeout: float) -> bool:
        """Spark Connect: check the reports again each time the listener saw an event."""
        deadline = time.monotonic() + timeout
        while True:
            with self._changed:
                seen = self._events
            reports = self.reports
            self._raise_failure()
            if reports and condition(reports):
                return True
            if not self._next_event(seen, deadline - time.monotonic()):
                return False

    def _next_event(self, seen: int, timeout: float) -> bool:
        """Wait for an event after the ``seen`` first ones; False when the time is up first."""
        with self._changed:
            return timeout > 0 and self._changed.wait_for(lambda: self._events != seen, timeout)

    def close(self) -> None:
        """Stop listening to the query's events (Spark Connect; nothing to do on classic)."""
        if self._listener is not None:
            self._read_published()  # what the last events announced, while still listening
            self.store.spark.streams.removeListener(self._listener)
            self._listener = None

    @property
    def reports(self) -> list[BatchReport]:
        """One report per micro-batch run by this object, in micro-batch order (on Spark
        Connect: read from the checkpoint, which holds the last ``state_window + keep_versions``)."""
        if self._connect:
            self._read_published()
        with self._changed:
            return [self._reports[b] for b in sorted(self._reports)]

    @property
    def parked(self) -> int:
        reports = self.reports
        return reports[-1].parked if reports else 0

    def _raise_failure(self) -> None:
        with self._changed:
            failure = self._ended.get(self._query_run)
            if failure is not None:
                self._failure = RuntimeError(f"the query failed: {failure}")
        if self._failure is not None:
            raise self._failure

    # ------------------------------------------------------------------ what happened

    def _process(self, batch: DataFrame, batch_id: int) -> None:
        """Classic sessions: the micro-batch runs here, its report and failure arrive directly."""
        try:
            report = self._batch(batch, batch_id)
        except BaseException as exc:
            with self._changed:
                self._failure = exc
                self._changed.notify_all()
            short = short_for_spark(exc)
            if short is None:
                raise
            if reads_as_a_stop(short):  # nothing committed: it runs again at the next start
                log.info("key_ordered_stream: the query stopped while micro-batch %d ran", batch_id)
            else:
                log.error("key_ordered_stream: micro-batch %d failed", batch_id, exc_info=exc)
            raise short from None  # Spark reads a long py4j error into a stack overflow
        self._add(report)

    def _add(self, report: BatchReport) -> None:
        with self._changed:
            self._reports[report.batch_id] = report
            self._changed.notify_all()

    def _read_published(self) -> None:
        for line in self.store.published():
            report = BatchReport.from_json(line)
            if report.run in self._runs:
                self._add(report)

    def _event(self, ended: str | None = None, failure: str | None = None) -> None:
        with self._changed:
            if ended is not None:
                self._ended[ended] = failure
            self._events += 1
            self._changed.notify_all()


class _Progress(StreamingQueryListener):
    """Spark Connect, client side: tells a stream when a micro-batch ended or a query
    terminated (of any query: the stream then reads its reports again, and keeps the error of
    the query it started)."""

    def __init__(self, stream: KeyedStream) -> None:
        self._stream = stream

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        self._stream._event()

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        self._stream._event(str(event.runId), event.exception)


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
        *[F.lit(None).cast(f.dataType).alias(f.name) for f in df.schema.fields], F.lit(True).alias(TICK)
    )
    return df.withColumn(TICK, F.lit(False)).unionByName(ticks)


def parking_stage(plan: Any, schema: StructType) -> Callable[[DataFrame, ParkingPlan], DataFrame]:
    """The mapInArrow stage a :class:`KeyedStream` runs per micro-batch."""
    from functools import partial

    from .parked import run_parking_partition

    return lambda both, parking: both.mapInArrow(partial(run_parking_partition, plan, parking), schema)


def error_handling(
    on_error: str | None, defer: DeferPolicy | None, max_defer_age: float | None, error_column: str | None
) -> tuple[DeferPolicy | None, str | None]:
    """The stream's deferral and error column, from its options.

    ``defer=DeferPolicy(...)`` defers (``max_age`` its age limit) and ``error_column`` keeps
    failures as rows, as in every wait; a stream that defers or keeps failures gets
    ``"_error"`` when no error column is named. ``on_error`` and ``max_defer_age`` are the
    0.1 spellings of the same: they work for a release, with a ``DeprecationWarning`` naming
    the new one, and contradicting the new spelling is an error."""
    if on_error is not None:
        on_error = check_choice("on_error", on_error, ("fail", "emit", "defer"))
        replacement = {"fail": "nothing (failing is the default)", "emit": "error_column='_error'"}
        _deprecated("on_error", replacement.get(on_error, "defer=DeferPolicy()"))
        if on_error == "fail" and (defer is not None or max_defer_age is not None):
            allowed = "'defer' (or no on_error) when defer= or max_defer_age= is given"
            raise ConfigError("on_error", on_error, allowed)
        if on_error == "emit" and error_column is None:
            error_column = "_error"
        if on_error == "defer" and defer is None:
            defer = DeferPolicy()
    if max_defer_age is not None:
        _deprecated("max_defer_age", "defer=DeferPolicy(max_age=...)")
        if defer is not None and defer.max_age is not None and defer.max_age != max_defer_age:
            allowed = f"None when defer= says max_age={defer.max_age}"
            raise ConfigError("max_defer_age", max_defer_age, allowed)
        defer = replace(defer or DeferPolicy(), max_age=max_defer_age)
    if defer is not None and not isinstance(defer, DeferPolicy):
        raise ConfigError("defer", defer, "a DeferPolicy(delay=..., max_age=...) or None")
    if defer is not None and error_column is None:
        error_column = "_error"  # a row deferred past its age leaves with its cause
    return defer, error_column


def _deprecated(name: str, instead: str) -> None:
    warnings.warn(
        f"key_ordered_stream's {name}= is deprecated and goes in the next release; use {instead}",
        DeprecationWarning,
        stacklevel=6,  # the caller of key_ordered_stream
    )

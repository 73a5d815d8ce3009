"""AsyncDataStream: the operator over Spark DataFrames, batch and Structured Streaming.

    out = AsyncDataStream.key_ordered_wait(orders, users, key="order_id", order_by="offset")

Each call returns a DataFrame with the input columns plus the result columns. The work runs in
``mapInArrow`` with one event loop and one set of clients per Python worker process.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from pyspark import AccumulatorParam, SparkContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, StringType, StructField, StructType

from ..core.backlog import BacklogPolicy
from ..core.config import PREFIX, AsyncLookupConfig
from ..core.elements import OutputMode
from ..core.exceptions import ConfigError
from ..core.keys import WHOLE_RECORD, field_names
from ..core.latency import LatencyHistogram
from ..core.parking import DeferPolicy
from ..core.retry import RetryStrategy
from ..core.settings import OperatorSettings, check_instance, check_positive_int, check_seconds
from .parked import STATE_COLUMN, ParkingPlan
from .stream import STATE_STRUCT, KeyedStream, defer_policy, parking_stage
from .worker import Plan, run_partition

__all__ = ["AsyncDataStream", "AsyncWaitMetrics"]

ERROR_STRUCT = StructType(
    [
        StructField("error_type", StringType()),
        StructField("error_message", StringType()),
        StructField("attempts", IntegerType()),
    ]
)


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


def session_config(spark: SparkSession) -> AsyncLookupConfig:
    """The session's ``spark.sql.exec.async-lookup.*`` settings, checked (a misspelt key is an
    error naming the closest known one)."""
    conf = spark.conf
    present = {k: v for k, v in conf.getAll.items() if k.startswith(PREFIX)}
    return AsyncLookupConfig.from_mapping(present)


def session_time_zone(spark: SparkSession) -> str:
    return str(spark.conf.get("spark.sql.session.timeZone"))


def _schema_of(spark: SparkSession, schema: Any, fn: Any) -> StructType:
    if schema is None:
        derive = getattr(fn, "output_schema", None)
        schema = derive() if callable(derive) else None
        if schema is None:
            raise ConfigError(
                "output_schema",
                None,
                "a DDL string ('name string, score double') or a StructType; lookups with declared "
                "fields= derive it themselves",
            )
    if isinstance(schema, StructType):
        return schema
    if isinstance(schema, str):
        try:
            parsed = StructType.fromDDL(schema)
            assert isinstance(parsed, StructType)
        except Exception as exc:
            raise ConfigError("output_schema", schema, f"a valid DDL string ({exc})") from exc
        return parsed
    raise ConfigError("output_schema", schema, "a DDL string or a StructType")


def _arrow_schema(schema: StructType, time_zone: str) -> Any:
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_type

    fields = []
    for field in schema.fields:
        try:
            kind = to_arrow_type(field.dataType, timezone=time_zone)
        except Exception as exc:  # pyspark names no column: we do
            raise ConfigError(
                f"column {field.name!r}",
                field.dataType.simpleString(),
                f"a type Arrow can carry to Python ({type(exc).__name__}: {exc}); cast it first",
            ) from exc
        fields.append(pa.field(field.name, kind, nullable=field.nullable))
    return pa.schema(fields)


class AsyncDataStream:
    """Flink's ``AsyncDataStream`` for Spark DataFrames (batch and streaming)."""

    @staticmethod
    def ordered_wait(df: DataFrame, fn: Any, **options: Any) -> DataFrame:
        """Results in input order within each partition."""
        return _wait(df, fn, OutputMode.ORDERED, **options)

    @staticmethod
    def unordered_wait(df: DataFrame, fn: Any, **options: Any) -> DataFrame:
        """Results as they complete; may reorder rows within a partition."""
        return _wait(df, fn, OutputMode.UNORDERED, **options)

    @staticmethod
    def key_ordered_wait(
        df: DataFrame,
        fn: Any,
        key: str | Sequence[str] | Any,
        *,
        order_by: str | Sequence[str] | None = None,
        assume_partitioned: bool = False,
        num_partitions: int | None = None,
        **options: Any,
    ) -> DataFrame:
        """Rows with the same ``key`` (the upsert key) are processed one at a time in arrival
        order, different keys concurrently.

        Each key is co-located in one partition (``repartition`` by the key, unless
        ``assume_partitioned``); within the partition, arrival order is ``order_by`` when given
        (a Kafka offset, an event time, a sequence number), otherwise the order in which Spark
        delivers the rows, which after a shuffle is not the source order: give ``order_by`` for
        update streams.
        """
        columns = _key_columns(df, key)
        sort_by = _order_columns(df, order_by) or None
        check_positive_int("num_partitions", num_partitions, optional=True)
        if not assume_partitioned:
            df = df.repartition(_partitions(df.sparkSession, num_partitions), *columns)
        if sort_by and not df.isStreaming:
            df = df.sortWithinPartitions(*sort_by)
            sort_in_task = None
        else:
            sort_in_task = sort_by  # streaming: Spark rejects sortWithinPartitions
        return _wait(
            df,
            fn,
            OutputMode.KEY_ORDERED,
            key=columns[0] if len(columns) == 1 else columns,
            _sort_in_task=sort_in_task,
            **options,
        )

    @staticmethod
    def key_ordered_stream(
        df: DataFrame, fn: Any, key: str | Sequence[str] | Any, **options: Any
    ) -> KeyedStream:
        """``key_ordered_wait`` for Structured Streaming with unfinished rows kept as keyed state
        across micro-batches (FLIP-455/519); see :mod:`keyed_async_wait.spark.stream` and
        :mod:`keyed_async_wait.spark.state`.

        Required: ``sink(df, batch_id)`` (make it idempotent per batch id: overwrite the
        batch's output) and ``checkpoint_location``. Options: ``order_by``; ``time_cap``
        (seconds a task may start work in one micro-batch; what has not finished then is
        parked, with every later row of its key); ``on_error="defer"`` (a row whose retries
        are exhausted is parked and retried in a later micro-batch, per ``defer``, a
        DeferPolicy; after ``max_defer_age`` seconds it becomes an error row); ``heartbeat``
        (seconds: keep micro-batches, and so retries of parked rows, going without new input;
        fixed per checkpoint); ``num_partitions``; ``keep_versions`` (>= 2); ``replay_rows``
        (parked rows replayed per micro-batch at most; default 4x the last micro-batch's output,
        at least 10,000); ``state_window`` (micro-batches a segment of state lives before it is
        compacted; 16); and the options of ``key_ordered_wait``.
        """
        return _key_ordered_stream(df, fn, key, **options)


def _key_ordered_stream(
    df: DataFrame,
    fn: Any,
    key: str | Sequence[str] | Any,
    *,
    sink: Callable[[DataFrame, int], None],
    checkpoint_location: str,
    order_by: str | Sequence[str] | None = None,
    time_cap: float | None = None,
    on_error: str = "fail",
    defer: DeferPolicy | None = None,
    max_defer_age: float | None = None,
    error_column: str | None = None,
    heartbeat: float | None = None,
    num_partitions: int | None = None,
    keep_versions: int = 3,
    replay_rows: int | None = None,
    state_window: int = 16,
    **options: Any,
) -> KeyedStream:
    if not df.isStreaming:
        raise ConfigError("df", "a batch DataFrame", "a streaming DataFrame (spark.readStream...)")
    if STATE_COLUMN in df.columns:
        raise ConfigError("df", STATE_COLUMN, f"a DataFrame without a column named {STATE_COLUMN}")
    if on_error not in ("fail", "emit", "defer"):
        raise ConfigError("on_error", on_error, "'fail', 'emit', 'defer'")
    check_seconds("time_cap", time_cap, optional=True)
    check_seconds("heartbeat", heartbeat, optional=True)
    if heartbeat is not None and heartbeat < 1:
        raise ConfigError("heartbeat", heartbeat, "seconds >= 1, or None (micro-batches only on new input)")
    columns = _key_columns(df, key)
    sort_by = _order_columns(df, order_by)
    check_positive_int("num_partitions", num_partitions, optional=True)
    check_positive_int("keep_versions", keep_versions)
    check_positive_int("replay_rows", replay_rows, optional=True)
    check_positive_int("state_window", state_window)
    _check_state_types(df.schema)
    if on_error != "fail" and error_column is None:
        error_column = "_error"  # failed (or too long deferred) rows come out with their cause
    parking = ParkingPlan(time_cap, defer_policy(on_error, defer, max_defer_age))
    key_arg: Any = columns[0] if len(columns) == 1 else columns
    passthrough = [StructField(STATE_COLUMN, STATE_STRUCT, True)]

    plan, out, _ = _make_plan(  # built once: bad options fail now
        df.withColumn(STATE_COLUMN, F.lit(None).cast(STATE_STRUCT)),
        fn,
        OutputMode.KEY_ORDERED,
        key=key_arg,
        error_column=error_column,
        _passthrough=passthrough,
        **options,
    )
    return KeyedStream(
        df,
        parking_stage(plan, out),
        parking,
        key_columns=columns,
        order_by=sort_by,
        sink=sink,
        checkpoint_location=checkpoint_location,
        num_partitions=num_partitions,
        heartbeat=heartbeat,
        keep_versions=keep_versions,
        replay_rows=replay_rows,
        state_window=state_window,
    )


def _check_state_types(schema: StructType) -> None:
    """Parked rows are kept as parquet, which Spark cannot write for a TIME value."""
    for field in schema.fields:
        if "time(" in field.dataType.simpleString().replace("timestamp", ""):
            raise ConfigError(
                f"column {field.name!r}",
                field.dataType.simpleString(),
                "a type parquet holds: key_ordered_stream keeps parked rows as parquet, and Spark "
                "writes no TIME to parquet; cast it to a string first",
            )


def _partitions(spark: SparkSession, num_partitions: int | None) -> int:
    """``num_partitions``, else ``spark.sql.shuffle.partitions``."""
    if num_partitions is not None:
        return num_partitions
    return int(spark.conf.get("spark.sql.shuffle.partitions", "200") or 200)


def _key_columns(df: DataFrame, key: Any) -> list[str]:
    columns = list(df.columns) if key is WHOLE_RECORD else field_names(key)
    if columns is None:
        raise ConfigError("key", key, "a column name, a list of column names, or WHOLE_RECORD")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ConfigError(
            "key", key, f"columns of the DataFrame ({', '.join(df.columns)}); missing: {missing}"
        )
    return list(columns)


def _order_columns(df: DataFrame, order_by: str | Sequence[str] | None) -> list[str]:
    if order_by is None:
        return []
    sort_by = [order_by] if isinstance(order_by, str) else list(order_by)
    absent = [c for c in sort_by if c not in df.columns]
    if absent:
        raise ConfigError("order_by", order_by, f"columns of the DataFrame; missing: {absent}")
    return sort_by


def _wait(
    df: DataFrame,
    fn: Any,
    mode: OutputMode,
    *,
    observe: str | None = None,
    **options: Any,
) -> DataFrame:
    if observe is not None and (not isinstance(observe, str) or not observe):
        raise ConfigError("observe", observe, "a name for Spark's observed metrics, or None")
    plan, out, results = _make_plan(df, fn, mode, **options)
    enriched = df.mapInArrow(partial(run_partition, plan), out)
    if observe is None:
        return enriched
    # Spark's observed metrics: per batch query, or per micro-batch in the streaming query progress
    first = F.col(results.fieldNames()[0])
    measures = [
        F.count(F.lit(1)).alias("rows"),
        F.sum(F.when(first.isNull(), 1).otherwise(0)).alias("misses"),
    ]
    if plan.error_column is not None:
        measures.append(F.sum(F.when(F.col(plan.error_column).isNotNull(), 1).otherwise(0)).alias("errors"))
    return enriched.observe(observe, *measures)


def _make_plan(
    df: DataFrame,
    fn: Any,
    mode: OutputMode,
    *,
    key: Any = None,
    timeout: float | None = None,
    capacity: int | None = None,
    retry: RetryStrategy | None = None,
    output_schema: Any = None,
    join: str = "left",
    error_column: str | None = None,
    batch_size: int | None = 1000,
    metrics: AsyncWaitMetrics | None = None,
    backlog: bool | str | BacklogPolicy | None = None,
    event_time: str | None = None,
    _sort_in_task: list[str] | None = None,
    _passthrough: Sequence[StructField] = (),
) -> tuple[Plan, StructType, StructType]:
    """The task plan, the output schema and the result columns' schema; every option checked
    here, on the driver, before any job (the tasks only run what passed)."""
    spark = df.sparkSession
    conf = session_config(spark)
    if join not in ("left", "inner"):
        raise ConfigError("join", join, "'left' (keep rows whose lookup missed) or 'inner' (drop them)")
    check_instance("metrics", metrics, AsyncWaitMetrics, "an AsyncWaitMetrics(spark), or None")
    settings = OperatorSettings(
        mode=mode,
        key=key,
        capacity=capacity if capacity is not None else conf.buffer_capacity,
        timeout=timeout if timeout is not None else conf.timeout,
        retry=retry if retry is not None else conf.retry(),
        batch_size=batch_size,
    )
    passthrough = [f.name for f in _passthrough]
    columns = [c for c in df.columns if c not in passthrough]
    _check_inputs(fn, columns)
    results = _schema_of(spark, output_schema, fn)
    twice = sorted({n for n in results.fieldNames() if results.fieldNames().count(n) > 1})
    if twice:
        raise ConfigError("output_schema", output_schema, f"result columns named once each; twice: {twice}")
    clash = [f.name for f in results.fields if f.name in df.columns]
    if clash:
        raise ConfigError(
            "output_schema", output_schema, f"result columns not already in the input; clashing: {clash}"
        )
    fields = [f for f in df.schema.fields if f.name not in passthrough]
    fields += [StructField(f.name, f.dataType, True) for f in results.fields]
    if error_column is not None:
        if not isinstance(error_column, str) or not error_column:
            raise ConfigError("error_column", error_column, "a column name, or None")
        if error_column in df.columns or error_column in results.fieldNames():
            raise ConfigError("error_column", error_column, "a column name not already used")
        fields.append(StructField(error_column, ERROR_STRUCT, True))
    if event_time is not None and event_time not in df.columns:
        raise ConfigError("event_time", event_time, f"a column of the DataFrame ({', '.join(df.columns)})")
    out = StructType(fields + list(_passthrough))
    time_zone = session_time_zone(spark)
    plan = Plan(
        token=uuid.uuid4().hex,
        function=fn,
        settings=settings,
        join=join,
        input_columns=columns,
        result_columns=results.fieldNames(),
        out_schema=_arrow_schema(out, time_zone),
        error_column=error_column,
        session_tz=time_zone,
        passthrough=tuple(passthrough),
        sort_by=_sort_in_task,
        metrics=metrics,
        backlog=_backlog_policy(backlog),
        bounded=not df.isStreaming,
        event_time=event_time,
    )
    return plan, out, results


def _check_inputs(fn: Any, columns: Sequence[str]) -> None:
    """A lookup whose templates name a field the DataFrame lacks fails now, naming it (in a
    task it would fail every row, or, in SQL's null-key rule, miss every row)."""
    derive = getattr(fn, "input_fields", None)
    needed = tuple(derive()) if callable(derive) else ()
    missing = [name for name in needed if name not in columns]
    if missing:
        raise ConfigError(
            f"{fn!r} input field",
            missing[0],
            f"a column of the DataFrame ({', '.join(columns)}); the lookup reads {', '.join(needed)}",
        )


def _backlog_policy(backlog: bool | str | BacklogPolicy | None) -> BacklogPolicy | None:
    if backlog is None or isinstance(backlog, BacklogPolicy):
        return backlog
    if isinstance(backlog, bool):
        return BacklogPolicy(is_backlog=backlog)
    if backlog == "auto":
        return BacklogPolicy()
    raise ConfigError("backlog", backlog, "None (fixed settings), True, False, 'auto', or a BacklogPolicy")


def split_errors(df: DataFrame, error_column: str = "_error") -> tuple[DataFrame, DataFrame]:
    """``(rows that succeeded, rows that failed)`` of an output with an error column."""
    failed = F.col(error_column).isNotNull()
    return df.where(~failed).drop(error_column), df.where(failed)

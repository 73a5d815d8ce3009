"""A wait's options, checked on the driver when the call is made, into a :class:`Plan`.

:func:`make_plan` turns a DataFrame, a function and the options of a wait into the task plan
and the output schema; a bad option fails here, before any job, naming itself and what is
allowed. The session's ``spark.sql.exec.async-lookup.*`` settings fill what the call leaves out.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import IntegerType, StringType, StructField, StructType

from ..core.backlog import BacklogPolicy
from ..core.config import PREFIX, AsyncLookupConfig
from ..core.elements import OutputMode
from ..core.exceptions import ConfigError
from ..core.keys import WHOLE_RECORD, field_names
from ..core.retry import RetryStrategy
from ..core.settings import check_instance
from ..runtime.function import declared_inputs, declared_output_schema
from .compat import arrow_type, parse_schema, session_settings
from .metrics import TASK_COLUMN, AsyncWaitMetrics, task_struct
from .plan import Plan

__all__ = [
    "ERROR_STRUCT",
    "WaitOptions",
    "key_columns",
    "make_plan",
    "order_columns",
    "partitions",
    "session_config",
    "session_time_zone",
]

ERROR_STRUCT = StructType(
    [
        StructField("error_type", StringType()),
        StructField("error_message", StringType()),
        StructField("attempts", IntegerType()),
    ]
)


def session_config(spark: SparkSession) -> AsyncLookupConfig:
    """The session's ``spark.sql.exec.async-lookup.*`` settings, checked (a misspelt key is an
    error naming the closest known one)."""
    return AsyncLookupConfig.from_mapping(session_settings(spark, PREFIX))


def session_time_zone(spark: SparkSession) -> str:
    return str(spark.conf.get("spark.sql.session.timeZone"))


def schema_of(spark: SparkSession, schema: Any, fn: Any) -> StructType:
    if schema is None:
        schema = declared_output_schema(fn)
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
            parsed = parse_schema(schema)
        except Exception as exc:
            raise ConfigError("output_schema", schema, f"a valid DDL string ({exc})") from exc
        return parsed
    raise ConfigError("output_schema", schema, "a DDL string or a StructType")


def arrow_schema(schema: StructType, time_zone: str) -> Any:
    import pyarrow as pa

    fields = []
    for field in schema.fields:
        try:
            kind = arrow_type(field.dataType, time_zone)
        except Exception as exc:  # pyspark names no column: we do
            raise ConfigError(
                f"column {field.name!r}",
                field.dataType.simpleString(),
                f"a type Arrow can carry to Python ({type(exc).__name__}: {exc}); cast it first",
            ) from exc
        fields.append(pa.field(field.name, kind, nullable=field.nullable))
    return pa.schema(fields)


def partitions(spark: SparkSession, num_partitions: int | None) -> int:
    """``num_partitions``, else ``spark.sql.shuffle.partitions``."""
    if num_partitions is not None:
        return num_partitions
    return int(spark.conf.get("spark.sql.shuffle.partitions", "200") or 200)


def key_columns(df: DataFrame, key: Any) -> list[str]:
    columns = list(df.columns) if key is WHOLE_RECORD else field_names(key)
    if columns is None:
        raise ConfigError("key", key, "a column name, a list of column names, or WHOLE_RECORD")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ConfigError(
            "key", key, f"columns of the DataFrame ({', '.join(df.columns)}); missing: {missing}"
        )
    return list(columns)


def order_columns(df: DataFrame, order_by: str | Sequence[str] | None) -> list[str]:
    if order_by is None:
        return []
    sort_by = [order_by] if isinstance(order_by, str) else list(order_by)
    absent = [c for c in sort_by if c not in df.columns]
    if absent:
        raise ConfigError("order_by", order_by, f"columns of the DataFrame; missing: {absent}")
    return sort_by


@dataclass(frozen=True)
class WaitOptions:
    """The options of a wait as the caller gave them, built once per call; :func:`make_plan`
    checks them. The key-ordered ones (``key`` onwards) are set by those calls only."""

    timeout: float | None = None
    capacity: int | None = None
    retry: RetryStrategy | None = None
    output_schema: str | StructType | None = None
    join: str = "left"
    error_column: str | None = None
    batch_size: int | None = 1000
    metrics: AsyncWaitMetrics | None = None
    backlog: bool | str | BacklogPolicy | None = None
    event_time: str | None = None
    key: Any = None
    blocked_capacity: int = 0
    sort_in_task: list[str] | None = None


def make_plan(
    df: DataFrame,
    fn: Any,
    mode: OutputMode,
    options: WaitOptions,
    passthrough: Sequence[StructField] = (),
) -> tuple[Plan, StructType, StructType]:
    """The task plan, the output schema and the result columns' schema; every option checked
    here, on the driver, before any job (the tasks only run what passed)."""
    spark = df.sparkSession
    conf = session_config(spark)
    join, error_column, event_time, metrics = (
        options.join,
        options.error_column,
        options.event_time,
        options.metrics,
    )
    output_schema = options.output_schema
    if join not in ("left", "inner"):
        raise ConfigError("join", join, "'left' (keep rows whose lookup missed) or 'inner' (drop them)")
    check_instance("metrics", metrics, AsyncWaitMetrics, "an AsyncWaitMetrics(spark), or None")
    explicit = dict(
        capacity=options.capacity,
        timeout=options.timeout,
        retry=options.retry,
        key=options.key,
        batch_size=options.batch_size,
    )
    settings = conf.operator_settings(mode, blocked_capacity=options.blocked_capacity, **explicit)
    passing = [f.name for f in passthrough]
    columns = [c for c in df.columns if c not in passing]
    _check_inputs(fn, columns)
    results = schema_of(spark, output_schema, fn)
    twice = sorted({n for n in results.fieldNames() if results.fieldNames().count(n) > 1})
    if twice:
        raise ConfigError("output_schema", output_schema, f"result columns named once each; twice: {twice}")
    clash = [f.name for f in results.fields if f.name in df.columns]
    if clash:
        raise ConfigError(
            "output_schema", output_schema, f"result columns not already in the input; clashing: {clash}"
        )
    fields = [f for f in df.schema.fields if f.name not in passing]
    fields += [StructField(f.name, f.dataType, True) for f in results.fields]
    if error_column is not None:
        if not isinstance(error_column, str) or not error_column:
            raise ConfigError("error_column", error_column, "a column name, or None")
        if error_column in df.columns or error_column in results.fieldNames():
            raise ConfigError("error_column", error_column, "a column name not already used")
        fields.append(StructField(error_column, ERROR_STRUCT, True))
    if event_time is not None and event_time not in df.columns:
        raise ConfigError("event_time", event_time, f"a column of the DataFrame ({', '.join(df.columns)})")
    observed = metrics is not None and metrics.observed
    if observed:
        fields, passthrough, passing = _with_task_column(fields, passthrough)
    out = StructType(fields + list(passthrough))
    time_zone = session_time_zone(spark)
    plan = Plan(
        token=uuid.uuid4().hex,
        function=fn,
        settings=settings,
        join=join,
        input_columns=columns,
        result_columns=results.fieldNames(),
        out_schema=arrow_schema(out, time_zone),
        error_column=error_column,
        session_tz=time_zone,
        passthrough=tuple(passing),
        sort_by=options.sort_in_task,
        metrics=None if observed else metrics,
        task_column=TASK_COLUMN if observed else None,
        backlog=_backlog_policy(options.backlog),
        bounded=not df.isStreaming,
        event_time=event_time,
    )
    return plan, out, results


def _with_task_column(
    fields: list[StructField], passthrough: Sequence[StructField]
) -> tuple[list[StructField], list[StructField], list[str]]:
    """Observed metrics: one row per task carries its counts; every other column is null in it."""
    if passthrough:
        raise ConfigError(
            "metrics",
            "an observing AsyncWaitMetrics on key_ordered_stream",
            "a classic session's AsyncWaitMetrics (accumulators)",
        )
    nullable = [StructField(f.name, f.dataType, True, f.metadata) for f in fields]
    return nullable, [StructField(TASK_COLUMN, task_struct(), True)], [TASK_COLUMN]


def _check_inputs(fn: Any, columns: Sequence[str]) -> None:
    """A lookup whose templates name a field the DataFrame lacks fails now, naming it (in a
    task it would fail every row, or, in SQL's null-key rule, miss every row)."""
    needed = declared_inputs(fn)
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

"""A wait's options, checked on the driver when the call is made, into its :class:`Plan`.

:func:`make_plan` turns a DataFrame, a function, the wait's :class:`WaitSpec` and its Spark
options into the task plan and the output schema (through :func:`plan_of`, the one builder);
a bad option fails here, before any job, naming itself and what is allowed. The session's
``spark.sql.exec.async-lookup.*`` settings fill what the call leaves out (:func:`wait_spec`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import IntegerType, StringType, StructField, StructType

from ..core.backlog import BacklogPolicy
from ..core.checks import check_instance
from ..core.elements import OutputMode
from ..core.exceptions import ConfigError
from ..core.keys import WHOLE_RECORD, field_names
from ..core.parking import DeferPolicy
from ..core.spec import WaitSpec
from ..runtime.backend import declared_inputs, declared_output_schema
from .compat import arrow_type, parse_schema
from .key_hash import check_byte_for_byte
from .metrics import TASK_COLUMN, AsyncWaitMetrics, task_struct
from .plan import Plan, plan_of
from .session import session_time_zone, session_view

__all__ = [
    "ERROR_STRUCT",
    "key_columns",
    "make_plan",
    "order_columns",
    "wait_spec",
]

ERROR_STRUCT = StructType(
    [
        StructField("error_type", StringType()),
        StructField("error_message", StringType()),
        StructField("attempts", IntegerType()),
    ]
)


def wait_spec(df: DataFrame, mode: OutputMode, **options: Any) -> WaitSpec:
    """The spec of a wait over ``df``: ``options`` checked, those given as None from the
    session's settings (a misspelt setting is an error naming the closest known one)."""
    return WaitSpec.resolve(session_view(df.sparkSession).operator, mode, **options)


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


def key_columns(df: DataFrame, key: Any) -> list[str]:
    columns = list(df.columns) if key is WHOLE_RECORD else field_names(key)
    if columns is None:
        raise ConfigError("key", key, "a column name, a list of column names, or WHOLE_RECORD")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ConfigError(
            "key", key, f"columns of the DataFrame ({', '.join(df.columns)}); missing: {missing}"
        )
    check_byte_for_byte(df.schema, "key", key, columns)
    return list(columns)


def order_columns(df: DataFrame, order_by: str | Sequence[str] | None) -> list[str]:
    if order_by is None:
        return []
    sort_by = [order_by] if isinstance(order_by, str) else list(order_by)
    absent = [c for c in sort_by if c not in df.columns]
    if absent:
        raise ConfigError("order_by", order_by, f"columns of the DataFrame; missing: {absent}")
    return sort_by


def make_plan(
    df: DataFrame,
    fn: Any,
    spec: WaitSpec,
    *,
    output_schema: str | StructType | None = None,
    join: str = "left",
    error_column: str | None = None,
    metrics: AsyncWaitMetrics | None = None,
    backlog: bool | str | BacklogPolicy | None = None,
    event_time: str | None = None,
    sort_in_task: list[str] | None = None,
    defer: DeferPolicy | None = None,
    parked: bool = False,
    passthrough: Sequence[StructField] = (),
) -> tuple[Plan, StructType, StructType]:
    """The task plan, the output schema and the result columns' schema; every Spark option
    checked here, on the driver, before any job (the tasks only run what passed). ``defer``,
    ``parked`` and ``passthrough``: ``key_ordered_stream``'s parked state."""
    if join not in ("left", "inner"):
        raise ConfigError("join", join, "'left' (keep rows whose lookup missed) or 'inner' (drop them)")
    check_instance("metrics", metrics, AsyncWaitMetrics, "an AsyncWaitMetrics(spark), or None")
    passing = [f.name for f in passthrough]
    columns = [c for c in df.columns if c not in passing]
    _check_inputs(fn, columns)
    results = _result_schema(df, output_schema, fn)
    fields = [f for f in df.schema.fields if f.name not in passing]
    fields += [StructField(f.name, f.dataType, True) for f in results.fields]
    if error_column is not None:
        _check_error_column(df, error_column, results)
        fields.append(StructField(error_column, ERROR_STRUCT, True))
    if sort_in_task:  # the tasks sort byte for byte (Spark sorts by the collation)
        check_byte_for_byte(df.schema, "order_by", sort_in_task, sort_in_task)
    if event_time is not None and event_time not in df.columns:
        raise ConfigError("event_time", event_time, f"a column of the DataFrame ({', '.join(df.columns)})")
    observed = metrics is not None and metrics.observed
    if observed:
        fields, passthrough, passing = _with_task_column(fields, passthrough)
    out = StructType(fields + list(passthrough))
    time_zone = session_time_zone(df.sparkSession)
    plan = plan_of(
        spec,
        fn,
        input_columns=columns,
        result_columns=results.fieldNames(),
        out_schema=arrow_schema(out, time_zone),
        session_tz=time_zone,
        join=join,
        error_column=error_column,
        defer=defer,
        parked=parked,
        passthrough=tuple(passing),
        sort_by=sort_in_task,
        metrics=None if observed else metrics,
        task_column=TASK_COLUMN if observed else None,
        backlog=_backlog_policy(backlog),
        bounded=not df.isStreaming,
        event_time=event_time,
    )
    return plan, out, results


def _result_schema(df: DataFrame, output_schema: Any, fn: Any) -> StructType:
    results = schema_of(df.sparkSession, output_schema, fn)
    names = results.fieldNames()
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError("output_schema", output_schema, f"result columns named once each; twice: {twice}")
    clash = [n for n in names if n in df.columns]
    if clash:
        raise ConfigError(
            "output_schema", output_schema, f"result columns not already in the input; clashing: {clash}"
        )
    return results


def _check_error_column(df: DataFrame, error_column: Any, results: StructType) -> None:
    if not isinstance(error_column, str) or not error_column:
        raise ConfigError("error_column", error_column, "a column name, or None")
    if error_column in df.columns or error_column in results.fieldNames():
        raise ConfigError("error_column", error_column, "a column name not already used")


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

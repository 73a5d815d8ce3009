"""``key_ordered_stream``'s builder: its options checked on the driver (the input a streaming
DataFrame whose columns its parked state can hold, the state's settings, the step journal's
chain) and built into a :class:`~keyed_async_wait.spark.stream.KeyedStream`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from ..core.checks import check_bool, check_positive_int, check_seconds
from ..core.elements import OutputMode
from ..core.exceptions import ConfigError
from ..core.keys import WHOLE_RECORD
from ..runtime.chain import Chain
from .column_names import misread
from .journal import ProgressJournal, journal_prefix
from .key_hash import map_key
from .options import key_columns, make_plan, order_columns, wait_spec
from .parked import STATE_COLUMN, ParkingPlan
from .stream import STATE_STRUCT, KeyedStream, error_handling, parking_stage

__all__ = ["build_key_ordered_stream"]

# key_ordered_stream's options, in the groups its builder takes them
_STREAM_OPTIONS = (
    ("timeout", "capacity", "retry", "batch_size", "blocked_capacity"),  # the operator's
    ("output_schema", "join", "error_column", "metrics"),  # the output's
    (  # the stream's and its parked state's
        *("time_cap", "on_error", "defer", "max_defer_age", "heartbeat", "keep_versions"),
        *("replay_rows", "state_window", "num_partitions", "step_journal", "assume_partitioned"),
    ),
)


def build_key_ordered_stream(given: dict[str, Any]) -> KeyedStream:
    """``AsyncDataStream.key_ordered_stream``'s arguments (its ``locals()``), checked and built
    into its stream."""
    operator, edge, state = ({name: given[name] for name in group} for group in _STREAM_OPTIONS)
    stream = (given["sink"], given["checkpoint_location"], given["order_by"])
    return _build(given["df"], given["fn"], given["key"], stream, state, operator, edge)


def _build(
    df: DataFrame,
    fn: Any,
    key: Any,
    stream: tuple[Callable[[DataFrame, int], None], str, str | Sequence[str] | None],
    state: dict[str, Any],
    operator: dict[str, Any],
    edge: dict[str, Any],
) -> KeyedStream:
    sink, checkpoint_location, order_by = stream
    if not df.isStreaming:
        raise ConfigError("df", "a batch DataFrame", "a streaming DataFrame (spark.readStream...)")
    if STATE_COLUMN in df.columns:
        raise ConfigError("df", STATE_COLUMN, f"a DataFrame without a column named {STATE_COLUMN}")
    misnamed = [c for c in df.columns if misread(c)]
    if misnamed:  # its state keeps the columns by name: the batch waits rename them, a stream cannot yet
        allowed = (
            "columns named without '.' or '`' in key_ordered_stream (Spark reads such a name as a path); "
        )
        allowed += f"rename it first, e.g. df.withColumnRenamed({misnamed[0]!r}, ...)"
        raise ConfigError("df column", misnamed[0], allowed)
    check_seconds("time_cap", state["time_cap"], optional=True)
    heartbeat = state["heartbeat"]
    check_seconds("heartbeat", heartbeat, optional=True)
    if heartbeat is not None and heartbeat < 1:
        raise ConfigError("heartbeat", heartbeat, "seconds >= 1, or None (micro-batches only on new input)")
    columns = key_columns(df, key)
    sort_by = order_columns(df, order_by)
    check_positive_int("num_partitions", state["num_partitions"], optional=True)
    check_positive_int("keep_versions", state["keep_versions"])
    check_positive_int("replay_rows", state["replay_rows"], optional=True)
    check_positive_int("state_window", state["state_window"])
    check_bool("assume_partitioned", state["assume_partitioned"])
    _check_state_types(df.schema, columns)
    defer, error_column = error_handling(
        state["on_error"], state["defer"], state["max_defer_age"], edge["error_column"]
    )
    edge = {**edge, "error_column": error_column}
    parking = ParkingPlan(state["time_cap"], **_journal_of(fn, state["step_journal"], checkpoint_location))
    spec = wait_spec(df, OutputMode.KEY_ORDERED, key=columns, **operator)
    passthrough = [StructField(STATE_COLUMN, STATE_STRUCT, True)]
    plan, out, _ = make_plan(  # built once: bad options fail now
        df.withColumn(STATE_COLUMN, F.lit(None).cast(STATE_STRUCT)),
        fn,
        spec,
        defer=defer,
        parked=True,
        passthrough=passthrough,
        **edge,
    )
    return KeyedStream(
        df,
        parking_stage(plan, out),
        parking,
        key_columns=columns,
        order_by=sort_by,
        sink=sink,
        checkpoint_location=checkpoint_location,
        num_partitions=state["num_partitions"],
        heartbeat=heartbeat,
        keep_versions=state["keep_versions"],
        replay_rows=state["replay_rows"],
        state_window=state["state_window"],
        assume_partitioned=state["assume_partitioned"],
        whole_record=key is WHOLE_RECORD,
    )


def _journal_of(fn: Any, journal: Any, checkpoint: str) -> dict[str, Any]:
    if journal is None:
        return {}
    if not isinstance(journal, ProgressJournal):
        raise ConfigError("step_journal", journal, "a StepJournal(url) (from lookup), or None")
    if not isinstance(fn, Chain):
        raise ConfigError("step_journal", journal, "None unless fn is a Chain (it journals a chain's steps)")
    return {"journal": journal, "journal_prefix": journal_prefix(checkpoint)}


def _check_state_types(schema: StructType, keys: list[str]) -> None:
    """Parked rows are kept as parquet, which Spark cannot write for a TIME value; their keys
    are compared with a micro-batch's in joins and distinct sets, which take no map."""
    mapped = map_key(schema, keys)
    if mapped is not None:
        raise ConfigError(
            f"key column {mapped!r}",
            schema[mapped].dataType.simpleString(),
            "a type Spark compares: key_ordered_stream joins a micro-batch's keys with its "
            "parked keys, and Spark compares no MAP (nor a VARIANT); key by to_json of it, "
            "or by other columns",
        )
    for field in schema.fields:
        if "time(" in field.dataType.simpleString().replace("timestamp", ""):
            raise ConfigError(
                f"column {field.name!r}",
                field.dataType.simpleString(),
                "a type parquet holds: key_ordered_stream keeps parked rows as parquet, and Spark "
                "writes no TIME to parquet; cast it to a string first",
            )

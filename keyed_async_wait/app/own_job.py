"""``kaw-enrich`` on your own data, the job: the session, the input read, the lookup applied in
the mode asked for, the output written (batch, or a stream until stopped) and the summary.

The :class:`~keyed_async_wait.app.own_data.Plan` it runs was checked before Spark started; the
columns it names are checked against the input's here, before anything is written.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from typing import Any

from ..core.retry import RetryStrategy
from .own_data import Plan, UsageError, check_columns, data_files, local_path
from .spark_session import new_session

__all__ = ["read_input", "run"]


def _session(plan: Plan) -> tuple[Any, bool]:
    """The active session (kaw-enrich called from Python: used, and left running), or a new one
    on --remote or --master; and whether it is ours to stop."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    return new_session(plan.master or "local[*]", plan.remote, plan.partitions), True


def _reader(spark: Any, plan: Plan, streaming: bool) -> Any:
    reader = (spark.readStream if streaming else spark.read).format(plan.format)
    if plan.format == "csv":
        reader = reader.option("header", True)
    return reader


def _schema(spark: Any, plan: Plan) -> Any:
    """--schema, parsed (a ``UsageError`` if it is no schema), or None."""
    if plan.schema is None:
        return None
    from pyspark.sql.types import StructType

    try:
        parsed = StructType.fromDDL(plan.schema) if hasattr(StructType, "fromDDL") else None
        if parsed is None:  # pyspark 3.5: Spark parses it
            parsed = spark.createDataFrame([], plan.schema).schema
    except Exception as exc:  # noqa: BLE001 - Spark's parse error, shown in short
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(
            "--schema", f"{plan.schema!r} is no schema ({first})", "a DDL schema, e.g. 'id long, name string'"
        ) from None
    return parsed


def read_input(spark: Any, plan: Plan) -> Any:
    """The input as a DataFrame: batch, or a stream whose schema is --schema or the one of the
    files already in the folder."""
    if plan.table is not None:
        if not spark.catalog.tableExists(plan.table):
            raise UsageError(
                "--table", f"{plan.table!r} is not in the session's catalog", "an existing table"
            )
        return spark.read.table(plan.table)
    schema = _schema(spark, plan)
    batch = _reader(spark, plan, streaming=False)
    if schema is not None:
        batch = batch.schema(schema)
    elif plan.format == "csv":
        batch = batch.option("inferSchema", True)
    if not plan.stream:
        return batch.load(plan.input)
    if schema is None:
        local = local_path(str(plan.input))
        if local is not None and not data_files(local):
            raise UsageError(
                "--schema",
                "not given, and the input folder has no files yet",
                "--schema DDL for an empty folder",
            )
        schema = batch.load(plan.input).schema
    return _reader(spark, plan, streaming=True).schema(schema).load(plan.input)


def _enrich(df: Any, plan: Plan) -> Any:
    from ..spark.api import AsyncDataStream

    options: dict[str, Any] = dict(
        timeout=plan.timeout,
        capacity=plan.capacity,
        retry=RetryStrategy.exponential_backoff(plan.retries, 0.1, 2.0),
        error_column=plan.error_column,
    )
    fn = plan.lookup()
    if plan.mode == "key_ordered":
        return AsyncDataStream.key_ordered_wait(
            df, fn, list(plan.key), order_by=list(plan.order_by) or None, **options
        )
    if plan.mode == "ordered":
        return AsyncDataStream.ordered_wait(df, fn, **options)
    return AsyncDataStream.unordered_wait(df, fn, **options)


def _writable(df: Any, output_format: str) -> Any:
    """CSV holds no structs, arrays or maps: such columns (the error column) become JSON text."""
    if output_format != "csv":
        return df
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, MapType, StructType

    nested = (StructType, ArrayType, MapType)
    return df.select(
        *[
            F.to_json(F.col(f"`{f.name}`")).alias(f.name)
            if isinstance(f.dataType, nested)
            else F.col(f"`{f.name}`")
            for f in df.schema.fields
        ]
    )


def _measures(plan: Plan, rows_name: str) -> list[Any]:
    """Rows counted as ``rows_name``, and with --error-column the failed ones as ``failed``."""
    from pyspark.sql import functions as F

    measures = [F.count(F.lit(1)).alias(rows_name)]
    if plan.error_column is not None:
        measures.append(F.count(F.col(plan.error_column)).alias("failed"))  # counts the non-NULL
    return measures


def _clear(*paths: str | None) -> None:
    for path in paths:
        local = local_path(path) if path is not None else None
        if local is not None and local.is_dir():
            shutil.rmtree(local)
        elif local is not None and local.exists():
            local.unlink()


def _run_batch(spark: Any, df: Any, plan: Plan) -> dict[str, Any]:
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    from ..spark.metrics import is_connect

    connect = is_connect(spark)  # a write's observations do not reach a Connect client
    seen_in, seen_out = Observation("kaw_enrich_in"), Observation("kaw_enrich_out")
    counted = df if connect else df.observe(seen_in, F.count(F.lit(1)).alias("rows_in"))
    enriched = _enrich(counted, plan)
    if not connect:
        enriched = enriched.observe(seen_out, *_measures(plan, "rows_out"))
    # a local output is empty or --overwrite was given (checked); another's: Spark refuses to replace it
    mode = "overwrite" if plan.overwrite or local_path(plan.output) is not None else "errorifexists"
    writer = _writable(enriched, plan.output_format).write.format(plan.output_format).mode(mode)
    if plan.output_format == "csv":
        writer = writer.option("header", True)
    writer.save(plan.output)
    if not connect:
        return {**seen_in.get, **seen_out.get}
    reader = spark.read.format(plan.output_format)
    written = (reader.option("header", True) if plan.output_format == "csv" else reader).load(plan.output)
    counts = written.agg(*_measures(plan, "rows_out")).first().asDict()
    return {"rows_in": df.count(), **counts}


def _run_stream(df: Any, plan: Plan) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from ..spark.compat import observed_progress

    if plan.overwrite:  # start over: the output and what the checkpoint remembers of it
        _clear(plan.output, plan.checkpoint)
    counted = df.observe("kaw_enrich_in", F.count(F.lit(1)).alias("rows_in"))
    enriched = _enrich(counted, plan).observe("kaw_enrich_out", *_measures(plan, "rows_out"))
    writer = _writable(enriched, plan.output_format).writeStream.format(plan.output_format)
    if plan.output_format == "csv":
        writer = writer.option("header", True)
    query = (
        writer.option("path", plan.output)
        .option("checkpointLocation", plan.checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"the query failed: {query.exception()}")
    totals: dict[str, Any] = {}
    for _, observed in observed_progress(query.recentProgress):
        for row in observed.values():
            for name, value in row.items():
                if isinstance(value, int):
                    totals[name] = totals.get(name, 0) + value
    return totals


def run(plan: Plan) -> dict[str, Any]:
    """The job: read, check the columns the flags name, enrich, write; returns the summary.
    Raises ``UsageError`` for a column that is not there (before anything is written)."""
    started = time.monotonic()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers run this Python, with this library
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    spark, ours = _session(plan)
    try:
        df = read_input(spark, plan)
        check_columns(plan, df.columns)
        counts = _run_stream(df, plan) if plan.stream else _run_batch(spark, df, plan)
    finally:
        if ours:
            spark.stop()
    summary: dict[str, Any] = {
        "input": plan.input if plan.input is not None else f"table {plan.table}",
        "mode": plan.mode,
        "stream": plan.stream,
        "rows_in": counts.get("rows_in", 0),  # a stream with no new files: no micro-batch
        "rows_out": counts.get("rows_out", 0),
    }
    if plan.error_column is not None:
        summary["failed_rows"] = counts.get("failed", 0)
    summary["wall_s"] = round(time.monotonic() - started, 2)
    summary["output"] = plan.output
    summary["output_format"] = plan.output_format
    return summary

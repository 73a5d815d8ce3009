"""What parked state costs per micro-batch while a backlog waits, incremental against full rewrite.

    ./run bench parked_state [--rows N] [--batches K]

A key_ordered_stream takes N rows (default 200,000) over 2,000 order ids in its first
micro-batch; the service behind 95% of the keys is down, so their rows are deferred (for an
hour) and stay parked while heartbeat micro-batches run. Measured over K heartbeat
micro-batches (default 6), in one run, on local[2]:

- incremental (the default, state window 16): a micro-batch finds the parked keys not due and
  leaves their rows where they are (no row read into Python, none written);
- full rewrite (state window 1): every micro-batch copies every parked row into a new segment,
  as the earlier store did (which also read every parked row into Python, each micro-batch).

Printed: seconds per heartbeat micro-batch, rows written, rows read into Python, and the ratios.
And the task memory for 10,000 and 200,000 rows in one task (it no longer grows with them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from pyspark.sql import SparkSession

from keyed_async_wait import AsyncDataStream, DeferPolicy

sys.path.insert(0, os.path.dirname(__file__))
from spark_throughput import local_spark

KEYS = 2_000
PAYLOAD = "repeat('x', 400) AS note"  # rows of a realistic width (about half a KiB)
SCHEMA = "seq long, order_id long, note string"


class Down(Exception):
    """The service behind most keys is down (retryable: the row is deferred)."""


async def flaky(row: dict[str, Any]) -> dict[str, Any]:
    if row["order_id"] % 20:
        raise Down(f"order {row['order_id']}")
    return {"v": row["seq"]}


async def echo(row: dict[str, Any]) -> dict[str, Any]:
    return {"v": row["seq"]}


def backlog(spark: SparkSession, work: Path, rows: int, batches: int, window: int) -> dict[str, float]:
    folder = work / f"in-{window}"
    spark.range(rows).selectExpr("id AS seq", f"id % {KEYS} AS order_id", PAYLOAD).write.parquet(str(folder))
    stream = AsyncDataStream.key_ordered_stream(
        spark.readStream.schema(SCHEMA).parquet(str(folder)),
        flaky,
        "order_id",
        order_by="seq",
        sink=lambda df, batch_id: df.write.format("noop").mode("overwrite").save(),
        checkpoint_location=str(work / f"cp-{window}"),
        output_schema="v long",
        defer=DeferPolicy(delay=3600.0),
        heartbeat=1,
        state_window=window,
    )
    query = stream.start(processingTime="1 second")
    try:
        assert stream.wait_until(lambda r: len(r) >= batches + 2, 600)
    finally:
        query.stop()
    quiet = stream.reports[2 : batches + 2]  # after the first batch parked the backlog
    if window == 1:
        python = [_through_python(spark, stream.store, quiet[-1].batch_id) for _ in range(3)]
    return {
        "parked": quiet[-1].parked,
        "seconds": statistics.median(r.seconds for r in quiet),
        "written": statistics.median(r.written for r in quiet),
        "read_into_python": statistics.median(r.replayed for r in quiet),
        **({"through_python_seconds": statistics.median(python)} if window == 1 else {}),
    }


def _through_python(spark: SparkSession, store: Any, batch_id: int) -> float:
    """What the earlier store did with every parked row, every micro-batch: read the version,
    repartition and sort it, pass every row through Python (Arrow to dicts and back), write it."""
    from keyed_async_wait.spark.stream import KeyedStream  # noqa: F401 - the schema below

    version = store._read_version(batch_id)
    schema = spark.read.parquet(store.path("seg", version.segments[0].batch)).schema
    rows = store.live(version, schema, ["order_id"])
    start = time.perf_counter()

    def through(batches: Any) -> Any:
        import pyarrow as pa

        for batch in batches:
            yield pa.RecordBatch.from_pylist(batch.to_pylist(), schema=batch.schema)

    out = rows.repartition(2, "order_id").sortWithinPartitions("_kaw_parked.seg", "_kaw_parked.order")
    out.mapInArrow(through, rows.schema).write.mode("overwrite").parquet(str(Path(store.root) / "bench-copy"))
    return time.perf_counter() - start


def memory(spark: SparkSession, work: Path, rows: int, run: int) -> float:
    folder = work / f"mem-{rows}-{run}"
    spark.range(rows).selectExpr("id AS seq", f"id % {KEYS} AS order_id", PAYLOAD).write.parquet(str(folder))
    stream = AsyncDataStream.key_ordered_stream(
        spark.readStream.schema(SCHEMA).parquet(str(folder)),
        echo,
        "order_id",
        order_by="seq",
        sink=lambda df, batch_id: df.write.format("noop").mode("overwrite").save(),
        checkpoint_location=str(work / f"cp-mem-{rows}-{run}"),
        output_schema="v long",
        num_partitions=1,
    )
    report = stream.run_available_now()
    assert report is not None and report.rows_out == rows
    return report.peak_task_mib


def holding(spark: SparkSession, rows: int) -> float:
    """The same rows in one task that reads its whole share into Python first (as the earlier
    store did): the memory that costs, measured the same way."""

    def hold_all(batches: Any) -> Any:
        import pyarrow as pa

        from keyed_async_wait.spark.memory import PeakMemory

        memory = PeakMemory()
        held = [row for batch in batches for row in batch.to_pylist()]
        yield pa.RecordBatch.from_pylist([{"kib": memory.growth_kib(), "rows": len(held)}])

    df = spark.range(rows).selectExpr("id AS seq", f"id % {KEYS} AS order_id", PAYLOAD).repartition(1)
    (row,) = df.mapInArrow(hold_all, "kib long, rows long").collect()
    return float(row.kib) / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--batches", type=int, default=6)
    args = parser.parse_args()
    spark = local_spark()
    with tempfile.TemporaryDirectory(prefix="kaw-bench-state-") as tmp:
        work = Path(tmp)
        incremental = backlog(spark, work, args.rows, args.batches, window=16)
        rewrite = backlog(spark, work, args.rows, args.batches, window=1)
        peaks = [(n, memory(spark, work, n, i)) for i, n in enumerate((10_000, 10_000, 200_000, 200_000))]
        held = [(n, holding(spark, n)) for n in (10_000, 200_000)]
    spark.stop()
    print(json.dumps({"incremental": incremental, "full_rewrite": rewrite}, indent=2))
    old = rewrite["seconds"] + rewrite["through_python_seconds"]
    print(
        f"heartbeat micro-batch with {incremental['parked']:,} rows parked: incremental "
        f"{incremental['seconds']:.2f} s, {incremental['written']:,.0f} rows written, "
        f"{incremental['read_into_python']:,.0f} read into Python; full rewrite {rewrite['seconds']:.2f} s "
        f"({rewrite['written']:,.0f} rows written, {rewrite['seconds'] / incremental['seconds']:.1f}x); "
        f"the earlier store, which also read every parked row into Python: about {old:.2f} s "
        f"({old / incremental['seconds']:.1f}x)"
    )
    print(
        "peak memory a task added, streaming: " + ", ".join(f"{n:,} rows {mib:.1f} MiB" for n, mib in peaks)
    )
    print("the same task holding its rows: " + ", ".join(f"{n:,} rows {mib:.1f} MiB" for n, mib in held))


if __name__ == "__main__":
    main()

"""One Spark job for ``benchmarks/cost.py``, in a process of its own: ours or hand-written.

    python benchmarks/peers/spark_job.py URL ROWS IN_FLIGHT {ours|hand} [--runs K]
                                         [--java-options OPTIONS]

``local[2]``, ROWS rows over 2,000 keys, a GET per row to ``URL/users/{user_id}``, IN_FLIGHT
requests at most across the job's two tasks (IN_FLIGHT / 2 per task): ``ours`` is
``key_ordered_wait`` (capacity IN_FLIGHT / 2, a 10 s timeout, 3 attempts),
``hand`` a ``mapInArrow`` with ``asyncio.gather`` over aiohttp behind a semaphore. The output
is checked in the same pass (a count, and a count of the rows whose name is the service's for
their key). The job runs K times in one session: the first on fresh Python workers, as a job
that starts its own session does, the others on the workers the first left.
Prints a JSON line per run: rows/s, and the CPU seconds of the whole process tree over the run
by part (Spark's Python workers, its JVM, this driver), read from /proc. ``--java-options``:
the JVM's options (``spark.driver.extraJavaOptions``; the JVM's defaults without it), as
``SHORT_JOB_JAVA_OPTIONS`` for a short job.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

sys.path.insert(0, os.path.dirname(__file__))
import proc_tree

KEYS = 2_000
TASKS = 2


def spark_part(pid: int, cmdline: str) -> str:
    if "pyspark.daemon" in cmdline or "pyspark.worker" in cmdline:
        return "workers"
    if pid == os.getpid():
        return "driver"
    return "jvm" if "java" in cmdline.split(" ", 1)[0] else "other"


def hand_written(url: str, per_task: int) -> Any:
    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import asyncio

        import aiohttp
        import pyarrow as pa

        async def enrich(rows: list[dict]) -> list[dict]:
            sem = asyncio.Semaphore(per_task)
            connector = aiohttp.TCPConnector(limit=per_task)
            async with aiohttp.ClientSession(connector=connector) as session:

                async def one(row: dict) -> dict:
                    async with sem, session.get(f"{url}/users/{row['user_id']}") as resp:
                        data = json.loads(await resp.read())
                    return {**row, "name": data["name"]}

                return await asyncio.gather(*(one(r) for r in rows))

        for batch in batches:
            yield pa.RecordBatch.from_pylist(asyncio.run(enrich(batch.to_pylist())))

    return run


def job(spark: SparkSession, url: str, rows: int, in_flight: int, kind: str) -> DataFrame:
    source = spark.range(rows, numPartitions=TASKS).select(
        F.col("id").alias("seq"),
        (F.col("id") % KEYS).alias("order_id"),
        (F.col("id") % KEYS).alias("user_id"),
    )
    per_task = in_flight // TASKS
    if kind == "hand":
        schema = "seq long, order_id long, user_id long, name string"
        return source.mapInArrow(hand_written(url, per_task), schema)
    from keyed_async_wait import AsyncDataStream, RetryStrategy
    from lookup import Field, HttpLookup

    lookup = HttpLookup(url + "/users/{user_id}", fields=[Field("name")], max_connections=per_task)
    return AsyncDataStream.key_ordered_wait(
        source,
        lookup,
        key="order_id",
        order_by="seq",
        num_partitions=TASKS,
        capacity=per_task,
        timeout=10.0,
        retry=RetryStrategy.fixed_delay(3, 0.1),
    )


def checked_run(spark: SparkSession, url: str, rows: int, in_flight: int, kind: str) -> dict[str, Any]:
    right = F.col("name") == F.concat(F.lit("user-"), F.col("user_id").cast("string"))
    before = proc_tree.by_part(proc_tree.tree(), spark_part)
    started = time.perf_counter()
    counted = job(spark, url, rows, in_flight, kind).agg(F.count("*"), F.count_if(right)).first()
    wall = time.perf_counter() - started
    cpu = proc_tree.spent(before, proc_tree.by_part(proc_tree.tree(), spark_part))
    if counted is None or counted[0] != rows or counted[1] != rows:
        raise SystemExit(f"{kind}: {counted} of {rows} rows came back right")
    return {"rows": rows, "rows_per_s": rows / wall, "cpu_s": cpu}


def flag(name: str) -> str | None:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else None


def main() -> None:
    url, rows, in_flight, kind = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    runs = int(flag("--runs") or 1)
    proc_tree.adopt_orphans()
    builder = SparkSession.builder
    if flag("--java-options"):
        builder = builder.config("spark.driver.extraJavaOptions", flag("--java-options"))
    spark = (
        builder.master(f"local[{TASKS}]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(TASKS))
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    for _ in range(runs):
        print(json.dumps(checked_run(spark, url, rows, in_flight, kind)), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()

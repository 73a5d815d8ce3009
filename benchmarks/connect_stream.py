"""What a key_ordered_stream costs per micro-batch on Spark Connect, beside a plain stream.

    ./run bench connect_stream [--per-batch 2500] [--files 40] [--rounds 1] [--spark-defaults]

A local Connect server (``local[2]``, two shuffle partitions, no adaptive execution, as the
classic ``streaming`` benchmark; ``--spark-defaults``: Spark's 200 and adaptive execution) in a
process of its own, and this process as its client. The same source as there (files of
``per-batch`` rows over 2,000 keys read with ``maxFilesPerTrigger=1`` and ``availableNow``),
the same 20 ms ``async def``, Spark's ``noop`` sink; ``foreachBatch`` runs in a Python process
of the server, as Connect has it. Per round: a plain stream (the sink alone), then
``key_ordered_stream`` with nothing parked. Printed, as medians over every micro-batch after
the first three: the micro-batch's seconds (Spark's ``triggerExecution``), of it Spark's own
work (all but ``addBatch``) and the ``foreachBatch`` function (``addBatch``), and for
``key_ordered_stream`` the seconds its reports give (the function up to its manifest, which the
report rides in); then ``key_ordered_wait`` over every file as one batch job, its rows/s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from streaming import KEYS, SCHEMA, WARM_UP, enrich

from keyed_async_wait.app.service import free_port

SKIP = WARM_UP + 1  # the first micro-batches also start the server's Python workers

_SERVER = """
import sys
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[2]")
    .config("spark.plugins", "org.apache.spark.sql.connect.SparkConnectPlugin")
    .config("spark.connect.grpc.binding.address", "127.0.0.1")
    .config("spark.connect.grpc.binding.port", sys.argv[1])
    .config("spark.ui.enabled", "false")
    .config("spark.sql.shuffle.partitions", sys.argv[2])
    .config("spark.sql.adaptive.enabled", sys.argv[3])
    .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    .getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
print("ready", flush=True)
sys.stdin.read()
spark.stop()
"""


def noop_sink(df: Any, batch_id: int) -> None:
    df.write.format("noop").mode("overwrite").save()


def figures(query: Any) -> dict[str, float]:
    steady = [json.loads(p.json) for p in query.recentProgress if p.numInputRows][SKIP:]
    seconds = [p["durationMs"]["triggerExecution"] / 1000 for p in steady]
    function = [p["durationMs"]["addBatch"] / 1000 for p in steady]
    return {
        "micro_batches": len(steady),
        "seconds": round(statistics.median(seconds), 3),
        "spark_own": round(statistics.median(s - f for s, f in zip(seconds, function, strict=True)), 3),
        "function": round(statistics.median(function), 3),
    }


def one_round(spark: Any, folder: Path, work: Path) -> dict[str, dict[str, float]]:
    from keyed_async_wait import AsyncDataStream

    def source() -> Any:
        return spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(folder))

    plain = source().writeStream.foreachBatch(noop_sink)
    query = plain.option("checkpointLocation", str(work / "cp-plain")).trigger(availableNow=True).start()
    query.awaitTermination()
    out = {"plain": figures(query)}
    keyed = AsyncDataStream.key_ordered_stream(
        source(),
        enrich,
        "order_id",
        order_by="seq",
        sink=noop_sink,
        checkpoint_location=str(work / "cp-keyed"),
        output_schema="v long",
        capacity=200,
    )
    query = keyed.start(availableNow=True)
    query.awaitTermination()
    out["keyed"] = figures(query)
    out["keyed"]["reported"] = round(statistics.median(r.seconds for r in keyed.reports[SKIP:]), 3)
    out["batch"] = batch_job(spark, folder)
    return out


def batch_job(spark: Any, folder: Path) -> dict[str, float]:
    """``key_ordered_wait`` over every file at once, as a batch job (Spark's ``noop`` sink)."""
    from keyed_async_wait import AsyncDataStream

    rows = spark.read.parquet(str(folder))
    started = time.monotonic()
    waited = AsyncDataStream.key_ordered_wait(
        rows, enrich, "order_id", order_by="seq", output_schema="v long", capacity=200
    )
    waited.write.format("noop").mode("overwrite").save()
    seconds = time.monotonic() - started
    return {"rows": rows.count(), "seconds": round(seconds, 3)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--per-batch", type=int, default=2500)
    parser.add_argument("--files", type=int, default=40, help="micro-batches a stream runs")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--spark-defaults", action="store_true", help="200 shuffle partitions, adaptive")
    args = parser.parse_args()
    port = free_port()
    here = Path(__file__).resolve().parent  # the server's workers unpickle enrich from here
    path = os.pathsep.join(p for p in (str(here), str(here.parent), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": path}
    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _SERVER,
            str(port),
            *(("200", "true") if args.spark_defaults else ("2", "false")),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.remote(f"sc://127.0.0.1:{port}").getOrCreate()
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / "in"
            rows = spark.range(args.per_batch * args.files, numPartitions=1)
            rows = rows.selectExpr("id AS seq", f"id % {KEYS} AS order_id")
            rows.write.option("maxRecordsPerFile", args.per_batch).parquet(str(folder))
            results = [one_round(spark, folder, Path(tmp) / f"round-{r}") for r in range(args.rounds)]
        spark.stop()
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(120)
    for result in results:
        plain, keyed = result["plain"], result["keyed"]
        print(
            f"{args.per_batch:,} rows a micro-batch on Spark Connect: plain stream {plain['seconds']:.2f} s "
            f"a micro-batch (foreachBatch {plain['function']:.2f}); key_ordered_stream "
            f"{keyed['seconds']:.2f} s (plain + {keyed['seconds'] - plain['seconds']:.2f}; Spark's own "
            f"{keyed['spark_own']:.2f}, foreachBatch {keyed['function']:.2f}, of it up to the "
            f"manifest {keyed['reported']:.2f}); key_ordered_wait over every file as a batch job "
            f"{result['batch']['rows'] / result['batch']['seconds']:,.0f} rows/s"
        )
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

"""A service outage in the middle of a key-ordered stream: the circuit breaker against retries.

    ./run bench outage [--rows N] [--outage S]

Input: N rows (N / 10 order ids, ten updates each) in 20 files, one file per micro-batch
(``key_ordered_stream``, ``processingTime`` 0.5 s, heartbeat 1 s, two tasks, capacity 100).
Once the second micro-batch is reported, the service (its own process, 20 ms) answers 503 to
every call for S seconds.

1. retries alone: ``exponential_backoff(200, 0.05, 0.25)``: each record waits the outage out in
   place, calling again after each back-off;
2. the breaker: ``Limits(breaker_failures=20, breaker_cool_off=1)`` with ``defer=DeferPolicy()``
   (retries ``fixed_delay(2, 0.05)``, ``DeferPolicy(delay=2, max_delay=4)``): after 20 failures
   in a row a worker stops calling and probes once a second; records fail at once, are parked
   with their key, and later micro-batches replay them once the circuit has closed.

Reported per path: the calls the service answered 503 during the outage, the breaker's against
the retries', the seconds until every row was in the sink, and the checks: every row reached the
sink once, and per order id in input order.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.request
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from keyed_async_wait import AsyncDataStream, DeferPolicy, RetryStrategy
from lookup import Field, HttpLookup, Limits

sys.path.insert(0, os.path.dirname(__file__))
from lookup_throughput import service_process
from spark_throughput import local_spark
from throttling import service_stats as stats

SCHEMA = "seq long, order_id long, user_id long"


def post(url: str) -> dict[str, Any]:
    request = urllib.request.Request(url, method="POST")
    with urllib.request.urlopen(request, timeout=10) as answer:
        return dict(json.loads(answer.read()))


def write_input(folder: str, rows: int) -> None:
    os.makedirs(folder)
    per_file = rows // 20
    for part in range(20):
        with open(f"{folder}/{part:02d}.json", "w") as out:
            for seq in range(part * per_file, (part + 1) * per_file):
                out.write(json.dumps({"seq": seq, "order_id": seq % (rows // 10), "user_id": seq}) + "\n")


class Sink:
    """Idempotent: a micro-batch overwrites its own folder; ``pos`` keeps a task's order."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, df: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        out = df.withColumn("batch", F.lit(batch_id)).withColumn("pos", F.monotonically_increasing_id())
        out.write.mode("overwrite").parquet(f"{self.path}/{batch_id:05d}")


def run(spark: Any, url: str, work: str, rows: int, outage: float, breaker: bool) -> dict[str, Any]:
    write_input(f"{work}/in", rows)
    limits = Limits(breaker_failures=20, breaker_cool_off=1.0) if breaker else None
    lookup = HttpLookup(url + "/users/{user_id}", fields=[Field("name")], limits=limits, max_connections=200)
    options: dict[str, Any] = (
        {
            "on_error": "defer",
            "defer": DeferPolicy(delay=2.0, max_delay=4.0),
            "retry": RetryStrategy.fixed_delay(2, 0.05),
        }
        if breaker
        else {"retry": RetryStrategy.exponential_backoff(200, 0.05, 0.25)}
    )
    stream = AsyncDataStream.key_ordered_stream(
        spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(f"{work}/in"),
        lookup,
        "order_id",
        order_by="seq",
        sink=Sink(f"{work}/out"),
        checkpoint_location=f"{work}/cp",
        heartbeat=1,
        capacity=100,
        timeout=10.0,
        **options,
    )
    query = stream.start(processingTime="0.5 seconds")
    try:
        assert stream.wait_until(lambda r: r[-1].batch_id >= 1, 120), "two micro-batches"
        stats(url, reset=True)
        began = time.perf_counter()
        post(f"{url}/outage?seconds={outage}")
        time.sleep(outage)  # the outage lasts this long (the service heals itself)
        refused = stats(url)["faults"]
        done = stream.wait_until(lambda r: sum(x.rows_out for x in r) >= rows and r[-1].parked == 0, 300)
        settled = time.perf_counter() - began
    finally:
        query.stop()
    assert done, "every row reached the sink"
    out = spark.read.parquet(f"{work}/out/*").collect()
    seqs = sorted(r.seq for r in out)
    once = seqs == list(range(rows))
    by_key: dict[int, list[tuple[int, int, int]]] = {}
    for r in out:
        by_key.setdefault(r.order_id, []).append((r.batch, r.pos, r.seq))
    in_order = all([s for _, _, s in sorted(v)] == sorted(s for _, _, s in v) for v in by_key.values())
    parked = max(r.parked for r in stream.reports)
    return {"refused": refused, "settled": settled, "once": once, "in_order": in_order, "parked": parked}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=4_000)
    parser.add_argument("--outage", type=float, default=10.0)
    args = parser.parse_args()
    spark = local_spark()
    results = {}
    with service_process(0.02) as url, tempfile.TemporaryDirectory() as work:
        print(f"{args.rows:,} rows in 20 micro-batches, a {args.outage:.0f} s outage (503) from the third on")
        for label, breaker in (("retries alone", False), ("breaker + defer", True)):
            r = run(spark, url, f"{work}/{int(breaker)}", args.rows, args.outage, breaker)
            results[label] = r
            print(
                f"  {label:<16} calls during the outage {r['refused']:>7,}  all rows in the sink "
                f"{r['settled']:5.1f} s after it began  parked at most {r['parked']:>5,}  "
                f"every row once: {r['once']}  per key in order: {r['in_order']}"
            )
    ratio = results["breaker + defer"]["refused"] / max(1, results["retries alone"]["refused"])
    print(f"  the breaker let through {ratio:.1%} of the calls retries alone made")
    spark.stop()


if __name__ == "__main__":
    main()

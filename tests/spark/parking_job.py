"""A streaming job for the fault tests: key-ordered lookups with a time cap and parked state.

    python tests/spark/parking_job.py --input DIR --output DIR --checkpoint DIR --url URL
                                      --partitions N --expect ROWS

The sink overwrites ``<output>/b=<batch id>`` (idempotent per batch id) with the batch id and
each row's position in the batch. The job prints one line per micro-batch and exits 0 once the
sink holds ``--expect`` rows and nothing is parked.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


def main() -> int:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from keyed_async_wait import AsyncDataStream
    from lookup import Field, HttpLookup

    parser = argparse.ArgumentParser()
    for name in ("--input", "--output", "--checkpoint", "--url"):
        parser.add_argument(name, required=True)
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--expect", type=int, required=True)
    parser.add_argument("--time-cap", type=float, default=0.5)
    parser.add_argument("--journal", help="a Redis URL: run a two-step chain with a step journal")
    parser.add_argument("--write", help="a Redis URL: write each row to Redis, then to the service")
    args = parser.parse_args()
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(args.partitions))
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    orders = (
        spark.readStream.schema("seq long, order_id long, user_id long")
        .option("maxFilesPerTrigger", 1)
        .json(args.input)
    )
    lookup: Any = HttpLookup(
        args.url + "/users/{user_id}", params={"order": "{order_id}", "seq": "{seq}"}, fields=[Field("name")]
    )
    journal: dict[str, Any] = {}
    if args.journal:  # the customer, then the boss by a field of the customer's answer
        from keyed_async_wait import Chain, Step
        from lookup import StepJournal

        boss = HttpLookup(
            args.url + "/users/{boss}",
            params={"step": "boss", "seq": "{seq}"},
            fields=[Field("boss_name", path="name")],
        )
        customer = HttpLookup(
            args.url + "/users/{user_id}",
            params={"step": "customer", "seq": "{seq}"},
            fields=[Field("name"), Field("boss", "int", path="id")],
        )
        lookup = Chain(Step("customer", customer), Step("boss", boss))
        journal = {"step_journal": StepJournal(args.journal)}

    if args.write:  # two fenced writes per row: Redis, then the service's /records
        from keyed_async_wait import Chain, Step
        from lookup import HttpWrite, RedisWrite

        cache = RedisWrite(
            args.write, "kill:{order_id}", fields=["seq", "user_id"], version="seq", result="cached"
        )
        crm = HttpWrite(
            args.url + "/records/{order_id}", fields=["seq", "user_id"], version="seq", result="sent"
        )
        lookup = Chain(Step("cache", cache), Step("crm", crm))

    def sink(out, batch_id):  # type: ignore[no-untyped-def]
        out = out.withColumn("batch_id", F.lit(batch_id)).withColumn("pos", F.monotonically_increasing_id())
        out.write.mode("overwrite").parquet(f"{args.output}/b={batch_id}")

    stream = AsyncDataStream.key_ordered_stream(
        orders,
        lookup,
        "order_id",
        order_by="seq",
        sink=sink,
        checkpoint_location=args.checkpoint,
        time_cap=args.time_cap,
        heartbeat=1,
        timeout=10.0,
        **journal,
    )
    query = stream.start(processingTime="0.5 seconds")
    seen = 0
    try:
        while True:
            if not stream.wait_until(lambda reports, seen=seen: len(reports) > seen, 120):
                print("no micro-batch for 120 s", flush=True)
                return 1
            for report in stream.reports[seen:]:
                print(
                    f"batch {report.batch_id} in {report.rows_in} replayed {report.replayed} "
                    f"out {report.rows_out} parked {report.parked}",
                    flush=True,
                )
            seen = len(stream.reports)
            if stream.parked == 0 and spark.read.parquet(args.output).count() >= args.expect:
                return 0
    finally:
        query.stop()
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())

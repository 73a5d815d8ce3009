"""Keys placed by their hash or by their rows (``balance_keys=True``), side by side in one run.

    ./run bench balance [--slots S] [--keys K] [--rows N] [--rounds R] [--conf KEY=VALUE ...]

``key_ordered_wait`` over an ``async def`` that sleeps 100 ms (so the two cores are not the
limit even with many task slots), N rows (100,000) over K keys (2,000), ``local[S]`` (8 task
slots by default, so a partition per slot gets few keys), capacity 200 per task, the input
cached, the benchmarks' session (no adaptive execution; ``--conf
spark.sql.shuffle.partitions=200 --conf spark.sql.adaptive.enabled=true`` gives Spark's
defaults). Printed: the share of the rows in the fullest partition by hash, the floor (the rows
over every slot's capacity, 100 ms each), and per round, alternated, each placement's whole
time (its call included: balancing counts the keys there) and rows/s; the first round warms
the Python workers up and is left out of the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from keyed_async_wait import AsyncDataStream

sys.path.insert(0, os.path.dirname(__file__))
from spark_throughput import calibration, largest_share, local_spark

DELAY = 0.1
CAPACITY = 200


async def slow(row: dict[str, Any]) -> dict[str, Any]:
    await asyncio.sleep(DELAY)
    return {"v": row["seq"]}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--keys", type=int, default=2_000)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=4, help="alternated rounds, the first a warm-up")
    parser.add_argument("--conf", action="append", default=[], help="KEY=VALUE: a Spark setting")
    args = parser.parse_args()
    print(f"calibration: {calibration():.2f} CPU s (the machine's speed now; lower is faster)")
    conf = dict(c.split("=", 1) for c in args.conf)
    spark = local_spark(conf, master=f"local[{args.slots}]")
    n = args.rows
    source = spark.range(n).selectExpr("id AS seq", f"id % {args.keys} AS order_id").cache()
    source.count()
    share = largest_share(source, "order_id", args.slots)
    floor = n * DELAY / (args.slots * CAPACITY)
    print(
        f"{n:,} rows, {args.keys:,} keys, local[{args.slots}], {DELAY * 1000:g} ms calls: the fullest "
        f"partition by hash holds {share:.1%} of the rows (an even split {1 / args.slots:.1%}); "
        f"the floor {floor:.2f} s"
    )
    seconds: dict[bool, list[float]] = {False: [], True: []}
    for round_ in range(args.rounds):
        for balance in (False, True):
            started = time.perf_counter()
            out = AsyncDataStream.key_ordered_wait(
                source,
                slow,
                "order_id",
                order_by="seq",
                capacity=CAPACITY,
                balance_keys=balance,
                output_schema="v long",
            )
            called = time.perf_counter() - started
            out.write.format("noop").mode("overwrite").save()
            took = time.perf_counter() - started
            if round_ > 0:
                seconds[balance].append(took)
            label = "balance_keys=True" if balance else "by hash"
            print(
                f"  round {round_}: {label:<18} {took:6.2f} s ({called:.2f} s of it the call), "
                f"{n / took:,.0f} rows/s"
            )
    by_hash, by_rows = (statistics.median(seconds[b]) for b in (False, True))
    print(
        f"medians: by hash {n / by_hash:,.0f} rows/s, balance_keys=True {n / by_rows:,.0f} rows/s "
        f"({by_hash / by_rows:.2f}x)"
    )
    spark.stop()
    print(f"calibration: {calibration():.2f} CPU s")


if __name__ == "__main__":
    main()

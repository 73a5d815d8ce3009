"""Lookup limits against a service with a capacity: adaptive concurrency and a rate limit.

    ./run bench throttling [--rows N] [--rate R] [--seconds S]

The service (its own process) answers after 20 ms and takes at most 50 requests at once,
answering 429 above that. Two Spark tasks (local[2]) run ``unordered_wait`` with retries:

1. fixed capacities per task (100, the default, then 50, 25, 12) without limits, and the default
   capacity with ``Limits(adaptive=True)``: rows/s, and the share of requests answered 429;
   the adaptive run against the best fixed one, measured in the same run;
2. ``Limits(rate=R / 2)`` per task: the service's request rate over about S seconds, against R;
3. ``Limits(rate=R, shared=SharedRate(redis, ...))``: one job-wide budget in Redis that both
   tasks take from (no division by the number of tasks): the same measure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.request
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from keyed_async_wait import AsyncDataStream, RetryStrategy
from keyed_async_wait.app.embedded import redis_url_or_embedded
from lookup import Field, HttpLookup, Limits, SharedRate

sys.path.insert(0, os.path.dirname(__file__))
from lookup_throughput import service_process
from spark_throughput import local_spark, source

RETRY = RetryStrategy.fixed_delay(100, 0.02)  # a record may meet many 429s in a row at capacity 100


def service_stats(url: str, reset: bool = False) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/stats{'?reset=1' if reset else ''}", timeout=10) as answer:
        return dict(json.loads(answer.read()))


def run(spark: Any, url: str, rows: int, capacity: int, limits: Limits | None) -> dict[str, Any]:
    lookup = HttpLookup(url + "/users/{user_id}", fields=[Field("name")], limits=limits, max_connections=200)
    service_stats(url, reset=True)
    df = source(spark, rows).repartition(2)
    started = time.perf_counter()
    out = AsyncDataStream.unordered_wait(df, lookup, capacity=capacity, retry=RETRY, timeout=60.0)
    out.write.format("noop").mode("overwrite").save()
    wall = time.perf_counter() - started
    stats = service_stats(url)
    return {"rows_s": rows / wall, "wall": wall, **stats}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--rate", type=float, default=400.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    spark = local_spark()
    with service_process(0.02, max_concurrent=50) as url:
        run(spark, url, 2_000, 25, None)  # warm the workers up
        print(f"{args.rows:,} rows, service: 20 ms, at most 50 requests at once, two tasks, local[2]")
        results: dict[str, dict[str, Any]] = {}
        for capacity in (100, 50, 25, 12):
            results[f"fixed capacity {capacity}"] = run(spark, url, args.rows, capacity, None)
        results["adaptive, capacity 100"] = run(spark, url, args.rows, 100, Limits(adaptive=True))
        for label, r in results.items():
            share = r["rejected"] / r["requests"] if r["requests"] else 0.0
            print(
                f"  {label:<24} {r['rows_s']:>8,.0f} rows/s  429s {r['rejected']:>7,}",
                f"({share:6.1%} of requests)",
            )
        best = max((k for k in results if k.startswith("fixed")), key=lambda k: results[k]["rows_s"])
        ratio = results["adaptive, capacity 100"]["rows_s"] / results[best]["rows_s"]
        print(f"  adaptive is {ratio:.2f}x the best fixed capacity ({best})")

        rows = int(args.rate * args.seconds)
        with redis_url_or_embedded() as redis_url:
            shared = SharedRate(redis_url, f"bench-{time.time_ns()}")
            for label, limits in (
                ("per task, rate / 2", Limits(rate=args.rate / 2, burst=5)),
                ("shared in Redis", Limits(rate=args.rate, burst=5, shared=shared)),
            ):
                r = run(spark, url, rows, 100, limits)
                measured = r["requests"] / r["wall"]
                print(
                    f"  rate limit {args.rate:,.0f}/s, {label} ({rows:,} rows, {r['wall']:.1f} s): "
                    f"{measured:,.1f} requests/s, {measured / args.rate:.3f}x the limit (job start included)"
                )
    spark.stop()


if __name__ == "__main__":
    main()

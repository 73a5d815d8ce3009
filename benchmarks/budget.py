"""One budget for the whole job, against a service that enforces its quota, side by side in one
run; then the shared cache.

    ./run bench budget [--rows N] [--calls-per-s Q] [--in-flight K]

The service (the project's test service, 20 ms an answer) admits at most Q calls per
one-second window and K in flight, answers 429 past either, and states what is left in the
IETF ``RateLimit-Policy`` / ``RateLimit`` headers. Spark runs ``local-cluster[3,1,1024]``
(three executors, one core each) and two jobs at once, each ``key_ordered_wait`` over N rows
with an ``HttpLookup`` (retries: 429 waits as ``Retry-After`` says). Three ways to hold the
quota:

- per worker, sized by hand (what the peers do): ``Limits(rate=Q / 6, max_concurrency=...)``
  per Python worker, 3 executors x 2 jobs;
- the shared budget, configured: ``Budget(rate=Q, in_flight=K, follow_headers=False)``;
- the shared budget following the service's headers: ``Budget(in_flight=K)`` (no rate given:
  the service's policy is read from its answers).

For each: the share of calls the service refused, the share of the quota used while the jobs
called (calls admitted / (Q x seconds from the first admitted call to the last)) and over the
whole wall time (Spark's start and tail included), and the wall time. Then the shared cache: one job over 3
executors whose rows ask 2,000 distinct keys, without and with ``SharedCache``, and the same
job run again within the time to live, and with ``single_flight`` (one call per key for the
whole job): the calls the service got, and the wall time.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import uuid
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from keyed_async_wait import AsyncDataStream, RetryStrategy
from keyed_async_wait.app.embedded import redis_url_or_embedded
from keyed_async_wait.app.quota import Quota
from keyed_async_wait.app.service import ServiceState, run_service
from lookup import Budget, Field, HttpLookup, Limits, PartialCache, SharedCache

KEYS = 2_000
RETRY = RetryStrategy.exponential_backoff(30, 0.05, 2.0)


def cluster_spark() -> SparkSession:
    spark = (
        SparkSession.builder.master("local-cluster[3,1,1024]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.scheduler.mode", "FAIR")  # two jobs at once share the executors
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def source(spark: SparkSession, n: int, offset: int = 0, orders: int = KEYS) -> DataFrame:
    """Rows ``seq``, ``order_id`` (the ordering key: ``orders`` of them) and ``user_id`` (the
    lookup key: 2,000 of them)."""
    return spark.range(offset, offset + n).select(
        F.col("id").alias("seq"),
        (F.col("id") % orders).alias("order_id"),
        (F.col("id") % KEYS).alias("user_id"),
    )


def job(
    spark: SparkSession,
    url: str,
    n: int,
    limits: Limits | None,
    offset: int,
    orders: int = KEYS,
    capacity: int = 200,
    **kw: Any,
) -> None:
    query = {} if kw else {"seq": "{seq}"}  # the cache's job asks by user alone
    fn = HttpLookup(url + "/users/{user_id}", params=query, fields=[Field("name")], limits=limits, **kw)
    out = AsyncDataStream.key_ordered_wait(
        source(spark, n, offset, orders), fn, "order_id", num_partitions=3, capacity=capacity, retry=RETRY
    )
    out.write.format("noop").mode("overwrite").save()


def two_jobs(spark: SparkSession, url: str, n: int, limits: Limits, capacity: int) -> float:
    """Both jobs at once (one thread each); the wall seconds until both finished."""
    failures: list[BaseException] = []

    def one(i: int) -> None:
        try:
            spark.sparkContext.setLocalProperty("spark.scheduler.pool", f"job{i}")
            job(spark, url, n, limits, offset=i * 10_000_000, capacity=capacity)
        except BaseException as exc:
            failures.append(exc)

    started = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(1800)
    if failures:
        raise failures[0]
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=6_000, help="rows per job")
    parser.add_argument("--calls-per-s", type=int, default=300)
    parser.add_argument("--in-flight", type=int, default=40)
    parser.add_argument("--cache-only", action="store_true", help="only the shared cache's part")
    args = parser.parse_args()
    q, k, n = args.calls_per_s, args.in_flight, args.rows
    spark = cluster_spark()
    state = ServiceState(latency=0.02)
    results: list[tuple[str, float, float, float, float]] = []
    with run_service(state) as (url, _), redis_url_or_embedded() as redis_url:
        job(spark, url, 300, None, offset=0)  # executors and their workers started, once
        name = f"b{uuid.uuid4().hex[:6]}"
        configured = Budget(redis_url, name + "c", rate=q, in_flight=k, follow_headers=False)
        ways = [  # (how, limits, capacity per task)
            ("per worker, sized by hand", Limits(rate=q / 6), max(1, k // 6)),
            ("shared budget, configured", Limits(budget=configured), 200),
            (
                "shared budget, the service's headers",
                Limits(budget=Budget(redis_url, name + "h", in_flight=k)),
                200,
            ),
        ]
        for label, limits, capacity in ways if not args.cache_only else ():
            quota = state.quota = Quota(calls=q, in_flight=k, window=1.0)
            wall = two_jobs(spark, url, n, limits, capacity)
            asked = quota.admitted + quota.rejected
            results.append(
                (label, quota.rejected / max(1, asked), quota.used(), quota.admitted / (q * wall), wall)
            )
        state.quota = None
        cache_rows = []
        shared = SharedCache(redis_url, expire_after_write=600, name=f"bench{uuid.uuid4().hex[:6]}")
        flight = SharedCache(
            redis_url, expire_after_write=600, name=f"bench{uuid.uuid4().hex[:6]}", single_flight=5.0
        )
        ways_cache = (
            ("each worker's cache (L1) only", None),
            ("L1 and the shared cache", shared),
            ("the same, run again", shared),
            ("L1, shared cache, single flight", flight),
        )
        for label, cache in ways_cache:
            before = state.keys_asked
            started = time.perf_counter()
            # ordered by 3,001 orders, so each user's rows are spread over the three executors
            job(spark, url, 3 * KEYS, None, 0, 3_001, cache=PartialCache(10_000), shared_cache=cache)
            cache_rows.append((label, state.keys_asked - before, time.perf_counter() - started))
    spark.stop()
    print(f"quota {q} calls/s, {k} in flight; two jobs of {n:,} rows on local-cluster[3,1,1024]")
    print(f"{'holding the quota':<40} {'refused':>8} {'quota used':>11} {'of wall':>8} {'wall s':>7}")
    for label, refused, used, of_wall, wall in results:
        print(f"{label:<40} {refused:>8.2%} {used:>11.2f} {of_wall:>8.2f} {wall:>7.1f}")
    print(f"\n{'one job, 3 executors, 2,000 keys':<40} {'calls':>9} {'wall s':>8}")
    for label, calls, wall in cache_rows:
        print(f"{label:<40} {calls:>9,} {wall:>8.1f}")


if __name__ == "__main__":
    main()

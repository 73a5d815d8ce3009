"""Backlog mode (FLIP-327) against caught-up mode and a plain unordered_wait, in one run.

    ./run bench backlog [--rows N] [--quick]

N rows (default 1,000,000; --quick 100,000) with 10,000 distinct lookup keys (user_id) and an
upsert key (order_id, 5 updates each), enriched on local[2] through:

- key_ordered_wait, backlog="auto" (a batch query: the backlog gear: up to 10,000 rows inside,
  batch calls of 2,000, no flush timer, identical lookups made once);
- key_ordered_wait, backlog=False (the caught-up gear: batches of up to 50 within 2 ms);
- unordered_wait without deduplication (the lookup's dedup off; fixed default settings);

against the 20 ms HTTP batch endpoint (POST of ids, a separate process) and against Redis
(MGET). Each job computes a row count and an order-independent checksum of its output, so the
outputs are compared, and counts its calls to the service through AsyncWaitMetrics.
Targets: backlog makes 5x fewer calls or better, and runs at 3x caught-up's rows/s or better.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from keyed_async_wait import AsyncDataStream, AsyncWaitMetrics
from keyed_async_wait.app.embedded import redis_url_or_embedded
from lookup import Field, HttpLookup, RedisLookup

sys.path.insert(0, os.path.dirname(__file__))
from lookup_throughput import service_process
from spark_throughput import local_spark

LOOKUP_KEYS = 10_000
UPDATES_PER_ORDER = 5


def source(spark: SparkSession, n: int) -> DataFrame:
    return spark.range(n).select(
        F.col("id").alias("seq"),
        (F.col("id") % (n // UPDATES_PER_ORDER)).alias("order_id"),
        (F.col("id") * 7 % LOOKUP_KEYS).alias("user_id"),
    )


def identity(spark: SparkSession, n: int) -> DataFrame:
    """Shuffle, sort and mapInArrow with a constant result column: what Spark and Arrow cost."""

    def constant(batches: Any) -> Any:
        import pyarrow as pa

        for batch in batches:
            names = pa.array(["user"] * batch.num_rows)
            yield pa.RecordBatch.from_arrays(
                [*batch.columns, names, names], [*batch.schema.names, "name", "tier"]
            )

    df = source(spark, n).repartition(2, "order_id").sortWithinPartitions("seq")
    return df.mapInArrow(constant, "seq long, order_id long, user_id long, name string, tier string")


def run(spark: SparkSession, build: Callable[[AsyncWaitMetrics], DataFrame], n: int) -> dict[str, Any]:
    metrics = AsyncWaitMetrics(spark)
    out = build(metrics)
    start = time.perf_counter()
    row = out.agg(
        F.count(F.lit(1)).alias("rows"),
        F.sum(F.xxhash64(*out.columns).cast("decimal(38,0)")).alias("checksum"),
    ).first()
    seconds = time.perf_counter() - start
    assert row is not None
    m = metrics.value
    return {
        "rows": row["rows"],
        "checksum": row["checksum"],
        "rows_s": n / seconds,
        "calls": m["lookups"],
        "gears": (m["backlog_tasks"], m["caught_up_tasks"]),
    }


def compare(label: str, spark: SparkSession, lookup: Any, plain: Any, n: int) -> None:
    print(f"\n{label}: {n:,} rows, {LOOKUP_KEYS:,} lookup keys, local[2]")
    common = {"num_partitions": 2, "timeout": 30.0}
    jobs: dict[str, Callable[[AsyncWaitMetrics], DataFrame]] = {
        "key_ordered_wait, backlog (auto: batch query)": lambda m: AsyncDataStream.key_ordered_wait(
            source(spark, n), lookup, key="order_id", order_by="seq", backlog="auto", metrics=m, **common
        ),
        "key_ordered_wait, caught up": lambda m: AsyncDataStream.key_ordered_wait(
            source(spark, n), lookup, key="order_id", order_by="seq", backlog=False, metrics=m, **common
        ),
        "unordered_wait, no deduplication": lambda m: AsyncDataStream.unordered_wait(
            source(spark, n), plain, metrics=m, timeout=30.0
        ),
    }
    for build in jobs.values():  # warm the JVM and the workers up, for every job alike
        run(spark, lambda m, build=build: build(m).limit(2_000), 2_000)
    run(spark, lambda m: identity(spark, 2_000), 2_000)
    results: dict[str, dict[str, Any]] = {}
    for name, build in jobs.items():
        results[name] = r = run(spark, build, n)
        print(
            f"  {name:<48} {r['rows_s']:>10,.0f} rows/s {r['calls']:>9,} calls  "
            f"gears backlog/caught-up tasks {r['gears'][0]}/{r['gears'][1]}",
            flush=True,
        )
    ceiling = run(spark, lambda m: identity(spark, n), n)
    print(
        f"  {'(ceiling) the same pipeline without lookups':<48} {ceiling['rows_s']:>10,.0f} rows/s",
        flush=True,
    )
    backlog, caught_up, plain_r = results.values()
    same = {(r["rows"], r["checksum"]) for r in results.values()}
    print(f"  identical output: {len(same) == 1} ({backlog['rows']:,} rows)")
    print(
        f"  backlog vs caught up:  {caught_up['calls'] / max(1, backlog['calls']):.1f}x fewer calls, "
        f"{backlog['rows_s'] / caught_up['rows_s']:.1f}x rows/s   (targets 5x, 3x)"
    )
    print(
        f"  backlog vs unordered_wait without dedup: {plain_r['calls'] / max(1, backlog['calls']):.1f}x "
        f"fewer calls, {backlog['rows_s'] / plain_r['rows_s']:.1f}x rows/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true", help="100,000 rows")
    args = parser.parse_args()
    n = 100_000 if args.quick else args.rows
    spark = local_spark()
    fields = [Field("name"), Field("tier")]
    with service_process(0.02) as url:
        batch = {
            "batch_url": url + "/users/batch",
            "key": "{user_id}",
            "fields": fields,
            "max_connections": 200,
        }
        compare(
            "HTTP batch endpoint (POST of ids), 20 ms",
            spark,
            HttpLookup(url + "/users/{user_id}", **batch),
            HttpLookup(url + "/users/{user_id}", dedup=False, **batch),
            n,
        )
    with redis_url_or_embedded() as redis_url:
        import redis

        client = redis.Redis.from_url(redis_url)
        pipe = client.pipeline(transaction=False)
        for i in range(LOOKUP_KEYS):
            pipe.set(
                f"bl:{i}", json.dumps({"name": f"user-{i}", "tier": ("bronze", "silver", "gold")[i % 3]})
            )
        pipe.execute()
        client.close()
        compare(
            "Redis MGET",
            spark,
            RedisLookup(redis_url, "bl:{user_id}", fields=fields),
            RedisLookup(redis_url, "bl:{user_id}", fields=fields, dedup=False),
            n,
        )
    spark.stop()


if __name__ == "__main__":
    main()

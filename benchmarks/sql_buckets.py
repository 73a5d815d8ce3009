"""SQL key-ordered throughput across ``buckets``, next to key_ordered_wait on the same data.

    ./run bench sql_buckets [--rows N] [--rounds R]

An update stream (2,000 keys, N rows) through ``async_lookup(..., upsert_key => 'order_id',
order_by => 'seq', buckets => B)`` for B in 4, 16, 64 and the default (one bucket per shuffle
partition), and through
``AsyncDataStream.key_ordered_wait`` with the same settings, and the scalar function (ORDERED,
on pyspark 4.2+) over the same rows, against a 20 ms HTTP service in its own process, local[2].
The jobs run interleaved for R rounds (A B C D, A B C D, ...), so drift on the machine favours
none; the medians and their ratios are printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from pyspark.sql import DataFrame

import sql_ext
from keyed_async_wait import AsyncDataStream
from keyed_async_wait.spark.compat import pyspark_version
from lookup import Field, HttpLookup

sys.path.insert(0, os.path.dirname(__file__))
from lookup_throughput import service_process
from spark_throughput import RETRY, SQL_SETTINGS, calibration, local_spark, rows_per_second, source


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=40_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    n = args.rows
    print(f"calibration loop before: {calibration():.3f} CPU s (the machine's speed: lower is quieter)")
    spark = local_spark()
    with service_process(0.02) as url:
        lookup = HttpLookup(url + "/users/{user_id}", fields=[Field("name")], max_connections=200)
        sql_ext.install(spark, {"users": lookup})
        for key, value in SQL_SETTINGS.items():
            spark.conf.set("spark.sql.exec.async-lookup." + key, value)

        def sql(buckets: int | None) -> Callable[[int], DataFrame]:
            def build(m: int) -> DataFrame:
                source(spark, m).createOrReplaceTempView("orders")
                count = "" if buckets is None else f", buckets => {buckets}"
                return spark.sql(
                    "SELECT * FROM async_lookup(TABLE(orders), 'users', upsert_key => 'order_id', "
                    f"order_by => 'seq'{count})"
                )

            return build

        def scalar(m: int) -> DataFrame:
            source(spark, m).createOrReplaceTempView("orders")
            return spark.sql("SELECT seq, order_id, user_id, users(user_id).name AS name FROM orders")

        jobs: dict[str, Callable[[int], DataFrame]] = {
            "key_ordered_wait": lambda m: AsyncDataStream.key_ordered_wait(
                source(spark, m),
                lookup,
                "order_id",
                order_by="seq",
                num_partitions=2,
                timeout=10.0,
                retry=RETRY,
                capacity=200,
            ),
            "SQL async_lookup (default buckets: one per partition)": sql(None),
            **{f"SQL async_lookup, buckets => {b}": sql(b) for b in (4, 16, 64)},
            "SQL scalar users(user_id)": scalar,
        }
        if pyspark_version() < (4, 2):  # the scalar functions need an Arrow UDF
            del jobs["SQL scalar users(user_id)"]
        for job in jobs.values():  # warm the workers up, for everybody alike
            job(2_000).write.format("noop").mode("overwrite").save()
        rates: dict[str, list[float]] = {label: [] for label in jobs}
        for _ in range(args.rounds):
            for label, job in jobs.items():
                rates[label].append(rows_per_second(lambda job=job: job(n), n))
        print(f"{n:,} rows, 2,000 keys, 20 ms service, local[2], median of {args.rounds} interleaved rounds")
        median = {label: statistics.median(values) for label, values in rates.items()}
        base = median["key_ordered_wait"]
        for label, rate in median.items():
            print(f"  {label:<54} {rate:>9,.0f} rows/s  {rate / base:5.2f}x key_ordered_wait")
        sql_rates = [rate for label, rate in median.items() if label.startswith("SQL async_lookup")]
        print(f"  spread across buckets: {max(sql_rates) / min(sql_rates) - 1:.1%} (max over min)")
    spark.stop()
    print(f"calibration loop after: {calibration():.3f} CPU s")


if __name__ == "__main__":
    main()

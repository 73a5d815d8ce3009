"""What the SQL table function costs per row beyond the DataFrame path, without a service.

    ./run bench sql_overhead [--rows N]

An ``async def`` that answers at once (no I/O), so what is measured is the path around it:
``key_ordered_wait`` (mapInArrow), the ``async_lookup`` table function key-ordered over the same
rows in its two forms (Arrow batches, the default on pyspark 4.1+; rows, ``arrow=False``),
``ordered_wait`` and the scalar function (always ORDERED) over the same rows, and an identity
``mapInArrow`` after the same repartition and sort (Spark's own floor).
``local[2]``, the ``noop`` sink, after one warm-up run each.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from collections.abc import Callable

from pyspark.sql import DataFrame

import sql_ext
from keyed_async_wait import AsyncDataStream

sys.path.insert(0, os.path.dirname(__file__))
from spark_throughput import SQL_SETTINGS, local_spark, rows_per_second, source


async def echo(record: dict) -> dict:
    return {"name": str(record["user_id"])}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=400_000)
    args = parser.parse_args()
    spark = local_spark()
    forms = {"async_lookup": None, "async_lookup_rows": False}  # the default form; rows
    for name, arrow in forms.items():
        installed = sql_ext.install(spark, table_function=name, arrow=arrow)
        installed.register("users", echo, inputs=["user_id"], output_schema="name string")
    for key, value in SQL_SETTINGS.items():
        spark.conf.set("spark.sql.exec.async-lookup." + key, value)

    def table_function(name: str) -> Callable[[int], DataFrame]:
        def build(m: int) -> DataFrame:
            source(spark, m).createOrReplaceTempView("orders")
            return spark.sql(
                f"SELECT * FROM {name}(TABLE(orders), 'users', upsert_key => 'order_id', order_by => 'seq')"
            )

        return build

    def scalar(m: int) -> DataFrame:
        source(spark, m).createOrReplaceTempView("orders")
        return spark.sql("SELECT seq, order_id, user_id, users(user_id).name AS name FROM orders")

    jobs: dict[str, Callable[[int], DataFrame]] = {
        "key_ordered_wait": lambda m: AsyncDataStream.key_ordered_wait(
            source(spark, m), echo, "order_id", order_by="seq", output_schema="name string",
            num_partitions=2, capacity=200,
        ),
        "SQL async_lookup, key-ordered": table_function("async_lookup"),
        "SQL async_lookup, key-ordered, rows": table_function("async_lookup_rows"),
        "ordered_wait": lambda m: AsyncDataStream.ordered_wait(
            source(spark, m), echo, output_schema="name string", capacity=200
        ),
        "SQL scalar users(user_id)": scalar,
        "identity mapInArrow (repartition, sort)": lambda m: source(spark, m)
        .repartition(2, "order_id")
        .sortWithinPartitions("order_id", "seq")
        .mapInArrow(lambda batches: batches, "seq long, order_id long, user_id long"),
    }  # fmt: skip
    for job in jobs.values():
        job(2_000).write.format("noop").mode("overwrite").save()
    for label, job in jobs.items():
        rate = rows_per_second(lambda job=job: job(args.rows), args.rows)
        print(f"{label:<42} {rate:>10,.0f} rows/s  {1e6 / rate:6.1f} us per row", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()

"""What a Spark Connect client does with the library: ``python connect_client.py FEATURE SC_URL
SERVICE_URL``; exits 0 when every check holds (a test runs it in a process of its own)."""

from __future__ import annotations

import sys
from typing import Any

from pyspark.sql import SparkSession

from keyed_async_wait import AsyncDataStream, AsyncWaitMetrics, ConfigError
from lookup import Field, HttpLookup


def users(url: str) -> HttpLookup:
    return HttpLookup(url + "/users/{user_id}", fields=[Field("name"), Field("tier")])


def waits(spark: Any, url: str) -> None:
    df = spark.createDataFrame(
        [(i, i % 7, i % 40) for i in range(300)], "seq long, order_id long, user_id long"
    )
    metrics = AsyncWaitMetrics(spark)
    assert metrics.via == "observe"
    keyed = AsyncDataStream.key_ordered_wait(df, users(url), "order_id", order_by="seq", metrics=metrics)
    rows = keyed.collect()
    assert sorted(r.seq for r in rows) == list(range(300))
    assert all(r.name == f"user-{r.user_id}" for r in rows)
    m = metrics.value
    assert (m["records"], m["rows_out"], m["lookups"]) == (300, 300, 300), m
    for wait in (AsyncDataStream.ordered_wait, AsyncDataStream.unordered_wait):
        assert wait(df, users(url)).count() == 300
    stream = spark.readStream.format("rate").load().selectExpr("value AS order_id", "value AS user_id")
    try:
        AsyncDataStream.key_ordered_stream(
            stream, users(url), "order_id", sink=print, checkpoint_location="/tmp/unused"
        )
    except ConfigError as exc:
        assert "a classic session, for now" in str(exc)
    else:
        raise AssertionError("key_ordered_stream on Spark Connect is refused at the call")
    try:
        AsyncWaitMetrics(spark, via="accumulators")
    except ConfigError as exc:
        assert "Spark Connect" in str(exc)
    else:
        raise AssertionError("accumulators on Spark Connect")


def sql(spark: Any, url: str) -> None:
    import sql_ext

    spark.createDataFrame(
        [(i, i % 5, i % 40) for i in range(100)], "seq long, order_id long, user_id long"
    ).createOrReplaceTempView("orders")
    ext = sql_ext.install(spark, {"users": users(url)})
    scalar = spark.sql("SELECT seq, user_id, users(user_id) AS u FROM orders").collect()
    assert len(scalar) == 100 and all(r.u.name == f"user-{r.user_id}" for r in scalar)
    spark.sql("SET `spark.sql.exec.async-lookup.output-mode`=ALLOW_UNORDERED")
    spark.sql("SET `spark.sql.exec.async-lookup.key-ordered-enabled`=true")
    table = spark.sql(
        "SELECT * FROM async_lookup(TABLE(orders), 'users', upsert_key => 'order_id', order_by => 'seq')"
    ).collect()
    assert sorted(r.seq for r in table) == list(range(100))
    assert ext.explain("orders", upsert_key="order_id").mode.name == "KEY_ORDERED"
    try:
        ext.decisions()
    except ConfigError as exc:
        assert "explain()" in str(exc)
    else:
        raise AssertionError("decisions() on Spark Connect")


def main(feature: str, remote: str, url: str) -> None:
    spark = SparkSession.builder.remote(remote).getOrCreate()
    try:
        {"waits": waits, "sql": sql}[feature](spark, url)
    finally:
        spark.stop()
    print(f"{feature}: ok")


if __name__ == "__main__":
    main(*sys.argv[1:4])

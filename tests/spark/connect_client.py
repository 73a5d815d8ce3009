"""What a Spark Connect client does with the library: ``python connect_client.py FEATURE SC_URL
SERVICE_URL``; exits 0 when every check holds (a test runs it in a process of its own)."""

from __future__ import annotations

import sys
from typing import Any

from pyspark.sql import SparkSession

from keyed_async_wait import AsyncDataStream, AsyncWaitMetrics, ConfigError
from lookup import Field, HttpLookup


def users(url: str, **options: Any) -> HttpLookup:
    return HttpLookup(url + "/users/{user_id}", fields=[Field("name"), Field("tier")], **options)


async def _user_named(record: dict[str, Any]) -> dict[str, Any]:
    return {"name": f"user-{record['user.id']}"}  # the column `user.id`, not the struct's field


def waits(spark: Any, url: str, *_: str) -> None:
    df = spark.createDataFrame(
        [(i, i % 7, i % 40) for i in range(300)], "seq long, order_id long, user_id long"
    )
    metrics = AsyncWaitMetrics(spark)
    assert metrics.via == "observe"
    # dedup off: a call per record, so the lookups count is the records' (two records of one
    # user in flight at once, as on a loaded machine, would share one call)
    keyed = AsyncDataStream.key_ordered_wait(
        df, users(url, dedup=False), "order_id", order_by="seq", metrics=metrics
    )
    rows = keyed.collect()
    assert sorted(r.seq for r in rows) == list(range(300))
    assert all(r.name == f"user-{r.user_id}" for r in rows)
    m = metrics.value
    assert (m["records"], m["rows_out"], m["lookups"]) == (300, 300, 300), m
    # spread over the server's task slots (local[2]), not its shuffle partitions (4)
    spread = keyed.selectExpr("spark_partition_id() AS p").distinct().collect()
    assert sorted(r.p for r in spread) == [0, 1], spread
    for wait in (AsyncDataStream.ordered_wait, AsyncDataStream.unordered_wait):
        assert wait(df, users(url)).count() == 300
    balanced = AsyncDataStream.key_ordered_wait(df, users(url), "order_id", order_by="seq", balance_keys=True)
    assert sorted((r.seq, r.name) for r in balanced.collect()) == [(i, f"user-{i % 40}") for i in range(300)]
    try:  # round robin: every key in every partition, refused at the call
        AsyncDataStream.key_ordered_wait(df.repartition(3), users(url), "order_id", assume_partitioned=True)
    except ConfigError as exc:
        assert "in partitions [0, 1, 2]" in str(exc), exc
    else:
        raise AssertionError("assume_partitioned=True over a DataFrame not partitioned by the key")
    placed = AsyncDataStream.key_ordered_wait(
        df.repartition(3, "order_id"), users(url), "order_id", order_by="seq", assume_partitioned=True
    )
    assert sorted(r.seq for r in placed.collect()) == list(range(300))
    mapped = spark.sql(  # one key listed two ways: placed whole (Spark 3.5 hashes the listing)
        "SELECT id AS seq, id % 40 AS user_id, "
        "IF(id < 150, map('a', id % 7, 'b', 2), map('b', 2, 'a', id % 7)) AS m FROM range(300)"
    )
    by_map = AsyncDataStream.key_ordered_wait(mapped, users(url), "m", order_by="seq", num_partitions=7)
    where = by_map.selectExpr("m['a'] AS k", "spark_partition_id() AS p").distinct().collect()
    assert sorted(r.k for r in where) == list(range(7)), where
    dotted = spark.sql(
        "SELECT id AS `s.eq`, id % 40 AS `user.id`, named_struct('id', -1) AS user FROM range(50)"
    )
    named = AsyncDataStream.key_ordered_wait(
        dotted, _user_named, "user.id", order_by="s.eq", output_schema="name string"
    )
    assert sorted((r["s.eq"], r["name"]) for r in named.collect()) == [
        (i, f"user-{i % 40}") for i in range(50)
    ]
    try:
        AsyncWaitMetrics(spark, via="accumulators")
    except ConfigError as exc:
        assert "Spark Connect" in str(exc)
    else:
        raise AssertionError("accumulators on Spark Connect")


def sql(spark: Any, url: str, *_: str) -> None:
    import sql_ext

    spark.createDataFrame(
        [(i, i % 5, i % 40) for i in range(100)], "seq long, order_id long, user_id long"
    ).createOrReplaceTempView("orders")
    from keyed_async_wait.spark.compat import pyspark_version

    ext = sql_ext.install(spark, {"users": users(url)})
    if pyspark_version() >= (4, 2):  # the scalar functions: an Arrow UDF
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


class WriteBatch:
    """An idempotent sink (a micro-batch overwrites its own directory), picklable: on Connect it
    runs in the server's foreachBatch process. ``pos`` keeps the order within a task."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, df: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        out = df.withColumn("batch", F.lit(batch_id)).withColumn("pos", F.monotonically_increasing_id())
        out.write.mode("overwrite").parquet(f"{self.path}/{batch_id}")


def failing_sink(df: Any, batch_id: int) -> None:
    raise ValueError(f"the sink refused micro-batch {batch_id}")


def stream(spark: Any, url: str, work: str) -> None:
    """key_ordered_stream with deferrals (the test makes the service answer 503 to the first
    calls): parked rows drain on the heartbeat, reports reach the client, a failure is raised.
    Each file holds its keys' rows whole, so ``assume_partitioned`` holds."""
    import json
    import os

    from keyed_async_wait import DeferPolicy, RetryStrategy

    os.makedirs(f"{work}/in")
    for part in range(3):
        with open(f"{work}/in/{part}.json", "w") as out:
            for seq in range(120):
                if seq % 8 % 3 == part:
                    out.write(json.dumps({"seq": seq, "order_id": seq % 8, "user_id": seq % 13}) + "\n")
    source = spark.readStream.schema("seq long, order_id long, user_id long").json(f"{work}/in")
    keyed = AsyncDataStream.key_ordered_stream(
        source,
        users(url),
        "order_id",
        order_by="seq",
        sink=WriteBatch(f"{work}/out"),
        checkpoint_location=f"{work}/cp",
        assume_partitioned=True,
        defer=DeferPolicy(delay=0.2, max_delay=0.4),
        retry=RetryStrategy.fixed_delay(1, 0.05),
        heartbeat=1,
        timeout=10.0,
    )
    last = keyed.run_available_now(drain_timeout=120)
    reports = keyed.reports
    assert last is not None and last.parked == 0, reports
    assert any(r.parked > 0 for r in reports), reports  # the 503s parked some keys
    assert [r.batch_id for r in reports] == sorted({r.batch_id for r in reports}), reports
    assert sum(r.rows_in for r in reports) == 120, reports
    assert sum(r.rows_out for r in reports) == 120, reports
    # each report travels in its micro-batch's manifest: one small file (a Spark job) a micro-batch
    assert not os.path.exists(f"{work}/cp/async_state/report"), os.listdir(f"{work}/cp/async_state")
    rows = spark.read.parquet(f"{work}/out/*").collect()
    assert sorted(r.seq for r in rows) == list(range(120)), "every row once"
    assert all(r.name == f"user-{r.user_id}" and r._error is None for r in rows)
    for key in range(8):
        mine = sorted((r.batch, r.pos, r.seq) for r in rows if r.order_id == key)
        assert [seq for _, _, seq in mine] == sorted(seq for _, _, seq in mine), f"key {key} in order"
    broken = AsyncDataStream.key_ordered_stream(
        spark.readStream.schema("seq long, order_id long, user_id long").json(f"{work}/in"),
        users(url),
        "order_id",
        sink=failing_sink,
        checkpoint_location=f"{work}/cp-broken",
    )
    try:
        broken.run_available_now()
    except Exception as exc:  # Spark's StreamingQueryException, as on a classic session
        assert "the sink refused micro-batch 0" in str(exc), exc
    else:
        raise AssertionError("a failing sink fails the run")
    not_by_key(spark, url, work)
    print(f"stream: {len(reports)} micro-batches, parked at most {max(r.parked for r in reports)}")


def not_by_key(spark: Any, url: str, work: str) -> None:
    """``assume_partitioned=True`` over two files that each hold every key: the micro-batch
    fails naming the option (checked on the server by grouping the output: no accumulators)."""
    import json
    import os

    os.makedirs(f"{work}/mixed")
    for part in range(2):
        with open(f"{work}/mixed/{part}.json", "w") as out:
            for seq in range(part, 16, 2):
                out.write(json.dumps({"seq": seq, "order_id": seq // 2 % 4, "user_id": seq}) + "\n")
    mixed = AsyncDataStream.key_ordered_stream(
        spark.readStream.schema("seq long, order_id long, user_id long").json(f"{work}/mixed"),
        users(url),
        "order_id",
        sink=WriteBatch(f"{work}/mixed-out"),
        checkpoint_location=f"{work}/cp-mixed",
        assume_partitioned=True,
    )
    try:
        mixed.run_available_now()
    except Exception as exc:
        assert "assume_partitioned=True is not allowed" in str(exc), exc
        assert "in partitions [0, 1]" in str(exc), exc
    else:
        raise AssertionError("a source not partitioned by the key fails the run")


def counts(spark: Any, *_: str) -> None:
    """A micro-batch's counts observed while the sink's job runs (no job of their own), and
    none unless every partition reported: then the stream counts with a job."""
    from pyspark import StorageLevel

    from keyed_async_wait.spark.batch_counts import ObservedCounts, counted
    from keyed_async_wait.spark.compat import pyspark_version

    def enriched(partitions: int, observed: ObservedCounts, rows: int = 700) -> Any:
        df = spark.range(0, rows, 1, 1).selectExpr(
            "id", "IF(id % 7 = 0, named_struct('seg', id), NULL) AS _kaw_parked"
        )
        return observed.on(df.repartition(partitions, "id")).persist(StorageLevel.MEMORY_AND_DISK)

    def run_and_count(observed: ObservedCounts, partitions: int, rows: int = 700) -> Any:
        df = enriched(partitions, observed, rows)
        df.write.format("noop").mode("overwrite").save()
        got = observed.counts()
        assert counted(df, None, observed, partitions) == (rows - rows // 7, rows // 7, 0)
        df.unpersist()
        return got

    def made(partitions: int) -> ObservedCounts:
        observed = ObservedCounts.made(spark, partitions)
        assert observed is not None, "an observation on Spark Connect"
        return observed

    for partitions in (5, 70):  # one mask, and two (63 partitions a mask)
        observed = made(partitions)
        df = enriched(partitions, observed)
        df.where("_kaw_parked IS NULL").write.format("noop").mode("overwrite").save()
        got = observed.counts()
        # pyspark 4.0's server sends nothing observed under a cached plan: then the job counts
        assert got == (None if pyspark_version() < (4, 1) else (600, 100)), got
        assert counted(df, None, observed, partitions) == (600, 100, 0)
        df.unpersist()
    unread = made(5)  # the sink ran no action: counted by a job
    df = enriched(5, unread)
    assert unread.counts() is None
    assert counted(df, None, unread, 5) == (600, 100, 0)
    df.unpersist()
    # more partitions than rows (two masks of them): some never reported
    assert run_and_count(made(80), 80, rows=70) is None
    assert run_and_count(made(3), 5) is None  # partitions past those expected
    prefix = made(5)  # a sink that read part of it, then the rest
    df = enriched(5, prefix)
    df.limit(1).collect()
    df.write.format("noop").mode("overwrite").save()
    # what the server reports then differs (4.3: the last action's partitions alone, caught by
    # the bits; 4.2: the whole; 4.0: the whole at the limit): never short counts
    assert prefix.counts() in (None, (600, 100))
    assert counted(df, None, prefix, 5) == (600, 100, 0)
    df.unpersist()


def main(feature: str, remote: str, url: str, *extra: str) -> None:
    spark = SparkSession.builder.remote(remote).getOrCreate()
    try:
        {"waits": waits, "sql": sql, "stream": stream, "counts": counts}[feature](spark, url, *extra)
    finally:
        spark.stop()
    print(f"{feature}: ok")


if __name__ == "__main__":
    main(*sys.argv[1:])

"""AsyncDataStream on a real local[2] Spark session against real services on loopback."""

from __future__ import annotations

import itertools
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from keyed_async_wait import AsyncDataStream, AsyncWaitMetrics, ConfigError, RetryStrategy, split_errors
from keyed_async_wait.spark.compat import observed_progress
from lookup import Field, HttpLookup, RedisLookup

from ..processes import run_bounded
from .calls import overlaps_and_disorder, peak_concurrency

pytestmark = [pytest.mark.spark, pytest.mark.compat("AsyncDataStream: the three waits, metrics, limits")]

SCHEMA = "seq long, order_id long, user_id long"


def updates(n: int = 1200, orders: int = 30, users: int = 100) -> list[tuple[int, int, int]]:
    return [(seq, seq % orders, seq % users) for seq in range(n)]


def user_lookup(url: str, **kw: Any) -> HttpLookup:
    # the order id and seq ride along as query parameters so the service can log them per key
    return HttpLookup(
        url + "/users/{user_id}",
        params={"order": "{order_id}", "seq": "{seq}"},
        fields=[Field("name"), Field("tier")],
        **kw,
    )


def test_key_ordered_wait_never_overlaps_a_key_and_keeps_its_order(spark: Any, service: Any) -> None:
    url, state = service
    state.latency, state.jitter, state.record_calls = 0.005, 0.01, True
    df = spark.createDataFrame(updates(), SCHEMA)
    metrics = AsyncWaitMetrics(spark)
    out = AsyncDataStream.key_ordered_wait(
        df, user_lookup(url), key="order_id", order_by="seq", metrics=metrics
    )
    rows = out.collect()
    assert len(rows) == 1200
    assert all(r.name == f"user-{r.user_id}" for r in rows)
    assert overlaps_and_disorder(state.calls) == (0, 0)
    assert len(state.calls) == 1200
    # concurrency across keys did happen
    starts = sorted((s, e) for _, s, e, _ in state.calls)
    assert any(b[0] < a[1] for a, b in itertools.pairwise(starts))
    m = metrics.value
    assert m["records"] == 1200 and m["rows_out"] == 1200 and m["lookups"] == 1200
    assert m["latency_p50_s"] is not None
    assert 1 <= m["peak_in_flight"] <= 100 and m["peak_blocked_keys"] >= 1


@pytest.mark.parametrize("via", ["accumulators", "observe"])
def test_metrics_count_the_same_through_accumulators_and_observed_metrics(
    spark: Any, service: Any, via: str
) -> None:
    from pyspark.sql import Row

    url, state = service
    state.fail(503, count=30)  # 30 retries, whichever records get them
    df = spark.createDataFrame([Row(seq=i, order_id=i % 50, user_id=i % 40) for i in range(400)])
    metrics = AsyncWaitMetrics(spark, via=via)
    # 31 attempts: one record may draw every fault (its retries come at once), and still succeed
    out = AsyncDataStream.key_ordered_wait(
        df, user_lookup(url), "order_id", retry=RetryStrategy.fixed_delay(31, 0), metrics=metrics
    )
    assert out.columns == [*df.columns, "name", "tier"]  # the task rows never show
    rows = out.collect()
    assert sorted(r.seq for r in rows) == list(range(400))
    m = metrics.value
    assert (m["records"], m["rows_out"], m["lookups"], m["retries"]) == (400, 400, 430, 30)
    assert m["attempts"] == 430 and m["failures"] == 0
    assert m["latency_p50_s"] is not None and m["peak_in_flight"] >= 1


def test_lookup_limits_hold_in_spark_and_their_counts_reach_the_metrics(spark: Any, service: Any) -> None:
    from lookup import Limits

    url, state = service
    state.latency, state.max_concurrent, state.record_calls = 0.02, 8, True
    df = spark.createDataFrame(updates(600, orders=60), SCHEMA)
    metrics = AsyncWaitMetrics(spark)
    limited = user_lookup(url, limits=Limits(adaptive=True, max_concurrency=100))
    out = AsyncDataStream.key_ordered_wait(
        df, limited, "order_id", order_by="seq", retry=RetryStrategy.fixed_delay(50, 0.02), metrics=metrics
    ).collect()
    assert sorted(r.seq for r in out) == list(range(600))
    assert overlaps_and_disorder(state.calls) == (0, 0)
    m = metrics.value
    assert m["rejected_429"] == state.rejected  # every 429 the service gave is counted
    assert m["lookups"] == 600 + state.rejected


def test_an_observing_metrics_object_counts_one_wait(spark: Any, service: Any) -> None:
    url, _ = service
    df = spark.createDataFrame(updates(10), SCHEMA)
    metrics = AsyncWaitMetrics(spark, via="observe")
    AsyncDataStream.unordered_wait(df, user_lookup(url), metrics=metrics)
    with pytest.raises(ConfigError, match="used twice"):
        AsyncDataStream.unordered_wait(df, user_lookup(url), metrics=metrics)
    with pytest.raises(ConfigError, match="via='sometimes'"):
        AsyncWaitMetrics(spark, via="sometimes")


@pytest.mark.parametrize(("blocked", "most", "least"), [(0, 2, 1), (200, 4, 3)])
def test_blocked_capacity_keeps_other_keys_running_past_one_keys_run_of_updates(
    spark: Any, service: Any, blocked: int, most: int, least: int
) -> None:
    url, state = service
    state.latency, state.record_calls = 0.02, True
    # sorted by seq, each key's 20 updates come together: a window of 4 rows holds 1-2 keys
    rows = [(key * 20 + i, key, key) for key in range(10) for i in range(20)]
    df = spark.createDataFrame(rows, SCHEMA)
    out = AsyncDataStream.key_ordered_wait(
        df,
        user_lookup(url),
        "order_id",
        order_by="seq",
        num_partitions=1,
        capacity=4,
        blocked_capacity=blocked,
    ).collect()
    assert sorted(r.seq for r in out) == list(range(200))
    assert overlaps_and_disorder(state.calls) == (0, 0)
    assert least <= peak_concurrency(state.calls) <= most  # never more than the capacity


def test_a_hot_key_is_set_aside_on_local_disk_and_never_holds_the_other_keys_back(
    spark: Any, service: Any
) -> None:
    url, state = service
    state.latency, state.record_calls = 0.002, True
    # 300 updates of order 0 first, then one update of each of 60 other orders
    rows = [(i, 0, i % 40) for i in range(300)] + [(300 + i, 1 + i, i % 40) for i in range(60)]
    metrics = AsyncWaitMetrics(spark)
    out = AsyncDataStream.key_ordered_wait(
        # a NOT NULL column, as spark.range gives: the rows read back keep it, and join the
        # input batches they came from
        spark.createDataFrame(rows, "seq long not null, order_id long, user_id long"),
        user_lookup(url),
        "order_id",
        order_by="seq",
        num_partitions=1,
        capacity=8,
        blocked_capacity=20,  # the rest of order 0 is set aside on the task's local disk
        batch_size=None,
        metrics=metrics,
    ).collect()
    assert sorted(r.seq for r in out) == list(range(360))
    assert all(r.name == f"user-{r.user_id}" for r in out)
    assert overlaps_and_disorder(state.calls) == (0, 0)  # order 0 one at a time, in seq order
    assert metrics.value["set_aside"] >= 300 - 20 - 8
    hot = sorted(start for _, start, _, query in state.calls if query["order"] == "0")
    others = [start for _, start, _, query in state.calls if query["order"] != "0"]
    assert max(others) < hot[60]  # the other orders ran while order 0 was at its start


def test_unordered_wait_lets_one_key_overlap(spark: Any, service: Any) -> None:
    url, state = service
    state.latency, state.jitter, state.record_calls = 0.01, 0.02, True
    df = spark.createDataFrame(updates(600, orders=5), SCHEMA)
    rows = AsyncDataStream.unordered_wait(df, user_lookup(url), capacity=50).collect()
    assert sorted(r.seq for r in rows) == list(range(600))
    overlapping, _ = overlaps_and_disorder(state.calls)
    assert overlapping > 0


def test_ordered_wait_keeps_partition_order(spark: Any, service: Any) -> None:
    from pyspark.sql import functions as F

    url, state = service
    state.latency, state.jitter = 0.002, 0.02
    df = spark.createDataFrame(updates(800), SCHEMA).repartition(3).withColumn("pid", F.spark_partition_id())
    df = df.sortWithinPartitions("seq").cache()
    expected = defaultdict(list)
    for r in df.collect():
        expected[r.pid].append(r.seq)
    rows = AsyncDataStream.ordered_wait(df, user_lookup(url), capacity=64).collect()
    got = defaultdict(list)
    for r in rows:
        got[r.pid].append(r.seq)
    assert got == expected
    df.unpersist()


def test_left_join_keeps_misses_inner_join_drops_them(spark: Any, service: Any) -> None:
    url, _ = service
    data = [(0, 1, 5), (1, 2, 10**9), (2, 3, 7)]
    df = spark.createDataFrame(data, SCHEMA)
    left = AsyncDataStream.unordered_wait(df, user_lookup(url)).orderBy("seq").collect()
    assert [(r.seq, r.name) for r in left] == [(0, "user-5"), (1, None), (2, "user-7")]
    inner = AsyncDataStream.unordered_wait(df, user_lookup(url), join="inner").orderBy("seq").collect()
    assert [r.seq for r in inner] == [0, 2]


def test_redis_lookup_in_batches(spark: Any, redis_url: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    for i in range(100):
        client.set(f"spark-price:{i}", json.dumps({"price": i * 2.0}))
    df = spark.createDataFrame(updates(500), SCHEMA)
    fn = RedisLookup(redis_url, "spark-price:{user_id}", fields=[Field("price", "float")])
    rows = AsyncDataStream.key_ordered_wait(df, fn, key="order_id", order_by="seq").collect()
    assert len(rows) == 500 and all(r.price == r.user_id * 2.0 for r in rows)


def test_plain_async_def_with_a_ddl_schema_and_several_rows_per_record(spark: Any) -> None:
    async def split(row: dict) -> list[dict]:
        return [{"part": p, "value": row["seq"] * 10 + p} for p in range(row["seq"] % 3)]

    df = spark.createDataFrame(updates(30), SCHEMA)
    out = AsyncDataStream.ordered_wait(df, split, output_schema="part int, value long", join="inner")
    rows = out.collect()
    assert len(rows) == sum(seq % 3 for seq in range(30))
    assert all(r.value == r.seq * 10 + r.part for r in rows)


def test_result_not_fitting_the_schema_names_column_and_key(spark: Any) -> None:
    async def bad(row: dict) -> dict:
        return {"score": "high"}

    async def extra(row: dict) -> dict:
        return {"score": 1.0, "surprise": 1}

    df = spark.createDataFrame(updates(5), SCHEMA)
    with pytest.raises(Exception, match=r"result column 'score' \(double\) cannot hold 'high' .* key \d+"):
        AsyncDataStream.key_ordered_wait(df, bad, key="order_id", output_schema="score double").collect()
    with pytest.raises(Exception, match=r"result column 'surprise' is not in the output schema"):
        AsyncDataStream.unordered_wait(df, extra, output_schema="score double").collect()


def test_failures_fail_the_job_or_land_in_an_error_column(spark: Any) -> None:
    async def flaky(row: dict) -> dict:
        if row["user_id"] == 3:
            raise ValueError(f"user {row['user_id']} is broken")
        return {"ok": True}

    df = spark.createDataFrame(updates(40, users=10), SCHEMA)  # user 3 at seq 3, 13, 23, 33
    with pytest.raises(Exception, match=r"key \d+ failed after 1 attempt: ValueError: user 3 is broken"):
        AsyncDataStream.key_ordered_wait(df, flaky, key="order_id", output_schema="ok boolean").collect()
    out = AsyncDataStream.key_ordered_wait(
        df, flaky, key="order_id", output_schema="ok boolean", error_column="_error"
    )
    good, bad = split_errors(out)
    assert good.count() == 36
    failed = bad.collect()
    assert len(failed) == 4 and all(r.user_id == 3 and r._error.error_type == "ValueError" for r in failed)
    assert failed[0]._error.attempts == 1 and failed[0].ok is None


def test_split_errors_runs_the_lookups_once_for_both_parts(spark: Any, tmp_path: Any) -> None:
    """Each part's actions read one persisted run: a row whose call fails only on its first
    try is in exactly one part (in neither, or both, if each action ran the calls again)."""
    tries = tmp_path / "tries"
    tries.mkdir()

    async def fails_first(row: dict) -> dict:
        mark = tries / str(row["seq"])  # the tasks run in other processes: a file per call
        first = not mark.exists()
        mark.write_text("")
        if first and row["seq"] % 2:
            raise ValueError("once")
        return {"ok": True}

    out = AsyncDataStream.unordered_wait(
        spark.createDataFrame(updates(20), SCHEMA), fails_first, output_schema="ok boolean", error_column="_e"
    )
    good, bad = split_errors(out, "_e")
    try:
        assert sorted(r.seq for r in good.collect()) == list(range(0, 20, 2))
        assert sorted(r.seq for r in bad.collect()) == list(range(1, 20, 2))
        assert good.count() + bad.count() == 20
    finally:
        out.unpersist()


def test_defaults_come_from_spark_conf_and_bad_values_are_named(spark: Any) -> None:
    async def f(row: dict) -> dict:
        return {"ok": True}

    df = spark.createDataFrame(updates(5), SCHEMA)
    spark.conf.set("spark.sql.exec.async-lookup.buffer-capacity", "0")
    try:
        with pytest.raises(ConfigError, match=r"spark\.sql\.exec\.async-lookup\.buffer-capacity='0'.*>= 1"):
            AsyncDataStream.unordered_wait(df, f, output_schema="ok boolean")
    finally:
        spark.conf.unset("spark.sql.exec.async-lookup.buffer-capacity")
    spark.conf.set("spark.sql.exec.async-lookup.timeout", "soon")
    try:
        with pytest.raises(ConfigError, match=r"async-lookup\.timeout='soon'.*180s, 3 min, 500 ms"):
            AsyncDataStream.unordered_wait(df, f, output_schema="ok boolean")
    finally:
        spark.conf.unset("spark.sql.exec.async-lookup.timeout")
    with pytest.raises(ConfigError, match=r"key='nope'.*missing: \['nope'\]"):
        AsyncDataStream.key_ordered_wait(df, f, key="nope", output_schema="ok boolean")
    with pytest.raises(ConfigError, match=r"output_schema=None"):
        AsyncDataStream.unordered_wait(df, f)


def test_small_arrow_batches_keep_everything(spark: Any, service: Any) -> None:
    url, state = service
    state.record_calls = True
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "10")
    try:
        df = spark.createDataFrame(updates(400), SCHEMA)
        rows = AsyncDataStream.key_ordered_wait(
            df, user_lookup(url), key="order_id", order_by="seq"
        ).collect()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert len(rows) == 400
    assert overlaps_and_disorder(state.calls) == (0, 0)


def test_streaming_restart_from_checkpoint_loses_and_repeats_nothing(
    spark: Any, service: Any, tmp_path: Path
) -> None:
    url, state = service
    state.record_calls = True
    source, sink, checkpoint = tmp_path / "in", tmp_path / "out", tmp_path / "checkpoint"
    source.mkdir()

    def write(name: str, seqs: range) -> None:
        lines = [json.dumps({"seq": s, "order_id": s % 7, "user_id": s % 50}) for s in seqs]
        (source / name).write_text("\n".join(lines) + "\n")

    progress: list[Any] = []

    def run_once() -> None:
        stream = spark.readStream.schema(SCHEMA).json(str(source))
        out = AsyncDataStream.key_ordered_wait(
            stream, user_lookup(url), key="order_id", order_by="seq", observe="enrichment"
        )
        query = (
            out.writeStream.format("parquet")
            .option("path", str(sink))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(120)
        assert query.exception() is None
        progress.extend(query.recentProgress)

    write("a.json", range(0, 150))
    write("b.json", range(150, 300))
    run_once()
    write("c.json", range(300, 420))
    run_once()
    got = sorted(r.seq for r in spark.read.parquet(str(sink)).select("seq").collect())
    assert got == list(range(420))
    assert overlaps_and_disorder(state.calls) == (0, 0)
    observed = [o["enrichment"] for _, o in observed_progress(progress) if "enrichment" in o]
    assert sum(row["rows"] for row in observed) == 420
    assert sum(row["misses"] for row in observed) == 0


CLUSTER_JOB = """
import json, os, sys
os.environ["PYSPARK_PYTHON"] = sys.executable
from pyspark.sql import SparkSession
from keyed_async_wait import AsyncDataStream
from lookup import Field, HttpLookup
spark = (SparkSession.builder.master("local-cluster[2,1,1024]").config("spark.ui.enabled", "false")
         .config("spark.driver.host", "127.0.0.1").config("spark.sql.shuffle.partitions", "4").getOrCreate())
fn = HttpLookup(sys.argv[1] + "/users/{user_id}", fields=[Field("name")], dedup=False)  # a request a row
df = spark.createDataFrame([(i, i % 9, i % 40) for i in range(300)], "seq long, order_id long, user_id long")
out = AsyncDataStream.key_ordered_wait(df, fn, key="order_id", order_by="seq")
rows = out.collect()
print(json.dumps({"rows": len(rows), "named": sum(r.name == f"user-{r.user_id}" for r in rows)}))
spark.stop()
"""


@pytest.mark.cluster
def test_runs_on_a_multi_process_cluster(service: Any, tmp_path: Path) -> None:
    url, state = service
    script = tmp_path / "cluster_job.py"
    script.write_text(CLUSTER_JOB)
    done = run_bounded([sys.executable, str(script), url], timeout=300, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"rows": 300, "named": 300}
    assert state.requests == 300  # the lookups reached the service from the executors' workers


class _WhereAmI:
    """Reports the worker process, the function instance and the event loop that served a row."""

    async def invoke(self, row: dict) -> list[dict]:
        import asyncio
        import os

        return [{"pid": os.getpid(), "instance": id(self), "loop": id(asyncio.get_running_loop())}]


def test_one_loop_and_one_function_instance_per_worker_process(spark: Any) -> None:
    df = spark.createDataFrame(updates(400), SCHEMA).repartition(8)  # 8 tasks on 2 cores
    out = AsyncDataStream.unordered_wait(df, _WhereAmI(), output_schema="pid long, instance long, loop long")
    rows = out.select("pid", "instance", "loop").distinct().collect()
    per_pid = defaultdict(set)
    for r in rows:
        per_pid[r.pid].add((r.instance, r.loop))
    assert 1 <= len(per_pid) < 8  # fewer workers than tasks: workers were reused
    assert all(len(served) == 1 for served in per_pid.values())  # reused across that worker's tasks


def test_a_result_that_does_not_fit_lands_in_the_error_column_with_the_other_rows_kept(spark: Any) -> None:
    async def fn(record: dict[str, Any]) -> dict[str, Any]:
        return {"v": 5.7 if record["id"] % 7 == 0 else record["id"]}

    df = spark.range(50).repartition(2)
    for wait in (AsyncDataStream.ordered_wait, AsyncDataStream.unordered_wait):
        rows = wait(df, fn, output_schema="v bigint", error_column="_err").collect()
        assert sorted(r.id for r in rows) == list(range(50))
        for r in rows:
            if r.id % 7 == 0:
                assert r.v is None and r._err.error_type == "ResultSchemaError"
                assert "cannot hold 5.7" in r._err.error_message
            else:
                assert r.v == r.id and r._err is None

"""Backlog mode on Spark: a batch query takes the backlog gear, a small micro-batch the
caught-up one; the output is the same, the calls fewer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from keyed_async_wait import AsyncDataStream, AsyncWaitMetrics, ConfigError
from keyed_async_wait.core.backlog import BacklogPolicy
from lookup import Field, HttpLookup

pytestmark = [pytest.mark.spark, pytest.mark.compat("backlog mode")]

SCHEMA = "seq long, order_id long, user_id long"


def drain(out: Any, tmp_path: Path) -> None:
    """Write what the file source holds now to parquet (availableNow), from the checkpoint on."""
    query = (
        out.writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120)


def batch_users(url: str) -> HttpLookup:
    return HttpLookup(
        url + "/users/{user_id}", batch_url=url + "/users/batch", key="{user_id}", fields=[Field("name")]
    )


def test_a_batch_query_runs_in_the_backlog_gear_with_fewer_calls_and_the_same_output(
    spark: Any, service: Any
) -> None:
    url, state = service
    state.latency = 0.005
    rows = [(seq, seq % 500, seq * 7 % 300) for seq in range(6000)]
    df = spark.createDataFrame(rows, SCHEMA)
    results, calls, gears = {}, {}, {}
    for mode in ("auto", False):
        state.requests = 0
        metrics = AsyncWaitMetrics(spark)
        out = AsyncDataStream.key_ordered_wait(
            df,
            batch_users(url),
            key="order_id",
            order_by="seq",
            num_partitions=2,
            backlog=mode,
            metrics=metrics,
        )
        results[mode] = sorted(tuple(r) for r in out.collect())
        calls[mode] = state.requests
        m = metrics.value
        gears[mode] = (m["backlog_tasks"], m["caught_up_tasks"])
    assert results["auto"] == results[False]
    assert all(r[3] == f"user-{r[2]}" for r in results["auto"])
    assert gears == {"auto": (2, 0), False: (0, 2)}
    assert calls[False] >= 5 * calls["auto"], calls


def test_a_small_micro_batch_runs_caught_up_and_a_large_one_in_backlog(
    spark: Any, service: Any, tmp_path: Path
) -> None:
    url, _ = service
    folder = tmp_path / "in"
    folder.mkdir()
    with open(folder / "small.json", "w") as f:
        for seq in range(20):
            f.write(json.dumps({"seq": seq, "order_id": seq % 5, "user_id": seq}) + "\n")
    metrics = AsyncWaitMetrics(spark)
    out = AsyncDataStream.key_ordered_wait(
        spark.readStream.schema(SCHEMA).json(str(folder)),
        batch_users(url),
        key="order_id",
        order_by="seq",
        num_partitions=2,
        backlog=BacklogPolicy(threshold_rows=50),
        metrics=metrics,
    )
    drain(out, tmp_path)
    assert (metrics.value["backlog_tasks"], metrics.value["caught_up_tasks"]) == (0, 2)
    with open(folder / "large.json", "w") as f:
        for seq in range(20, 220):
            f.write(json.dumps({"seq": seq, "order_id": seq % 5, "user_id": seq}) + "\n")
    drain(out, tmp_path)
    assert metrics.value["backlog_tasks"] == 2  # both partitions of the large micro-batch
    written = spark.read.parquet(str(tmp_path / "out")).collect()
    assert sorted(r.seq for r in written) == list(range(220))


def test_a_bad_backlog_option_names_the_allowed_values(spark: Any, service: Any) -> None:
    url, _ = service
    df = spark.createDataFrame([(1, 1, 1)], SCHEMA)
    with pytest.raises(ConfigError, match="'auto'"):
        AsyncDataStream.ordered_wait(df, batch_users(url), backlog="sometimes")
    with pytest.raises(ConfigError, match="event_time"):
        AsyncDataStream.ordered_wait(df, batch_users(url), backlog="auto", event_time="ts")


def test_the_columnar_backlog_path_hands_failures_to_the_record_path(spark: Any, service: Any) -> None:
    from keyed_async_wait import RetryStrategy

    url, state = service
    # each task's one columnar call fails (2 of the 4), so the record path takes over, and the
    # other 2 failures land on its calls, which it retries
    state.fail(503, count=4)
    rows = [(seq, seq % 50, seq % 40) for seq in range(400)]
    df = spark.createDataFrame(rows, SCHEMA)
    metrics = AsyncWaitMetrics(spark)
    out = AsyncDataStream.key_ordered_wait(
        df,
        batch_users(url),
        key="order_id",
        order_by="seq",
        num_partitions=2,
        backlog=True,
        retry=RetryStrategy.fixed_delay(5, 0.01),
        metrics=metrics,
    ).collect()
    assert sorted(r.seq for r in out) == list(range(400))
    assert all(r.name == f"user-{r.user_id}" for r in out)
    assert metrics.value["retries"] >= 1  # the record path ran, and retried


def test_a_row_without_a_lookup_key_fails_with_its_field_named_in_backlog_too(
    spark: Any, service: Any
) -> None:
    url, _ = service
    df = spark.createDataFrame([(1, 1, 1), (2, 2, None)], SCHEMA)
    with pytest.raises(Exception, match="user_id"):
        AsyncDataStream.key_ordered_wait(df, batch_users(url), key="order_id", backlog=True).collect()


def test_a_micro_batch_whose_event_time_lags_runs_in_the_backlog_gear(
    spark: Any, service: Any, tmp_path: Path
) -> None:
    url, _ = service
    folder = tmp_path / "in"
    folder.mkdir()
    with open(folder / "old.json", "w") as f:
        for seq in range(20):  # a few rows, but from an hour ago: the source is behind
            f.write(json.dumps({"seq": seq, "order_id": seq % 5, "user_id": seq, "ts": 1.0e9 + seq}) + "\n")
    metrics = AsyncWaitMetrics(spark)
    out = AsyncDataStream.key_ordered_wait(
        spark.readStream.schema(SCHEMA + ", ts double").json(str(folder)),
        batch_users(url),
        key="order_id",
        order_by="seq",
        num_partitions=2,
        backlog=BacklogPolicy(threshold_rows=10_000, max_lag=60),
        event_time="ts",
        metrics=metrics,
    )
    drain(out, tmp_path)
    m = metrics.value
    assert m["records"] == 20 and m["backlog_tasks"] >= 1

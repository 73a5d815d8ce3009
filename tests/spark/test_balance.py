"""``balance_keys=True``: each key placed by its rows, every row of a key in one partition, the
results those of the hash placement."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql import functions as F

from keyed_async_wait import AsyncDataStream, ConfigError
from keyed_async_wait.spark import balance
from keyed_async_wait.spark.balance import assign, balanced, key_placement, placed_by

pytestmark = [pytest.mark.spark, pytest.mark.compat("keys placed by their rows")]

KEYS = 2_000
ROWS = 20_000


@given(rows=st.lists(st.integers(1, 1_000), max_size=60), partitions=st.integers(1, 8))
def test_the_fullest_partition_holds_at_most_an_even_share_and_one_key_more(
    rows: list[int], partitions: int
) -> None:
    placed = assign(rows, partitions)
    loads = [0] * partitions
    for n, p in zip(rows, placed, strict=True):
        loads[p] += n
    assert sum(loads) == sum(rows)
    # greedy, heaviest first: the fullest partition took its last key when it was the emptiest
    assert max(loads) <= sum(rows) / partitions + max(rows, default=0)


def _shares(df: Any) -> list[float]:
    counts = [row[1] for row in df.groupBy(F.spark_partition_id()).count().collect()]
    return sorted(n / sum(counts) for n in counts)


def _partitions_of_keys(df: Any) -> dict[Any, set[int]]:
    """Per key, the partitions its rows are in."""
    seen: dict[Any, set[int]] = defaultdict(set)
    for row in df.select("order_id", F.spark_partition_id().alias("p")).distinct().collect():
        seen[row.order_id].add(row.p)
    return seen


def test_keys_split_by_their_rows_where_the_hash_splits_them_unevenly(spark: Any) -> None:
    df = spark.range(ROWS).selectExpr("id AS seq", f"id % {KEYS} AS order_id")
    hashed = df.repartition(2, "order_id")
    assert _shares(hashed)[-1] > 0.51  # 2,000 keys: 52.5% in one partition
    even = balanced(df, ["order_id"], 2)
    assert _shares(even) == [0.5, 0.5]
    assert all(len(parts) == 1 for parts in _partitions_of_keys(even).values())
    assert even.columns == df.columns
    assert even.count() == ROWS


def test_a_key_the_count_did_not_see_and_a_null_key_each_stay_in_one_partition(spark: Any) -> None:
    counted = spark.createDataFrame([(i, i % 10) for i in range(100)], "seq long, order_id long")
    mapping = key_placement(counted, ["order_id"], 3)
    assert mapping is not None
    # what the wait then runs holds keys 10-19 and NULL keys too (a source that changed)
    rows = [(i, i % 20) for i in range(200)] + [(1_000 + i, None) for i in range(5)]
    more = spark.createDataFrame(rows, "seq long, order_id long")
    spread = placed_by(more, ["order_id"], 3, mapping)
    assert spread.columns == more.columns
    seen = _partitions_of_keys(spread)
    assert set(seen) == {*range(20), None}
    assert all(len(parts) == 1 for parts in seen.values())
    assert sorted(spread.collect()) == sorted(more.collect())


def test_past_the_key_limit_keys_go_by_their_hash(
    spark: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(balance, "MAX_KEYS", 5)
    df = spark.range(ROWS).selectExpr("id AS seq", f"id % {KEYS} AS order_id")
    with caplog.at_level(logging.WARNING, logger=balance.__name__):
        spread = balanced(df, ["order_id"], 2)
    assert "over 5 distinct keys; spread by their hash" in caplog.text
    assert _shares(spread) == _shares(df.repartition(2, "order_id"))


async def _echo(row: dict[str, Any]) -> dict[str, Any]:
    await asyncio.sleep(0)
    return {"v": row["seq"]}


def test_the_results_are_those_of_the_hash_placement_in_key_order(spark: Any) -> None:
    df = spark.range(3_000).selectExpr("id AS seq", "id % 37 AS order_id")
    results = {}
    for balance_keys in (False, True):
        out = AsyncDataStream.key_ordered_wait(
            df, _echo, "order_id", order_by="seq", balance_keys=balance_keys, output_schema="v long"
        )
        rows = out.collect()
        assert all(row.v == row.seq for row in rows)
        results[balance_keys] = sorted((row.seq, row.order_id) for row in rows)
    assert results[True] == results[False] == sorted((i, i % 37) for i in range(3_000))


def test_a_streaming_dataframe_cannot_be_balanced_at_the_call(spark: Any, tmp_path: Any) -> None:
    (tmp_path / "a.json").write_text('{"seq": 1, "order_id": 1}\n')
    stream = spark.readStream.schema("seq long, order_id long").json(str(tmp_path))
    with pytest.raises(ConfigError, match=r"balance_keys=True .*False for a streaming DataFrame"):
        AsyncDataStream.key_ordered_wait(stream, _echo, "order_id", balance_keys=True, output_schema="v long")


def test_nan_zero_and_array_keys_are_placed_as_spark_groups_them(spark: Any) -> None:
    nan = float("nan")
    rows = [(i, [nan, 0.0, -0.0][i % 3], [i % 2, 1]) for i in range(90)]
    df = spark.createDataFrame(rows, "seq long, fk double, ak array<int>")
    spread = balanced(df, ["fk", "ak"], 3)
    tagged = spread.withColumn("p", F.spark_partition_id())
    keys = (
        tagged.groupBy("fk", "ak").agg(F.countDistinct("p").alias("parts"), F.count("*").alias("n")).collect()
    )
    assert len(keys) == 4  # NaN, and 0.0 with -0.0, each with two arrays
    assert all(row.parts == 1 for row in keys)
    assert sum(row.n for row in keys) == 90


@pytest.mark.parametrize(
    ("kind", "key"),
    [
        ("string", "concat('k''\\\\', CAST(id % 2000 AS STRING), ' é\"')"),  # quotes, a backslash, UTF-8
        ("int", "CAST(id % 2000 AS INT)"),
        ("double", "CAST(id % 2000 AS DOUBLE)"),  # a join: no map literal of doubles
    ],
)
def test_keys_of_each_kind_are_split_evenly_and_whole(spark: Any, kind: str, key: str) -> None:
    df = spark.range(ROWS).selectExpr("id AS seq", f"{key} AS order_id")
    assert dict(df.dtypes)["order_id"] == kind
    even = balanced(df, ["order_id"], 2)
    assert _shares(even) == [0.5, 0.5]
    assert all(len(parts) == 1 for parts in _partitions_of_keys(even).values())
    assert sorted(even.collect()) == sorted(df.collect())


def test_past_the_literal_limit_the_keys_moved_are_joined(
    spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(balance, "MAX_LITERAL", 3)
    df = spark.range(ROWS).selectExpr("id AS seq", f"id % {KEYS} AS order_id")
    moved = key_placement(df, ["order_id"], 2)
    assert moved is not None and 3 < len(moved) < KEYS // 10  # few keys move, but more than 3
    even = placed_by(df, ["order_id"], 2, moved)
    assert "BroadcastHashJoin" in even._jdf.queryExecution().executedPlan().toString()
    assert _shares(even) == [0.5, 0.5]
    assert all(len(parts) == 1 for parts in _partitions_of_keys(even).values())


def test_keys_of_two_columns_are_split_evenly_and_whole(spark: Any) -> None:
    df = spark.range(ROWS).selectExpr("id AS seq", f"id % {KEYS} AS order_id", "id % 3 AS shop")
    even = balanced(df, ["order_id", "shop"], 3)
    counts = [r[1] for r in even.groupBy(F.spark_partition_id()).count().collect()]
    assert max(counts) - min(counts) <= 10  # keys of ~3 rows each
    tagged = even.withColumn("p", F.spark_partition_id())
    parts = tagged.groupBy("order_id", "shop").agg(F.countDistinct("p").alias("parts"))
    assert parts.count() == 6_000 and parts.where("parts > 1").count() == 0


def test_keys_not_moved_are_where_sparks_hash_puts_them(spark: Any) -> None:
    df = spark.range(ROWS).selectExpr("id AS seq", f"id % {KEYS} AS order_id")
    hashed = {k: p for k, [p] in _partitions_of_keys(df.repartition(2, "order_id")).items()}
    moved = key_placement(df, ["order_id"], 2)
    assert moved
    for keys_moved in (moved, []):  # a map literal; nothing to move
        spread = _partitions_of_keys(placed_by(df, ["order_id"], 2, keys_moved))
        target = {key: p for (key,), p in keys_moved}
        assert {k: p for k, [p] in spread.items()} == {k: target.get(k, p) for k, p in hashed.items()}

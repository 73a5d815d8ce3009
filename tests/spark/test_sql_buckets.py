"""Bucket values are spread evenly over Spark's shuffle partitions (sql_ext.buckets): the
Python hash is Spark's, and every bucket count lands round robin on the partitions."""

from __future__ import annotations

from typing import Any

import pytest

from sql_ext.buckets import MAX_SPREAD, bucket_expression, murmur3_int, spread_values

pytestmark = [pytest.mark.spark, pytest.mark.compat("the SQL buckets' hash is Spark's")]


def test_the_python_hash_is_sparks(spark: Any) -> None:
    values = [0, 1, 2, 3, 17, -1, -5, 2**31 - 1, -(2**31), 123456789]
    rows = spark.createDataFrame([(v,) for v in values], "v int").selectExpr("v", "hash(v) AS h").collect()
    assert {r.v: r.h for r in rows} == {v: murmur3_int(v) for v in values}


@pytest.mark.parametrize("partitions", [1, 2, 3, 8, 200])
def test_buckets_land_round_robin_on_the_partitions(spark: Any, partitions: int) -> None:
    spread = spread_values(partitions)
    assert len(spread) == MAX_SPREAD and len(set(spread)) == MAX_SPREAD
    df = spark.createDataFrame([(i, v) for i, v in enumerate(spread[:64])], "i int, v int")
    placed = df.selectExpr("i", f"pmod(hash(v), {partitions}) AS p").collect()
    assert all(r.p == r.i % partitions for r in placed)


def test_the_bucket_expression_names_each_key_one_bucket(spark: Any) -> None:
    spread = spread_values(2)
    expression = bucket_expression("`k`", 4, spread)
    rows = spark.range(1000).selectExpr("id AS k").selectExpr("k", f"{expression} AS b").collect()
    assert {r.b for r in rows} == set(spread[:4])
    per_task = [sum(1 for r in rows if murmur3_int(r.b) % 2 == t) for t in (0, 1)]
    assert abs(per_task[0] - per_task[1]) < 200, per_task  # two buckets per task, not one and three
    assert bucket_expression("`k`", MAX_SPREAD + 1, spread) == f"pmod(hash(`k`), {MAX_SPREAD + 1})"

"""A micro-batch's own values in plans: right answers, and the same generated code for every
value (no class compiled per micro-batch)."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql import functions as F

from keyed_async_wait.spark.plan_values import at_most, equal_to, one_row


def _compiled(spark: Any) -> int:
    return int(
        spark.sparkContext._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME().getCount()
    )


@pytest.mark.compat("parked state: no code per micro-batch")
def test_comparisons_are_right_at_their_edges_and_compile_once_for_every_value(spark: Any) -> None:
    df = spark.range(40).selectExpr("id AS seg", "CAST(id AS DOUBLE) * 1.5 + 1795000000.25 AS next_try")

    def answers(value: int) -> tuple[int, int, int]:
        row = df.agg(
            F.count(F.when(at_most(F.col("seg"), value), 1)).alias("seg_at_most"),
            F.count(F.when(equal_to(F.col("seg"), value), 1)).alias("seg_equal"),
            F.count(F.when(at_most(F.col("next_try"), 1795000000.25 + 1.5 * value), 1)).alias("due"),
        ).first()
        return row.seg_at_most, row.seg_equal, row.due

    assert answers(10) == (11, 1, 11)  # warm: the plan's classes compiled here
    before = _compiled(spark)
    for value in (0, 17, 39, 41):
        assert answers(value) == (min(value, 39) + 1, int(value <= 39), min(value, 39) + 1)
    assert _compiled(spark) == before, "a new value compiled new code"


@pytest.mark.compat("parked state: no code per micro-batch")
def test_a_value_the_rows_carry_comes_from_a_joined_row_not_the_code(spark: Any) -> None:
    df = spark.range(5).withColumnRenamed("id", "k")

    def carried(batch: int) -> list[int]:
        joined = df.crossJoin(F.broadcast(one_row(spark, "_kaw_batch", batch)))
        return [r._kaw_batch for r in joined.select("_kaw_batch").collect()]

    assert carried(3) == [3] * 5
    before = _compiled(spark)
    assert carried(2**40) == [2**40] * 5
    assert _compiled(spark) == before

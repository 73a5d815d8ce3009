"""What sql_ext does on a pyspark that cannot carry all of it: it says so, naming the feature
and the version, and what it can carry works (run on every version by the compatibility tier)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import sql_ext
from keyed_async_wait import SparkVersionError
from keyed_async_wait.spark.compat import pyspark_version

pytestmark = [pytest.mark.spark, pytest.mark.compat("SQL functions: refused or working, by version")]


async def double(record: dict[str, Any]) -> dict[str, Any]:
    await asyncio.sleep(0.001)
    return {"v": record["id"] * 2}


def test_each_sql_function_works_or_fails_naming_the_version_it_needs(spark: Any) -> None:
    spark.range(40).selectExpr("id", "id % 4 AS k", "id AS seq").createOrReplaceTempView("versions_t")
    if pyspark_version() < (4, 0):
        with pytest.raises(SparkVersionError, match=r"needs pyspark 4\.0 or newer; this is pyspark 3\.5"):
            sql_ext.install(spark, {"dbl": double})
        return
    ext = sql_ext.install(spark)
    ext.register("dbl", double, inputs=["id"], output_schema="v bigint")
    table = spark.sql(
        "SELECT * FROM async_lookup(TABLE(versions_t), 'dbl', upsert_key => 'k', order_by => 'seq')"
    ).collect()
    assert sorted((r.id, r.v) for r in table) == [(i, 2 * i) for i in range(40)]
    scalar = spark.sql("SELECT id, dbl(id) AS u FROM versions_t")
    if pyspark_version() < (4, 2):
        with pytest.raises(Exception, match=r"scalar lookup functions .* needs pyspark 4\.2 or newer"):
            scalar.collect()
    else:
        assert sorted((r.id, r.u.v) for r in scalar.collect()) == [(i, 2 * i) for i in range(40)]

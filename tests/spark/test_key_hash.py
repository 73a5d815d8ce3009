"""Keys as Spark compares them: maps listing the same entries in another order are one key,
placed in one partition and grouped as one by the check of ``assume_partitioned`` (Spark 3.5
hashes a map's entries in the order they are listed); a string key with a collation that is
not byte for byte is refused at the call (Spark 4), and so is such an ``order_by`` column where
the tasks sort."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
from pyspark.sql import functions as F

from keyed_async_wait import AsyncDataStream, ConfigError
from keyed_async_wait.spark.compat import pyspark_version
from keyed_async_wait.spark.key_hash import placement_columns
from keyed_async_wait.spark.key_spread import check_partitioned_by_key

pytestmark = [pytest.mark.spark, pytest.mark.compat("map keys placed whole")]

KEYS = 20


def _two_orders(spark: Any) -> Any:
    """Per key ``i``: a row whose maps list ``a`` first, and one whose maps list ``b`` first (a
    map key, and a struct of an array of maps of maps)."""
    return spark.sql(
        f"SELECT id % {KEYS} AS i, id AS v, "
        f"IF(id < {KEYS}, map('a', id % {KEYS}, 'b', 2), map('b', 2, 'a', id % {KEYS})) AS m, "
        f"named_struct('l', array(IF(id < {KEYS}, map('x', map('a', 1, 'b', id % {KEYS})), "
        f"map('x', map('b', id % {KEYS}, 'a', 1))))) AS s "
        f"FROM range({2 * KEYS})"
    )


def _partitions(df: Any) -> dict[int, set[int]]:
    seen: dict[int, set[int]] = defaultdict(set)
    for row in df.select("i", F.spark_partition_id().alias("p")).collect():
        seen[row.i].add(row.p)
    return seen


@pytest.mark.parametrize("key", [["m"], ["s"], ["m", "s"]])
def test_a_repartition_by_the_placement_puts_each_map_key_in_one_partition(
    spark: Any, key: list[str]
) -> None:
    df = _two_orders(spark)
    placed = _partitions(df.repartition(7, *placement_columns(df.schema, key)))
    assert len(placed) == KEYS
    assert all(len(parts) == 1 for parts in placed.values()), placed
    assert placement_columns(df.schema, ["i", "v"]) == ["i", "v"]  # no map: the names themselves


async def _echo(row: dict[str, Any]) -> dict[str, Any]:
    return {"w": row["v"]}


def test_key_ordered_wait_runs_a_map_key_in_one_task_whatever_order_its_entries_are_listed(
    spark: Any,
) -> None:
    out = AsyncDataStream.key_ordered_wait(
        _two_orders(spark), _echo, "m", order_by="v", num_partitions=7, output_schema="w long"
    )
    placed = _partitions(out)
    assert len(placed) == KEYS
    assert all(len(parts) == 1 for parts in placed.values()), placed
    assert sorted(row.w for row in out.select("w").collect()) == list(range(2 * KEYS))
    with pytest.raises(ConfigError, match=r"balance_keys=True .*a key holding a MAP"):
        AsyncDataStream.key_ordered_wait(
            _two_orders(spark), _echo, "m", balance_keys=True, output_schema="w long"
        )


def test_the_partitioned_check_finds_a_map_key_split_over_its_two_orders(spark: Any) -> None:
    def listed_both_ways(partitions: int) -> Any:  # row 0 in partition 0; row 1 in the last
        return spark.range(0, 2, 1, partitions).selectExpr(
            "id AS v", "IF(id = 0, map('a', 3, 'b', 2), map('b', 2, 'a', 3)) AS m"
        )

    check_partitioned_by_key(listed_both_ways(1), ["m"])
    with pytest.raises(ConfigError, match=r"key '\{\"a\":3,\"b\":2\}' in partitions \[0, 1\]"):
        check_partitioned_by_key(listed_both_ways(2), ["m"])


@pytest.mark.compat("collated string keys refused")
@pytest.mark.skipif(pyspark_version() < (4, 0), reason="collations came with Spark 4")
def test_a_collated_key_or_order_is_refused_at_the_call_and_a_binary_one_runs(
    spark: Any, tmp_path: Any
) -> None:
    """Spark places and groups 'abc' and 'ABC' as one UTF8_LCASE key, which a task would run
    as two keys at once (it compares bytes): refused, naming the column and its collation; so
    is such an order_by where the tasks sort (a stream's key_ordered_wait), not where Spark does."""
    df = spark.sql(
        "SELECT id AS v, collate(IF(id % 2 = 0, 'abc', 'ABC'), 'UTF8_LCASE') AS k, "
        "array(collate('x', 'UNICODE_CI')) AS ks FROM range(6)"
    )
    wait = AsyncDataStream.key_ordered_wait
    with pytest.raises(ConfigError, match=r"key='k' .*column 'k' holds strings of collation UTF8_LCASE"):
        wait(df, _echo, "k", output_schema="w long")
    with pytest.raises(ConfigError, match=r"key=.*column 'ks' holds strings of collation UNICODE_CI"):
        wait(df, _echo, ["v", "ks"], output_schema="w long")
    stream = spark.readStream.schema(df.schema).parquet(str(tmp_path))
    with pytest.raises(ConfigError, match=r"order_by=\['k'\] .*collation UTF8_LCASE"):
        wait(stream, _echo, "v", order_by="k", output_schema="w long")  # the tasks sort a stream's rows
    with pytest.raises(ConfigError, match=r"key='k' .*collation UTF8_LCASE"):
        AsyncDataStream.key_ordered_stream(
            stream,
            _echo,
            "k",
            sink=lambda out, batch_id: None,
            checkpoint_location=str(tmp_path / "cp"),
            output_schema="w long",
        )
    by_case = wait(df, _echo, "v", order_by="k", output_schema="w long")  # Spark sorts a batch's
    assert by_case.count() == 6
    binary = df.withColumn("k", F.expr("collate(k, 'UTF8_BINARY')"))
    out = wait(binary, _echo, "k", order_by="v", output_schema="w long")
    assert sorted((r.k, r.w) for r in out.collect()) == [
        ("ABC", 1),
        ("ABC", 3),
        ("ABC", 5),
        ("abc", 0),
        ("abc", 2),
        ("abc", 4),
    ]

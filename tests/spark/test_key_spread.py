"""What checks ``assume_partitioned``: the merge of the tasks' key hashes (pure), and the grouping
of the output by key (a real local[2] session)."""

from __future__ import annotations

from functools import reduce
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql import functions as F

from keyed_async_wait import AsyncDataStream, ConfigError
from keyed_async_wait.spark.key_spread import (
    KeySpread,
    check_key_spread,
    check_partitioned_by_key,
    key_spread,
)

tasks_keys = st.lists(st.frozensets(st.integers(0, 30), max_size=12), max_size=6)


@given(tasks_keys)
def test_the_merge_keeps_exactly_the_keys_more_than_one_task_ran(tasks: list[frozenset[int]]) -> None:
    param = KeySpread()
    merged = reduce(param.addInPlace, [(keys, frozenset()) for keys in tasks], param.zero(None))  # type: ignore[arg-type]
    in_tasks = {key: sum(key in keys for keys in tasks) for key in set().union(*tasks)}
    assert merged[0] == frozenset(in_tasks)
    assert merged[1] == frozenset(key for key, n in in_tasks.items() if n > 1)


@given(tasks_keys, st.randoms())
def test_the_merge_does_not_depend_on_the_order_tasks_finish(
    tasks: list[frozenset[int]], rnd: object
) -> None:
    param = KeySpread()
    updates = [(keys, frozenset()) for keys in tasks]
    shuffled = list(updates)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    fold = lambda items: reduce(param.addInPlace, items, param.zero(None))  # noqa: E731
    assert fold(updates) == fold(shuffled)


def _in_two_partitions(spark: Any, first: list[tuple[Any, ...]], second: list[tuple[Any, ...]]) -> Any:
    rows = spark.sparkContext.parallelize([*first, *second], 2)  # the first half in partition 0
    return spark.createDataFrame(rows, "k long, v long")


@pytest.mark.spark
@pytest.mark.compat("streaming: assume_partitioned checked")
def test_the_grouping_names_a_key_in_two_partitions_and_leaves_keyless_rows_out(spark: Any) -> None:
    """The check Spark Connect always runs (and a classic session when tasks shared hashes)."""
    keyless = _in_two_partitions(spark, [(1, 0), (None, 1)], [(2, 2), (None, 3)])
    check_key_spread(keyless, ["k"], None, 7)  # NULL keys are no keys: nothing to order
    split = _in_two_partitions(spark, [(1, 0), (2, 1)], [(3, 2), (1, 3)])
    with pytest.raises(ConfigError, match=r"micro-batch 7 .*key 1 in partitions \[0, 1\]"):
        check_key_spread(split, ["k"], None, 7)
    with pytest.raises(ConfigError, match=r"key \(None, 1\) in partitions \[0, 1\]"):
        check_key_spread(_in_two_partitions(spark, [(None, 1)], [(None, 1)]), ["k", "v"], None, 7, True)


@pytest.mark.spark
@pytest.mark.compat("streaming: assume_partitioned checked")
def test_a_key_holding_a_map_is_grouped_by_its_json(spark: Any) -> None:
    """pyspark before 4 groups no map: such a key (or a whole record with one) still names its
    split, on every supported version."""
    rows = spark.sparkContext.parallelize([({"a": 1}, [{"x": 1}], 0), ({"a": 1}, [{"x": 2}], 1)], 2)
    df = spark.createDataFrame(rows, "m map<string,bigint>, am array<map<string,int>>, v long")
    with pytest.raises(ConfigError, match=r"key '\{\"a\":1\}' in partitions \[0, 1\]"):
        check_key_spread(df, ["m"], None, 2)
    check_key_spread(df, ["m", "am"], None, 2)  # two keys, one partition each
    with pytest.raises(ConfigError, match="in partitions"):
        check_partitioned_by_key(df.union(df), ["m", "am"], whole_record=True)


@pytest.mark.spark
@pytest.mark.compat("streaming: assume_partitioned checked")
def test_the_driver_lets_go_of_the_hashes_once_checked(spark: Any) -> None:
    """PySpark's driver keeps every accumulator: a long stream must not keep every key's hash."""
    spread = key_spread(spark)
    spread.add((frozenset(range(1000)), frozenset()))
    check_key_spread(_in_two_partitions(spark, [(1, 0)], [(2, 1)]), ["k"], spread, 3)
    assert spread.value == (frozenset(), frozenset())


async def _times_ten(row: dict[str, Any]) -> dict[str, Any]:
    return {"w": row["v"] * 10}


@pytest.mark.spark
@pytest.mark.compat("batch: assume_partitioned checked")
def test_a_batch_dataframe_not_partitioned_by_key_is_refused_at_the_call(spark: Any) -> None:
    """key_ordered_wait(assume_partitioned=True) on a batch DataFrame: a key in two partitions
    would run in two tasks at once, and a sink's output cannot be taken back, so it fails at the
    call; one whose partitions hold each key whole runs in them."""
    split = _in_two_partitions(spark, [(1, 0), (2, 1)], [(3, 2), (1, 3)])
    with pytest.raises(ConfigError, match=r"assume_partitioned=True .*key 1 in partitions \[0, 1\]"):
        AsyncDataStream.key_ordered_wait(
            split, _times_ten, "k", order_by="v", assume_partitioned=True, output_schema="w long"
        )
    whole = _in_two_partitions(spark, [(1, 0), (2, 1), (1, 4)], [(3, 2), (3, 3), (4, 5)])
    out = AsyncDataStream.key_ordered_wait(
        whole, _times_ten, "k", order_by="v", assume_partitioned=True, output_schema="w long"
    )
    rows = out.select("k", "v", "w", F.spark_partition_id().alias("p")).collect()
    assert sorted((r.k, r.v, r.w, r.p) for r in rows) == [
        (1, 0, 0, 0),
        (1, 4, 40, 0),
        (2, 1, 10, 0),
        (3, 2, 20, 1),
        (3, 3, 30, 1),
        (4, 5, 50, 1),
    ]

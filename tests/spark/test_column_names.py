"""Columns whose names Spark reads as paths (a dot, a backtick): every wait sees and gives back
the columns as they are named, never a struct's field of the same spelling in their place."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keyed_async_wait import AsyncDataStream, ConfigError, split_errors
from keyed_async_wait.spark.column_names import misread, stage_names

pytestmark = [pytest.mark.spark, pytest.mark.compat("columns named with dots and backticks")]

ROWS = 200


def _frame(spark: Any) -> Any:
    # `a.b` beside a struct a with a field b of other values: resolving by name picks the field
    return spark.sql(
        f"SELECT id AS `s.eq`, id % 7 AS `a.b`, named_struct('b', 100 + id % 3) AS a, "
        f"id % 5 AS `q``t`, id % 11 AS `x y` FROM range({ROWS})"
    )


async def _seen(record: dict[str, Any]) -> dict[str, Any]:
    await asyncio.sleep(0)
    if record["a.b"] == 6 and record["s.eq"] % 2:
        raise ValueError("odd sixes fail")
    return {"v.out": f"{record['a.b']}/{record['a']['b']}/{record['q`t']}/{record['x y']}"}


def _expected(seq: int) -> str:
    return f"{seq % 7}/{100 + seq % 3}/{seq % 5}/{seq % 11}"


@pytest.mark.parametrize(
    "wait",
    [
        pytest.param(lambda df, **kw: AsyncDataStream.unordered_wait(df, _seen, **kw), id="unordered"),
        pytest.param(lambda df, **kw: AsyncDataStream.ordered_wait(df, _seen, **kw), id="ordered"),
        pytest.param(
            lambda df, **kw: AsyncDataStream.key_ordered_wait(df, _seen, "a.b", order_by="s.eq", **kw),
            id="key_ordered",
        ),
        pytest.param(
            lambda df, **kw: AsyncDataStream.key_ordered_wait(
                df, _seen, ["a.b", "q`t"], order_by="s.eq", balance_keys=True, **kw
            ),
            id="key_ordered-balanced",
        ),
    ],
)
def test_every_wait_reads_and_writes_the_columns_by_their_names(spark: Any, wait: Any) -> None:
    out = wait(_frame(spark), output_schema="`v.out` string", error_column="e.rr", observe="dotted")
    assert out.columns == ["s.eq", "a.b", "a", "q`t", "x y", "v.out", "e.rr"]
    good, failed = split_errors(out, "e.rr")
    rows = good.collect()
    assert sorted(r["s.eq"] for r in rows) == [i for i in range(ROWS) if not (i % 7 == 6 and i % 2)]
    assert all(r["v.out"] == _expected(r["s.eq"]) and r["a.b"] == r["s.eq"] % 7 for r in rows)
    assert all(r["a"]["b"] == 100 + r["s.eq"] % 3 for r in rows)
    errors = failed.collect()
    assert errors and all("odd sixes fail" in r["e.rr"]["error_message"] for r in errors)


def test_a_key_named_with_a_dot_is_kept_whole_in_one_partition_in_its_order(spark: Any) -> None:
    seen: dict[int, list[int]] = defaultdict(list)
    out = AsyncDataStream.key_ordered_wait(
        _frame(spark).repartition(3).where("`a.b` < 6"),
        _seen,
        "a.b",
        order_by="s.eq",
        output_schema="`v.out` string",
        join="inner",
    )
    where = out.selectExpr("`a.b` AS k", "`s.eq` AS s", "spark_partition_id() AS p").collect()
    parts: dict[int, set[int]] = defaultdict(set)
    for row in where:
        parts[row.k].add(row.p)
        seen[row.k].append(row.s)
    assert sorted(parts) == list(range(6)) and all(len(p) == 1 for p in parts.values()), parts
    assert all(s == sorted(s) for s in seen.values())


def test_a_stream_of_such_columns_is_refused_at_the_call_naming_the_column(spark: Any, tmp_path: Any) -> None:
    stream = spark.readStream.format("rate").load().selectExpr("value AS `v.k`", "timestamp")
    with pytest.raises(ConfigError, match=r"v\.k.*withColumnRenamed"):
        AsyncDataStream.key_ordered_stream(
            stream, _seen, "v.k", sink=lambda df, batch: None, checkpoint_location=str(tmp_path)
        )


names = st.lists(st.text(alphabet="ab.`_kawcol0123", min_size=1, max_size=8), max_size=12, unique=True)


@given(names)
def test_only_names_spark_misreads_are_renamed_each_to_a_name_of_no_other_column(columns: list[str]) -> None:
    renamed = stage_names(columns) or {}
    assert set(renamed) == {c for c in columns if misread(c)}
    staged = [renamed.get(c, c) for c in columns]
    assert len(set(staged)) == len(columns)
    assert not any(misread(c) for c in staged)

"""RowSource, the task's rows in and Arrow batches out, without Spark: whatever order the rows
leave in, whatever their outcome (one result, several, none, a failure), and however many
batches are held (so that mostly-finished ones are compacted, some more than once), every
output row carries exactly its input row's columns."""

from __future__ import annotations

import random
import re
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keyed_async_wait.core.elements import FailedRecord
from keyed_async_wait.spark.output import ResultSchemaError, RowSource

ERROR = pa.struct([("error_type", pa.string()), ("error_message", pa.string()), ("attempts", pa.int32())])


def plan(join: str = "inner", errors: bool = False) -> Any:
    fields = [("seq", pa.int64()), ("name", pa.string()), ("v", pa.int64())]
    if errors:
        fields.append(("error", ERROR))
    return SimpleNamespace(
        spec=SimpleNamespace(key_fields=("seq",)),
        join=join,
        input_columns=["seq", "name"],
        result_columns=["v"],
        out_schema=pa.schema(fields),
        error_column="error" if errors else None,
        passthrough=(),
        session_tz=None,
    )


def batch(start: int, size: int) -> pa.RecordBatch:
    seqs = list(range(start, start + size))
    return pa.RecordBatch.from_pydict({"seq": seqs, "name": [f"n{s}" for s in seqs]})


def outcome(record: dict[str, Any], kind: str) -> Any:
    seq = record["seq"]
    if kind == "failed":
        return FailedRecord(record, seq, "Boom", f"no {seq}", 2)
    results = {"one": [{"v": seq * 10}], "two": [{"v": seq * 10}, {"v": seq * 10 + 1}], "none": []}[kind]
    return (record, results)


def expected_rows(record: dict[str, Any], kind: str, join: str) -> list[tuple[Any, ...]]:
    seq, name = record["seq"], record["name"]
    if kind == "one":
        return [(seq, name, seq * 10, None)]
    if kind == "two":
        return [(seq, name, seq * 10, None), (seq, name, seq * 10 + 1, None)]
    if kind == "none":
        return [(seq, name, None, None)] if join == "left" else []
    return [(seq, name, None, ("Boom", f"no {seq}", 2))]


def rows_of(out: pa.RecordBatch, errors: bool) -> list[tuple[Any, ...]]:
    data = out.to_pylist()
    if not errors:
        return [(r["seq"], r["name"], r["v"], None) for r in data]
    error = [None if r["error"] is None else tuple(r["error"].values()) for r in data]
    return [(r["seq"], r["name"], r["v"], e) for r, e in zip(data, error, strict=True)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(1, 40), min_size=20, max_size=50),
    seed=st.integers(0, 2**32 - 1),
    join=st.sampled_from(["inner", "left"]),
    errors=st.booleans(),
    common=st.floats(0.0, 1.0),
)
def test_every_output_row_carries_its_own_input_row(
    sizes: list[int], seed: int, join: str, errors: bool, common: float
) -> None:
    rng = random.Random(seed)
    kinds = ["one", "two", "none"] + (["failed"] if errors else [])
    source = RowSource(plan(join, errors))
    live: list[dict[str, Any]] = []
    position_of: dict[int, int] = {}
    start = 0

    def finish(records: list[dict[str, Any]]) -> None:
        items, want = [], []
        for record in records:
            kind = "one" if rng.random() < common else rng.choice(kinds)
            assert source.position(record) == position_of[record["seq"]]
            items.append(outcome(record, kind))
            want += expected_rows(record, kind, join)
        assert rows_of(source.assemble(items), errors) == want

    due: dict[int, int] = {}  # seq -> the round it leaves in
    for round_, size in enumerate(sizes):
        (rows,) = source.chunks([batch(start, size)])
        position_of.update((r["seq"], start + i) for i, r in enumerate(rows))
        # most rows leave soon, a few stay for long: batches are held, then compacted
        due.update(
            (r["seq"], round_ + (rng.randrange(2) if rng.random() < 0.85 else rng.randrange(15, 40)))
            for r in rows
        )
        start += size
        live += rows
        rng.shuffle(live)
        finish([r for r in live if due[r["seq"]] <= round_])
        live = [r for r in live if due[r["seq"]] > round_]
    finish(live)
    assert not source._batches and not source._where and not source._kept  # everything released


def test_many_held_batches_are_compacted_and_still_found() -> None:
    source = RowSource(plan())
    slow: list[dict[str, Any]] = []
    for n in range(40):  # each batch keeps every tenth row, from row n % 10 on
        (rows,) = source.chunks([batch(n * 100, 100)])
        slow += rows[n % 10 :: 10]
        source.assemble([(r, [{"v": 1}]) for i, r in enumerate(rows) if i % 10 != n % 10])
        if n == 30:  # a compacted batch that is mostly out is compacted again
            source.assemble([(r, [{"v": 1}]) for r in slow[:8]])
            slow = slow[8:]
    assert source._kept, "mostly-finished batches are compacted"
    assert sum(b.num_rows for b in source._batches.values()) <= 40 * 10 + 2 * 100
    out = source.assemble([(r, [{"v": r["seq"]}]) for r in reversed(slow)])
    assert out.column("seq").to_pylist() == [r["seq"] for r in reversed(slow)]
    assert out.column("name").to_pylist() == [f"n{r['seq']}" for r in reversed(slow)]
    assert not source._batches


def test_a_value_that_does_not_fit_names_the_key_of_a_compacted_row() -> None:
    source = RowSource(plan())
    slow = []
    for n in range(20):
        (rows,) = source.chunks([batch(n * 10, 10)])
        slow.append(rows[3])
        source.assemble([(r, [{"v": 1}]) for r in rows if r is not rows[3]])
    assert 0 in source._kept  # the first batch holds only its row 3 now
    with pytest.raises(ResultSchemaError, match=r"column 'v' \(int64\).*'x'.*key 3"):
        source.assemble([(slow[1], [{"v": 1}]), (slow[0], [{"v": "x"}])])


@pytest.mark.parametrize(
    ("odd", "message"),
    [
        ({"v": 1, "w": 2}, r"result column 'w' is not in the output schema.*key 5"),
        ({}, r"result column 'v' is missing.*key 5"),
        ({"w": 2}, r"result column 'w' is not in the output schema.*key 5"),
        ([1], r"a result must be a dict.*key 5"),
    ],
)
def test_one_odd_result_among_plain_ones_is_named(odd: Any, message: str) -> None:
    source = RowSource(plan())
    (rows,) = source.chunks([batch(0, 10)])
    chunk = [(r, [odd if r["seq"] == 5 else {"v": r["seq"]}]) for r in rows]
    with pytest.raises(ResultSchemaError, match=message):
        source.assemble(chunk)


def test_a_plain_chunk_gives_the_same_batch_as_the_item_by_item_path() -> None:
    fast, slow = RowSource(plan("left", errors=True)), RowSource(plan("left", errors=True))
    (rows_a,) = fast.chunks([batch(0, 50)])
    (rows_b,) = slow.chunks([batch(0, 50)])
    out_a = fast.assemble([(r, [{"v": r["seq"] * 2}]) for r in reversed(rows_a)])
    # a state value per item (parking plans) always takes the item-by-item path
    out_b = slow.assemble([(r, [{"v": r["seq"] * 2}]) for r in reversed(rows_b)], state=[None] * 50)
    assert out_a.equals(out_b)
    assert out_a.column("seq").to_pylist() == list(range(49, -1, -1))
    assert out_a.column("error").null_count == 50
    assert not fast._batches and not slow._batches


@pytest.mark.parametrize(
    ("odd", "says"),
    [
        ({"v": 5.7}, r"result column 'v' \(int64\) cannot hold 5\.7 for the record with key 5"),
        ({"v": 1, "w": 2}, r"result column 'w' is not in the output schema.*key 5"),
        ({}, r"result column 'v' is missing.*key 5"),
        ([1], r"a result must be a dict.*key 5"),
    ],
)
def test_with_an_error_column_a_result_that_does_not_fit_is_that_rows_error(odd: Any, says: str) -> None:
    source = RowSource(plan("left", errors=True))
    (rows,) = source.chunks([batch(0, 10)])
    chunk = [(r, [odd if r["seq"] == 5 else {"v": r["seq"]}]) for r in rows]
    out = source.assemble(chunk).to_pylist()
    assert [r["seq"] for r in out] == list(range(10))  # every row kept, in its place
    for row in out:
        if row["seq"] == 5:
            assert row["v"] is None and row["error"]["error_type"] == "ResultSchemaError"
            assert re.search(says, row["error"]["error_message"]), row["error"]["error_message"]
        else:
            assert row["v"] == row["seq"] and row["error"] is None
    assert not source._batches  # every row released

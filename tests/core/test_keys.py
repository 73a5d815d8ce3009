"""Keys group as Spark groups them: NaN with NaN, -0.0 with 0.0, lists and maps by value."""

from __future__ import annotations

import datetime as dt
import decimal
import math
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keyed_async_wait.core.keys import NAN, freeze, stable_hash
from keyed_async_wait.operator import KeyedAsyncWaitOperator, OutputMode

from .helpers import collect, next_turn, run


def _other_nan() -> float:
    """A NaN with another payload, as a foreign system may send it."""
    return struct.unpack(">d", b"\x7f\xf8\x00\x00\x00\x00\x00\x01")[0]


def test_every_nan_is_one_key_and_negative_zero_is_zero() -> None:
    keys = [float("nan"), float("nan"), _other_nan(), -float("nan")]
    assert {freeze(k) for k in keys} == {NAN} and len({freeze(k) for k in keys}) == 1
    assert len({stable_hash(k) for k in keys}) == 1
    assert freeze(-0.0) == 0.0 and math.copysign(1, freeze(-0.0)) == 1.0
    assert stable_hash(-0.0) == stable_hash(0.0) == stable_hash(0)


def test_lists_and_dicts_are_keys_by_value() -> None:
    assert freeze([1, [2, float("nan")]]) == (1, (2, NAN))
    assert freeze({"b": 1, "a": [2]}) == freeze({"a": [2], "b": 1})
    assert stable_hash([1, 2]) == stable_hash((1, 2))


def test_equal_values_of_other_types_hash_alike() -> None:
    # Python treats these as one dict key, so snapshots must put them in one key group
    assert stable_hash(decimal.Decimal("1.00")) == stable_hash(1) == stable_hash(1.0)
    assert stable_hash(decimal.Decimal("0.5")) == stable_hash(0.5)
    assert stable_hash(decimal.Decimal("0.10")) == stable_hash(decimal.Decimal("0.1"))
    utc = dt.datetime(2024, 1, 1, 12, tzinfo=dt.UTC)
    plus2 = utc.astimezone(dt.timezone(dt.timedelta(hours=2)))
    assert utc == plus2 and stable_hash(utc) == stable_hash(plus2)


key_values = st.one_of(
    st.sampled_from([float("nan"), _other_nan(), 0.0, -0.0, 1.5]),
    st.lists(st.integers(0, 2), max_size=2),
    st.integers(0, 3),
)


class GroupedAction:
    """Counts overlap and start order per key as Spark groups it (NaN with NaN, lists by value)."""

    def __init__(self) -> None:
        self.running: dict[Any, int] = {}
        self.overlaps = 0
        self.starts: dict[Any, list[int]] = {}

    async def __call__(self, record: dict) -> dict:
        group = freeze(record["k"])
        self.running[group] = self.running.get(group, 0) + 1
        self.overlaps += self.running[group] > 1
        self.starts.setdefault(group, []).append(record["id"])
        try:
            for _ in range(record.get("lat", 1)):
                await next_turn()
            return {"id": record["id"], "group": group}
        finally:
            self.running[group] -= 1


@settings(max_examples=60, deadline=None)
@given(keys=st.lists(key_values, min_size=1, max_size=30), lats=st.lists(st.integers(0, 4), max_size=30))
def test_key_ordered_runs_keys_that_group_alike_one_at_a_time(keys: list[Any], lats: list[int]) -> None:
    records = [{"id": i, "k": k, "lat": lats[i] if i < len(lats) else 1} for i, k in enumerate(keys)]
    action = GroupedAction()
    op = KeyedAsyncWaitOperator(action, mode=OutputMode.KEY_ORDERED, key="k", capacity=8)
    out = run(collect(op, records))
    assert sorted(x["id"] for x in out) == list(range(len(records)))
    assert action.overlaps == 0
    assert all(ids == sorted(ids) for ids in action.starts.values())
    assert set(action.starts) == {freeze(k) for k in keys}


@pytest.mark.parametrize("key", ["k", ["k", "j"], lambda r: r["k"]], ids=["field", "fields", "callable"])
def test_every_selector_kind_groups_nan_and_lists(key: Any) -> None:
    records = [{"id": i, "k": float("nan") if i % 2 else [1, i % 4 // 2], "j": 1, "lat": 2} for i in range(8)]
    action = GroupedAction()
    op = KeyedAsyncWaitOperator(action, mode=OutputMode.KEY_ORDERED, key=key, capacity=8)
    out = run(collect(op, records))
    assert len(out) == 8 and action.overlaps == 0
    assert action.starts[NAN] == [1, 3, 5, 7]
    assert action.starts[(1, 0)] == [0, 4] and action.starts[(1, 1)] == [2, 6]

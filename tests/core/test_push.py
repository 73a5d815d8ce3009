"""PushDriver: the operator fed by synchronous pushes (the table function's eval/terminate)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keyed_async_wait import RetryStrategy
from keyed_async_wait.operator import KeyedAsyncWaitOperator, OutputMode
from keyed_async_wait.runtime.push import PushDriver

from .helpers import TurnsAction

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def pushes(draw: st.DrawFn) -> list[list[dict[str, Any]]]:
    n = draw(st.integers(0, 80))
    keys = draw(st.lists(st.integers(0, 6), min_size=n, max_size=n))
    lats = draw(st.lists(st.integers(0, 6), min_size=n, max_size=n))
    records = [{"id": i, "k": keys[i], "lat": lats[i]} for i in range(n)]
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=12)))
    groups, start = [], 0
    for cut in [*cuts, n]:
        groups.append(records[start:cut])
        start = cut
    return groups


def _drive(op: KeyedAsyncWaitOperator, groups: list[list[dict[str, Any]]]) -> tuple[list[Any], list[int]]:
    loop = asyncio.new_event_loop()
    try:
        driver = PushDriver(op, loop)
        outputs: list[Any] = []
        admitted_after_push: list[int] = []
        pushed = 0
        for group in groups:
            outputs += driver.push(group)
            pushed += len(group)
            admitted_after_push.append(op.stats.records_in - pushed)
        outputs += driver.finish()
        return outputs, admitted_after_push
    finally:
        loop.close()


@SETTINGS
@given(groups=pushes(), capacity=st.integers(1, 10), mode=st.sampled_from(list(OutputMode)))
def test_every_push_is_admitted_and_every_record_leaves_once_in_the_modes_order(
    groups: list[list[dict[str, Any]]], capacity: int, mode: OutputMode
) -> None:
    action = TurnsAction()
    # blocked_capacity=0: records behind their keys count against the capacity (max_inside below)
    op = KeyedAsyncWaitOperator(action, mode=mode, key="k", capacity=capacity, blocked_capacity=0)
    action.operator = op
    outputs, behind = _drive(op, groups)
    records = [r for g in groups for r in g]
    out_ids = [o["id"] for o in outputs]
    assert sorted(out_ids) == [r["id"] for r in records]  # once each
    assert all(b == 0 for b in behind)  # a push returns once its records are inside
    assert action.max_inside <= capacity
    if mode is OutputMode.ORDERED:
        assert out_ids == [r["id"] for r in records]
    if mode is OutputMode.KEY_ORDERED:
        assert action.max_running_per_key <= 1
        for key in {r["k"] for r in records}:
            mine = [r["id"] for r in records if r["k"] == key]
            assert [o["id"] for o in outputs if o["k"] == key] == mine
            assert action.starts_per_key[key] == mine


def test_a_failure_surfaces_from_push_or_finish_and_abort_leaves_nothing_running() -> None:
    action = TurnsAction(fail=[(3, 1)])
    op = KeyedAsyncWaitOperator(action, mode="ordered", capacity=4)
    loop = asyncio.new_event_loop()
    try:
        driver = PushDriver(op, loop)
        records = [{"id": i, "k": i % 2, "lat": 2} for i in range(10)]
        with pytest.raises(Exception, match="record 3 attempt 1"):
            for i in range(0, 10, 2):
                driver.push(records[i : i + 2])
            driver.finish()
        driver.abort()
        assert not [t for t in asyncio.all_tasks(loop) if not t.done()]
    finally:
        loop.close()


def test_abort_in_the_middle_cancels_the_records_in_flight() -> None:
    action = TurnsAction()
    op = KeyedAsyncWaitOperator(action, mode="unordered", capacity=8)
    loop = asyncio.new_event_loop()
    try:
        driver = PushDriver(op, loop)
        driver.push([{"id": i, "k": i, "lat": 50} for i in range(5)])
        assert op.stats.in_flight == 5
        driver.abort()
        assert not [t for t in asyncio.all_tasks(loop) if not t.done()]
        with pytest.raises(RuntimeError, match="after finish"):
            driver.push([{"id": 9, "k": 9}])
    finally:
        loop.close()


def test_retries_happen_between_pushes() -> None:
    action = TurnsAction(fail=[(0, 1), (0, 2)])
    op = KeyedAsyncWaitOperator(
        action, mode="key_ordered", key="k", capacity=3, retry=RetryStrategy.fixed_delay(3, 0.0)
    )
    outputs, _ = _drive(op, [[{"id": 0, "k": "a"}, {"id": 1, "k": "a"}], [{"id": 2, "k": "b"}]])
    assert [o["id"] for o in outputs if o["k"] == "a"] == [0, 1]
    assert action.attempts[0] == 3

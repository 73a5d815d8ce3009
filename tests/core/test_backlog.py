"""The two gears (FLIP-327): the pure decision, and batching without a flush timer."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keyed_async_wait import AsyncFunction, ConfigError
from keyed_async_wait.core.backlog import BACKLOG, CAUGHT_UP, BacklogPolicy
from keyed_async_wait.operator import KeyedAsyncWaitOperator

from .helpers import next_turn, run

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_the_policy_decides_by_flag_boundedness_rows_and_lag() -> None:
    auto = BacklogPolicy(threshold_rows=100, max_lag=60)
    assert auto.decide(bounded=True, rows=0, input_ended=False) == (BACKLOG, "a bounded (batch) query")
    assert auto.decide(bounded=False, rows=100, input_ended=False)[0] is BACKLOG
    gear, reason = auto.decide(bounded=False, rows=5, input_ended=True, lag=120)
    assert gear is BACKLOG and "lags 120 s" in reason
    gear, reason = auto.decide(bounded=False, rows=5, input_ended=True, lag=3)
    assert gear is CAUGHT_UP and reason == "input 5 rows in all (threshold 100)"
    assert BacklogPolicy(is_backlog=False).decide(bounded=True, rows=10**6, input_ended=True)[0] is CAUGHT_UP
    assert BacklogPolicy(is_backlog=True).decide(bounded=False, rows=0, input_ended=True)[0] is BACKLOG
    with pytest.raises(ConfigError, match="threshold_rows"):
        BacklogPolicy(threshold_rows=0)


class BatchLookup(AsyncFunction[dict, dict]):
    """A batch action taking ``turns`` loop turns per call; counts calls and their sizes."""

    def __init__(self, turns: int = 2) -> None:
        self.turns = turns
        self.calls: list[int] = []
        self.running: dict[Any, int] = defaultdict(int)
        self.max_per_key = 0

    async def invoke(self, record: dict) -> list[dict]:
        return (await self.invoke_batch([record]))[0]

    async def invoke_batch(self, records: list[dict]) -> list[list[dict]]:
        self.calls.append(len(records))
        for r in records:
            self.running[r["k"]] += 1
            self.max_per_key = max(self.max_per_key, self.running[r["k"]])
        for _ in range(self.turns):
            await next_turn()
        for r in records:
            self.running[r["k"]] -= 1
        return [[{"id": r["id"], "k": r["k"], "v": r["u"] * 2}] for r in records]


async def _collect(op: KeyedAsyncWaitOperator, records: list[dict]) -> list[Any]:
    return [x async for x in op.process(records)]


@SETTINGS
@given(
    n=st.integers(0, 300),
    keys=st.integers(1, 40),
    capacity=st.integers(1, 200),
    batch=st.integers(1, 64),
    turns=st.integers(0, 3),
)
def test_without_a_flush_timer_every_record_leaves_once_in_key_order(
    n: int, keys: int, capacity: int, batch: int, turns: int
) -> None:
    records = [{"id": i, "k": i % keys, "u": i % 7} for i in range(n)]
    action = BatchLookup(turns)
    op = KeyedAsyncWaitOperator(
        action, mode="key_ordered", key="k", capacity=capacity, batch_size=batch, buffer_timeout=None
    )
    out = run(_collect(op, records))
    assert sorted(o["id"] for o in out) == list(range(n))
    per_key: dict[int, list[int]] = defaultdict(list)
    for o in out:
        per_key[o["k"]].append(o["id"])
    assert all(ids == sorted(ids) for ids in per_key.values())
    assert action.max_per_key <= 1
    assert all(size <= batch for size in action.calls)


def test_the_backlog_gear_makes_fewer_larger_calls_with_the_same_output() -> None:
    records = [{"id": i, "k": i % 500, "u": i % 7} for i in range(5000)]
    outputs, calls = {}, {}
    for gear in (BACKLOG, CAUGHT_UP):
        action = BatchLookup(turns=2)
        op = KeyedAsyncWaitOperator(
            action,
            mode="key_ordered",
            key="k",
            capacity=gear.capacity,
            batch_size=gear.batch_size,
            buffer_timeout=gear.buffer_timeout,
        )
        outputs[gear.name] = sorted(run(_collect(op, records)), key=lambda o: o["id"])
        calls[gear.name] = len(action.calls)
    assert outputs["backlog"] == outputs["caught-up"]
    assert calls["caught-up"] >= 5 * calls["backlog"], calls


def test_a_gear_is_one_of_two_kinds_checked_when_made() -> None:
    import pickle

    from keyed_async_wait.core.backlog import BACKLOG, CAUGHT_UP, Gear, GearKind
    from keyed_async_wait.core.exceptions import ConfigError

    custom = Gear("backlog", capacity=5, batch_size=5, buffer_timeout=None)
    assert custom.is_backlog and custom.kind is GearKind.BACKLOG and custom.name == "backlog"
    assert BACKLOG.is_backlog and not CAUGHT_UP.is_backlog
    assert pickle.loads(pickle.dumps(custom)).is_backlog
    with pytest.raises(ConfigError, match="Gear name='Backlog'"):
        Gear("Backlog", capacity=5, batch_size=5, buffer_timeout=None)

"""Holding a run (a time cap) and deferring failed records: what is left over, and its replay.

Invariant under test: across runs, every record leaves exactly once (as results or as an error
row), and per key the records run one at a time and leave in arrival order, whatever the point
of the hold, the failures and the deferral times."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keyed_async_wait import ConfigError, RetryStrategy
from keyed_async_wait.core.parking import DeferPolicy, ParkedBatch, ParkedItem, ParkedKeys, ParkInfo
from keyed_async_wait.operator import FailedRecord, KeyedAsyncWaitOperator

from .helpers import TurnsAction, next_turn, run

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@st.composite
def updates(draw: st.DrawFn) -> list[dict[str, Any]]:
    n = draw(st.integers(0, 50))
    keys = draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))
    lats = draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))
    return [{"id": i, "k": keys[i], "lat": lats[i]} for i in range(n)]


async def _run(op: KeyedAsyncWaitOperator, records: list[dict], hold_after: int | None = None) -> list[Any]:
    """Run ``records`` through ``op``; hold after ``hold_after`` loop turns (None: never)."""
    loop = asyncio.get_running_loop()
    if hold_after is not None:

        async def hold_later() -> None:
            for _ in range(hold_after):
                await next_turn()
            op.hold()

        holder = loop.create_task(hold_later())
    out = [x async for x in op.process(records)]
    if hold_after is not None:
        holder.cancel()
        await asyncio.gather(holder, return_exceptions=True)
    return out


def _per_key(items: list[Any]) -> dict[Any, list[int]]:
    groups: dict[Any, list[int]] = defaultdict(list)
    for x in items:
        record = x.record if isinstance(x, (FailedRecord, ParkedItem)) else x
        groups[record["k"]].append(record["id"])
    return groups


def _check_prefix_and_rest(records: list[dict], out: list[Any], left: list[ParkedItem]) -> None:
    """Per key: the outputs are a prefix of the key's records in order, the leftover the rest."""
    expected = _per_key(records)
    got, rest = _per_key(out), _per_key(left)
    for key, ids in expected.items():
        assert got.get(key, []) + rest.get(key, []) == ids


@SETTINGS
@given(records=updates(), capacity=st.integers(1, 8), hold_after=st.integers(0, 30))
def test_a_held_run_leaves_a_per_key_suffix_that_a_replay_finishes(
    records: list[dict], capacity: int, hold_after: int
) -> None:
    action = TurnsAction()
    op = KeyedAsyncWaitOperator(action, mode="key_ordered", key="k", capacity=capacity)
    action.operator = op
    out = run(_run(op, records, hold_after))
    left = op.leftover
    _check_prefix_and_rest(records, out, left)
    assert action.max_running_per_key <= 1
    # the next run replays the leftover first: everything finishes, per key in order
    again = KeyedAsyncWaitOperator(action, mode="key_ordered", key="k", capacity=capacity)
    again.replay_parked(left)
    rest = run(_run(again, []))
    assert again.leftover == []
    combined = _per_key(out)
    for key, ids in _per_key(rest).items():
        combined[key] = combined.get(key, []) + ids
    assert combined == _per_key(records)
    assert sum(action.attempts.values()) == len(records)  # nothing ran twice


@SETTINGS
@given(
    records=updates(),
    failing=st.sets(st.integers(0, 49), max_size=8),
    capacity=st.integers(1, 8),
    retries=st.integers(1, 2),
)
def test_deferred_records_park_their_keys_and_finish_in_order_when_due(
    records: list[dict], failing: set[int], capacity: int, retries: int
) -> None:
    clock = Clock()
    # each failing record fails every attempt of the first run
    action = TurnsAction(fail=[(i, a) for i in failing for a in range(1, retries + 1)])
    policy = DeferPolicy(delay=10.0, clock=clock)
    retry = RetryStrategy.fixed_delay(retries, 0.0)

    def operator() -> KeyedAsyncWaitOperator:
        op = KeyedAsyncWaitOperator(
            action,
            mode="key_ordered",
            key="k",
            capacity=capacity,
            retry=retry,
            on_error="defer",
            defer=policy,
        )
        action.operator = op
        return op

    first = operator()
    out = run(_run(first, records))
    left = first.leftover
    _check_prefix_and_rest(records, out, left)
    failed_keys = {r["k"] for r in records if r["id"] in failing}
    assert set(_per_key(left)) == failed_keys  # other keys flowed
    heads = {}
    for item in left:
        heads.setdefault(item.key, item)
    for item in heads.values():  # the first parked record of a key is the one that failed
        assert item.record["id"] in failing
        assert item.info == ParkInfo(retries, 1, clock.now + 10.0, clock.now, item.info.error)
        assert item.info.error is not None and "Flaky" in item.info.error

    # not due yet: a replay runs none of the parked keys and keeps them whole
    second = operator()
    second.replay_parked(left)
    assert run(_run(second, [])) == []
    assert second.leftover == left

    # due, and the service is back: the parked keys finish, in order
    clock.now += 10.0
    action.fail.clear()
    third = operator()
    third.replay_parked(left)
    rest = run(_run(third, []))
    assert third.leftover == []
    combined = _per_key(out)
    for key, ids in _per_key(rest).items():
        combined[key] = combined.get(key, []) + ids
    assert combined == _per_key(records)


def test_new_records_of_a_parked_key_wait_behind_it_and_others_pass() -> None:
    clock = Clock()
    action = TurnsAction(fail=[(0, 1)])
    policy = DeferPolicy(delay=5, clock=clock)
    op = KeyedAsyncWaitOperator(
        action, mode="key_ordered", key="k", capacity=4, on_error="defer", defer=policy
    )
    records = [{"id": 0, "k": "a"}, {"id": 1, "k": "b"}, {"id": 2, "k": "a", "lat": 3}, {"id": 3, "k": "b"}]
    out = run(_run(op, records))
    assert [o["id"] for o in out] == [1, 3]
    assert [(i.record["id"], i.info.deferrals) for i in op.leftover] == [(0, 1), (2, 0)]
    assert op.stats.deferred == 1 and op.stats.parked_keys == 1 and op.stats.parked_records == 2
    assert action.attempts[2] == 0  # never ran behind its parked key


def test_a_record_deferred_past_the_maximum_age_becomes_an_error_row_and_its_key_moves_on() -> None:
    clock = Clock()
    action = TurnsAction(fail=[(0, 1), (0, 2)])
    policy = DeferPolicy(delay=5, max_age=8, clock=clock)
    first = KeyedAsyncWaitOperator(action, mode="key_ordered", key="k", on_error="defer", defer=policy)
    assert run(_run(first, [{"id": 0, "k": "a"}, {"id": 1, "k": "a"}])) == []
    clock.now += 9  # due, and older than the maximum age when it fails again
    second = KeyedAsyncWaitOperator(action, mode="key_ordered", key="k", on_error="defer", defer=policy)
    second.replay_parked(first.leftover)
    out = run(_run(second, []))
    assert isinstance(out[0], FailedRecord) and out[0].record["id"] == 0
    assert out[0].attempts == 2 and "maximum deferral age" in out[0].error_message
    assert out[1] == {"id": 1, "k": "a"}
    assert second.leftover == []


def test_defer_needs_key_order_and_a_policy() -> None:
    with pytest.raises(ConfigError, match="KEY_ORDERED only"):
        KeyedAsyncWaitOperator(TurnsAction(), mode="ordered", on_error="defer")
    with pytest.raises(ConfigError, match="max_defer_age"):
        DeferPolicy(max_age=0)
    with pytest.raises(ConfigError, match="parked records only"):
        KeyedAsyncWaitOperator(TurnsAction(), mode="unordered").replay_parked([ParkedItem({}, 1)])


def test_parked_keys_keep_arrival_order() -> None:
    parked = ParkedKeys()
    assert not parked.take_if_parked("a", 1)
    parked.park([ParkedItem(1, "a"), ParkedItem(2, "b")])
    assert parked.take_if_parked("a", 3)
    assert [(i.key, i.record) for i in parked.items()] == [("a", 1), ("a", 3), ("b", 2)]
    assert len(parked) == 3 and parked.keys == 2 and "a" in parked


# ---------------------------------------------------------------------- parked records streamed out


async def _run_streaming(
    op: KeyedAsyncWaitOperator, chunks: list[list[Any]], hold_after: int | None, peaks: list[int]
) -> tuple[list[Any], list[ParkedItem]]:
    """``process_batches`` with ``emit_parked``: (finished pairs, parked items as they left)."""
    loop = asyncio.get_running_loop()
    holder = None
    if hold_after is not None:

        async def hold_later() -> None:
            for _ in range(hold_after):
                await next_turn()
            op.hold()

        holder = loop.create_task(hold_later())
    done: list[Any] = []
    parked: list[ParkedItem] = []
    async for chunk in op.process_batches(iter(chunks)):
        items = [x for x in chunk if isinstance(x, ParkedItem)]
        peaks.append(len(items))
        parked += items
        done += [x for x in chunk if not isinstance(x, ParkedItem)]
    if holder is not None:
        holder.cancel()
        await asyncio.gather(holder, return_exceptions=True)
    return done, parked


@SETTINGS
@given(
    records=updates(),
    capacity=st.integers(1, 8),
    hold_after=st.one_of(st.none(), st.integers(0, 30)),
    failing=st.sets(st.integers(0, 49), max_size=6),
    chunk=st.integers(1, 7),
)
def test_emitted_parked_records_are_exactly_the_rest_and_replay_in_order(
    records: list[dict], capacity: int, hold_after: int | None, failing: set[int], chunk: int
) -> None:
    """With ``emit_parked`` nothing is kept: finished records and parked ones leave as the run
    goes; per key (ordered by arrival position, which is what a caller writes parked rows
    with) the finished ones are a prefix and the parked ones the rest; and a second run fed
    the parked ones as a ParkedBatch finishes them, in order, running nothing twice."""
    clock = Clock()
    action = TurnsAction(fail=[(i, 1) for i in failing])
    policy = DeferPolicy(delay=10.0, clock=clock)

    def operator() -> KeyedAsyncWaitOperator:
        op = KeyedAsyncWaitOperator(
            action, mode="key_ordered", key="k", capacity=capacity, output="pairs",
            on_error="defer", defer=policy, emit_parked=True,
        )  # fmt: skip
        action.operator = op
        return op

    chunks = [records[i : i + chunk] for i in range(0, len(records), chunk)]
    peaks: list[int] = []
    done, parked = run(_run_streaming(operator(), chunks, hold_after, peaks))
    finished = [record for record, _ in done]
    position = sorted(parked, key=lambda item: item.record["id"])  # a caller's input positions
    _check_prefix_and_rest(records, finished, position)
    assert len(finished) + len(parked) == len(records)
    assert max(peaks, default=0) <= max(1000, capacity + chunk)  # a hold streams the input out
    clock.now += 60.0  # every deferral is due, and the service is healthy again
    action.fail = set()
    again = operator()
    done_again, left_again = run(_run_streaming(again, [ParkedBatch(position)], None, []))
    assert left_again == [] and again.leftover == []
    combined = _per_key(finished)
    for key, ids in _per_key([record for record, _ in done_again]).items():
        combined[key] = combined.get(key, []) + ids
    assert combined == _per_key(records)
    for record in records:  # nothing that finished ran again; a deferred one ran once more
        assert action.attempts[record["id"]] == 1 or (
            record["id"] in failing and action.attempts[record["id"]] == 2
        )

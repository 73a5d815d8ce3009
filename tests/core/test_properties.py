"""Property-based tests of the ordering invariants over random keys, latencies, failures and
watermark positions. Latency is counted in event-loop turns, so every interleaving is
reproducible and no test waits on the clock."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keyed_async_wait import RetryStrategy
from keyed_async_wait.operator import KeyedAsyncWaitOperator, OutputMode, Watermark

from .helpers import TurnsAction, assert_nothing_crosses_watermarks, collect, ids, next_turn, per_key, run

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CHUNK = 7  # records per chunk when the stream is fed to process_batches


@st.composite
def streams(draw: st.DrawFn, max_records: int = 60) -> list[Any]:
    n = draw(st.integers(0, max_records))
    keys = draw(st.lists(st.integers(0, 7), min_size=n, max_size=n))
    lats = draw(st.lists(st.integers(0, 6), min_size=n, max_size=n))
    marks = draw(st.lists(st.integers(0, n), max_size=4))
    out: list[Any] = []
    ts = 0
    for i in range(n):
        while i in marks:
            marks.remove(i)
            ts += 1
            out.append(Watermark(ts))
        out.append({"id": i, "k": keys[i], "lat": lats[i]})
    for _ in marks:
        ts += 1
        out.append(Watermark(ts))
    return out


capacities = st.integers(1, 12)
failures = st.sets(st.tuples(st.integers(0, 59), st.integers(1, 2)), max_size=10)


def _records(stream: list[Any]) -> list[dict]:
    return [x for x in stream if not isinstance(x, Watermark)]


async def consumed(op: KeyedAsyncWaitOperator, stream: list[Any], chunked: bool) -> list[Any]:
    """Every output of ``op`` over ``stream``: through ``process``, or through
    ``process_batches`` in chunks (whose finished records are taken as they finish)."""
    if not chunked:
        return await collect(op, stream)
    chunks = [stream[i : i + CHUNK] for i in range(0, len(stream), CHUNK)]
    return [x async for chunk in op.process_batches(chunks) for x in chunk]


def _operator(action: TurnsAction, mode: OutputMode, capacity: int, **kw: Any) -> KeyedAsyncWaitOperator:
    op = KeyedAsyncWaitOperator(action, mode=mode, key="k", capacity=capacity, **kw)
    action.operator = op
    return op


@SETTINGS
@given(stream=streams(), capacity=capacities, fail=failures, eager=st.booleans(), chunked=st.booleans())
def test_ordered_output_equals_input_order(
    stream: list[Any], capacity: int, fail: set, eager: bool, chunked: bool
) -> None:
    action = TurnsAction(fail=fail, eager=eager)
    op = _operator(action, OutputMode.ORDERED, capacity, retry=RetryStrategy.fixed_delay(3, 0))
    out = run(consumed(op, stream, chunked))
    assert [x if isinstance(x, Watermark) else x["id"] for x in out] == [
        x if isinstance(x, Watermark) else x["id"] for x in stream
    ]
    assert action.max_inside <= capacity
    assert action.max_total_running <= capacity


@SETTINGS
@given(stream=streams(), capacity=capacities, fail=failures, eager=st.booleans(), chunked=st.booleans())
def test_unordered_emits_everything_and_never_crosses_a_watermark(
    stream: list[Any], capacity: int, fail: set, eager: bool, chunked: bool
) -> None:
    action = TurnsAction(fail=fail, eager=eager)
    op = _operator(action, OutputMode.UNORDERED, capacity, retry=RetryStrategy.fixed_delay(3, 0))
    out = run(consumed(op, stream, chunked))
    assert sorted(ids(out)) == [r["id"] for r in _records(stream)]
    assert_nothing_crosses_watermarks(stream, out)
    assert action.max_inside <= capacity
    assert action.max_total_running <= capacity


@SETTINGS
@given(
    stream=streams(),
    capacity=capacities,
    fail=failures,
    eager=st.booleans(),
    blocked=st.sampled_from([0, 3, 40]),
    chunked=st.booleans(),
)
def test_key_ordered_runs_one_record_per_key_in_arrival_order(
    stream: list[Any], capacity: int, fail: set, eager: bool, blocked: int, chunked: bool
) -> None:
    action = TurnsAction(fail=fail, eager=eager)
    op = _operator(
        action,
        OutputMode.KEY_ORDERED,
        capacity,
        retry=RetryStrategy.fixed_delay(3, 0),
        blocked_capacity=blocked,
    )
    out = run(consumed(op, stream, chunked))
    records = _records(stream)
    assert sorted(ids(out)) == [r["id"] for r in records]
    assert action.max_running_per_key <= 1
    expected = per_key(records)
    assert per_key(out) == expected
    # starts per key in arrival order; a retried record starts again before the next of its key
    for key, started in action.starts_per_key.items():
        deduped = [rid for i, rid in enumerate(started) if i == 0 or started[i - 1] != rid]
        assert deduped == expected[key]
    assert_nothing_crosses_watermarks(stream, out)
    # records past BLOCKED never exceed capacity; up to `blocked` more may wait behind their keys
    assert action.max_total_running <= capacity
    assert action.max_inside <= capacity + blocked


@SETTINGS
@given(stream=streams(), capacity=st.integers(2, 12), eager=st.booleans())
def test_key_ordered_runs_different_keys_concurrently(stream: list[Any], capacity: int, eager: bool) -> None:
    # with two keys at least and latency, more than one record is in flight at some point
    slow = [dict(x, lat=3) if not isinstance(x, Watermark) else x for x in stream]
    keys = {x["k"] for x in _records(slow)}
    action = TurnsAction(eager=eager)
    run(collect(_operator(action, OutputMode.KEY_ORDERED, capacity), slow))
    if len(keys) >= 2 and len(_records(slow)) >= 2:
        first_two_keys = [r["k"] for r in _records(slow)[:capacity]]
        if len(set(first_two_keys)) >= 2:
            assert action.max_total_running >= 2


class _BatchTurns:
    """A batching action: each batch takes some loop turns; records may fail one by one."""

    def __init__(self, fail: set, turns: int, eager: bool = False) -> None:
        self.eager_start = eager
        self.fail = set(fail)
        self.turns = turns
        self.attempts: dict[int, int] = {}
        self.running: set[Any] = set()
        self.overlap = False
        self.starts_per_key: dict[Any, list[int]] = {}

    async def invoke(self, record: dict) -> list[dict]:
        raise AssertionError("called through invoke_batch")

    async def invoke_batch(self, records: list[dict]) -> list[Any]:
        keys = [r["k"] for r in records]
        if len(set(keys)) != len(keys) or self.running & set(keys):
            self.overlap = True
        self.running |= set(keys)
        for r in records:
            self.starts_per_key.setdefault(r["k"], []).append(r["id"])
        for _ in range(self.turns):
            await next_turn()
        self.running -= set(keys)
        out: list[Any] = []
        for r in records:
            n = self.attempts[r["id"]] = self.attempts.get(r["id"], 0) + 1
            out.append(ValueError("flaky") if (r["id"], n) in self.fail else [{"id": r["id"], "k": r["k"]}])
        return out


@SETTINGS
@given(
    stream=streams(),
    capacity=st.integers(1, 30),
    batch_size=st.integers(1, 8),
    turns=st.integers(0, 3),
    fail=failures,
    chunked=st.booleans(),
    eager=st.booleans(),
)
def test_key_ordered_batches_keep_key_order(
    stream: list[Any], capacity: int, batch_size: int, turns: int, fail: set, chunked: bool, eager: bool
) -> None:
    action = _BatchTurns(fail, turns, eager)
    op = KeyedAsyncWaitOperator(
        action,
        mode="key_ordered",
        key="k",
        capacity=capacity,
        batch_size=batch_size,
        retry=RetryStrategy.fixed_delay(3, 0),
    )

    out = run(consumed(op, stream, chunked))
    records = _records(stream)
    assert not action.overlap
    assert per_key(out) == per_key(records)
    for key, started in action.starts_per_key.items():
        deduped = [rid for i, rid in enumerate(started) if i == 0 or started[i - 1] != rid]
        assert deduped == per_key(records)[key]
    assert_nothing_crosses_watermarks(stream, out)


@pytest.mark.parametrize(("blocked", "expected_running"), [(0, 2), (30, 4)])
def test_blocked_capacity_lets_other_keys_run_past_a_run_of_one_keys_updates(
    blocked: int, expected_running: int
) -> None:
    # grouped input: 8 updates of key 0, then 8 of key 1, ...: the window fills with one key
    stream = [{"id": i, "k": i // 8, "lat": 2} for i in range(64)]
    action = TurnsAction()
    op = _operator(action, OutputMode.KEY_ORDERED, 4, blocked_capacity=blocked)
    out = run(collect(op, stream))
    assert per_key(out) == per_key(stream)
    assert action.max_total_running == expected_running  # never more than the capacity
    assert action.max_inside <= 4 + blocked

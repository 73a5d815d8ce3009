"""Keyed snapshots: taken at a random point, restored at another parallelism, nothing is lost
or emitted twice and per-key order holds."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import aclosing, suppress
from itertools import islice
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keyed_async_wait import ConfigError, SnapshotError
from keyed_async_wait.core.keys import stable_hash, subtask_for_key_group
from keyed_async_wait.operator import (
    KeyedAsyncWaitOperator,
    OperatorSnapshot,
    OutputMode,
    Watermark,
    key_group_for,
    key_group_range,
    subtask_for_key,
)

from .helpers import TurnsAction, collect, next_turn, run, taken_then_snapshot, until


def _restore_and_finish(
    snap: OperatorSnapshot, rest: list[Any], mode: OutputMode, parallelism: int, capacity: int, result_of: Any
) -> list[list[Any]]:
    """Restore into ``parallelism`` subtasks; each gets its key groups of the rest of the input."""
    outputs = []
    for index in range(parallelism):
        owned = key_group_range(index, parallelism, snap.max_parallelism)
        mine = [r for r in rest if key_group_for(r["k"], snap.max_parallelism) in owned]
        op = KeyedAsyncWaitOperator(TurnsAction(result_of=result_of), mode=mode, key="k", capacity=capacity)
        op.restore(snap, index, parallelism)
        outputs.append(run(collect(op, mine)))
    return outputs


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 50),
    keys=st.integers(1, 9),
    lats=st.lists(st.integers(0, 5), min_size=50, max_size=50),
    cut=st.integers(0, 60),
    capacity=st.integers(1, 10),
    parallelism=st.integers(1, 4),
    mode=st.sampled_from(list(OutputMode)),
    multi=st.booleans(),
)
def test_snapshot_restored_at_another_parallelism_emits_each_record_once(
    n: int,
    keys: int,
    lats: list[int],
    cut: int,
    capacity: int,
    parallelism: int,
    mode: OutputMode,
    multi: bool,
) -> None:
    records = [{"id": i, "k": f"key{i % keys}", "lat": lats[i]} for i in range(n)]
    # with multi, each record yields two results, so a cut can fall between them
    result_of = (lambda r: [{"id": r["id"], "k": r["k"], "part": p} for p in (0, 1)]) if multi else None
    source: Iterator[Any] = iter(records)

    first = KeyedAsyncWaitOperator(TurnsAction(result_of=result_of), mode=mode, key="k", capacity=capacity)
    before, snap = run(taken_then_snapshot(first, source, cut))
    snap = OperatorSnapshot.from_bytes(snap.to_bytes())
    rest = list(source)
    after = _restore_and_finish(snap, rest, mode, parallelism, capacity, result_of)

    def flat(xs: list[Any]) -> list[Any]:
        return [y for x in xs for y in (x if isinstance(x, list) else [x])]

    everything = flat(before) + [x for out in after for x in flat(out)]
    parts = sorted((x["id"], x.get("part", 0)) for x in everything)
    expected = sorted((r["id"], p) for r in records for p in ((0, 1) if multi else (0,)))
    assert parts == expected  # nothing lost, nothing twice
    if mode is OutputMode.KEY_ORDERED or mode is OutputMode.ORDERED:
        for key in {r["k"] for r in records}:
            seen = [x["id"] for x in flat(before) if x["k"] == key]
            for out in after:
                seen += [x["id"] for x in flat(out) if x["k"] == key]
            assert seen == sorted(seen)


def test_snapshot_keeps_pending_watermarks_in_place() -> None:
    async def main() -> OperatorSnapshot:
        op = KeyedAsyncWaitOperator(TurnsAction(), mode="unordered", key="k", capacity=10)
        stream = [{"id": 0, "k": "a", "lat": 50}, Watermark(1), {"id": 1, "k": "b", "lat": 0}]
        async with aclosing(op.process(iter(stream))) as outputs:
            agen = outputs.__aiter__()
            task = asyncio.ensure_future(agen.__anext__())
            await until(lambda: op.stats.inside == 2 and op.stats.finished == 1)
            snap = op.snapshot()
            task.cancel()
            with suppress(asyncio.CancelledError, StopAsyncIteration):
                await task
            return snap

    snap = run(main())
    replay = snap.replay_for(0, 1)
    assert [x.record["id"] if not isinstance(x, Watermark) else x for x in replay] == [0, Watermark(1), 1]
    op = KeyedAsyncWaitOperator(TurnsAction(), mode="unordered", key="k")
    op.restore(snap)
    out = run(collect(op, []))
    assert [x["id"] if isinstance(x, dict) else x for x in out] == [0, Watermark(1), 1]


def test_unpicklable_record_is_named_in_the_error() -> None:
    async def main() -> None:
        op = KeyedAsyncWaitOperator(TurnsAction(), mode="key_ordered", key="k", capacity=5)
        records = [{"id": 0, "k": "lock", "lat": 30, "bad": lambda: 0}]
        async with aclosing(op.process(iter(records))) as outputs:
            task = asyncio.ensure_future(outputs.__anext__())
            await until(lambda: op.stats.in_flight == 1)
            with pytest.raises(
                SnapshotError, match=r"key 'lock' cannot be snapshotted: records .* must be picklable"
            ):
                op.snapshot()
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task

    run(main())


@given(parallelism=st.integers(1, 128), max_parallelism=st.sampled_from([128, 200, 1000]))
def test_key_group_ranges_partition_all_groups(parallelism: int, max_parallelism: int) -> None:
    parallelism = min(parallelism, max_parallelism)
    seen: list[int] = []
    for i in range(parallelism):
        groups = key_group_range(i, parallelism, max_parallelism)
        assert all(subtask_for_key_group(g, parallelism, max_parallelism) == i for g in groups)
        seen.extend(groups)
    assert seen == list(range(max_parallelism))


def test_stable_hash_is_the_same_in_every_process() -> None:
    keys = ["order-1", 42, 4.5, ("a", 1), b"x", None, {"a": [1, 2]}]
    here = [stable_hash(k) for k in keys]
    code = (
        "from keyed_async_wait.core.keys import stable_hash;"
        "print([stable_hash(k) for k in ['order-1', 42, 4.5, ('a', 1), b'x', None, {'a': [1, 2]}]])"
    )
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        assert out.stdout.strip() == str(here)
    assert stable_hash(1) == stable_hash(1.0) == stable_hash(True)
    assert stable_hash("1") != stable_hash(1)


def test_a_finished_record_not_yet_handed_out_is_not_invoked_again_after_a_restore() -> None:
    """Ordered: record 1 finished behind a slow record 0 when the snapshot was taken. The
    restored operator hands out record 1's results without calling the function for it."""
    calls: list[int] = []
    release = asyncio.Event()

    async def fn(record: dict[str, Any]) -> Any:
        calls.append(record["id"])
        if record["id"] == 0 and len(calls) < 3:  # the first run's call of 0 never ends
            await release.wait()
        return {"id": record["id"], "v": record["id"] * 10}

    async def first() -> OperatorSnapshot:
        op = KeyedAsyncWaitOperator(fn, mode=OutputMode.ORDERED, capacity=4)
        async with aclosing(op.process([{"id": 0}, {"id": 1}])) as outputs:
            task = asyncio.ensure_future(outputs.__anext__())
            await until(lambda: calls == [0, 1] and op.stats.inside == 2)
            await asyncio.sleep(0)  # record 1's result is in
            snap = op.snapshot()
            task.cancel()
            with suppress(asyncio.CancelledError, StopAsyncIteration):
                await task
            return snap

    snap = run(first())
    op = KeyedAsyncWaitOperator(fn, mode=OutputMode.ORDERED, capacity=4)
    op.restore(snap)
    out = run(collect(op, []))
    assert out == [{"id": 0, "v": 0}, {"id": 1, "v": 10}]
    assert calls == [0, 1, 0]  # 0 ran again (it had not finished); 1 did not


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 40),
    keys=st.integers(1, 9),
    cut=st.integers(0, 20),
    parallelism=st.integers(1, 5),
    composite=st.booleans(),
)
def test_new_input_routed_with_the_public_routing_meets_its_restored_records(
    n: int, keys: int, cut: int, parallelism: int, composite: bool
) -> None:
    """A user of the core restores a snapshot into ``parallelism`` subtasks and routes the rest
    of the input with :meth:`KeyedAsyncWaitOperator.subtask_for` (or ``subtask_for_key``): every
    key lives in one subtask, per key order holds, nothing is lost or repeated."""
    key: Any = ["k", "j"] if composite else "k"
    records = [{"id": i, "k": f"key{i % keys}", "j": i % 2, "lat": (i * 7) % 4} for i in range(n)]
    source = iter(records)

    first = KeyedAsyncWaitOperator(TurnsAction(), mode="key_ordered", key=key, capacity=3)
    before, snap = run(taken_then_snapshot(first, source, cut))
    rest = list(source)  # what the first run had not read
    ops = [KeyedAsyncWaitOperator(TurnsAction(), mode="key_ordered", key=key) for _ in range(parallelism)]
    routed: list[list[Any]] = [[] for _ in range(parallelism)]
    for record in rest:
        index = ops[0].subtask_for(record, parallelism)
        wanted = (record["k"], record["j"]) if composite else record["k"]
        assert index == subtask_for_key(wanted, parallelism)
        routed[index].append(record)
    after = []
    for index, op in enumerate(ops):
        op.restore(snap, index, parallelism)
        after.append(run(collect(op, routed[index])))
    assert sorted(x["id"] for x in before + [x for out in after for x in out]) == list(range(n))

    def key_of(x: dict[str, Any]) -> Any:
        return (x["k"], x["id"] % 2) if composite else x["k"]

    owner: dict[Any, int] = {}
    for index, out in enumerate(after):
        for x in out:
            assert owner.setdefault(key_of(x), index) == index  # a key lives in one subtask
    for k in {key_of(r) for r in records}:  # per key, arrival order
        ids = [x["id"] for x in before if key_of(x) == k]
        ids += [x["id"] for out in after for x in out if key_of(x) == k]
        assert ids == sorted(ids)


def test_the_public_routing_checks_its_parallelism() -> None:
    with pytest.raises(ConfigError, match="parallelism"):
        subtask_for_key("a", 0)
    with pytest.raises(ConfigError, match="parallelism"):
        subtask_for_key("a", 129)
    assert key_group_for("a") in key_group_range(subtask_for_key("a", 3), 3)


async def _chunks_then_snapshot(
    op: KeyedAsyncWaitOperator, records: Iterator[Any], chunk: int, cut: int, turns: int
) -> tuple[list[Any], OperatorSnapshot]:
    """The first ``cut`` chunks of ``op.process_batches`` over ``records`` (read lazily, in
    chunks of ``chunk``), then ``turns`` loop turns while the consumer holds the last (as a
    consumer writing it somewhere would: records finish meanwhile, and are taken for the next
    chunk), then the snapshot."""
    chunks = (islice(records, chunk) for _ in range(10_000))
    out: list[Any] = []
    async with aclosing(op.process_batches(chunks)) as outputs:
        if cut:
            got = 0
            async for part in outputs:
                out += part
                got += 1
                if got >= cut:
                    break
        for _ in range(turns):
            await next_turn()
        return out, op.snapshot()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 50),
    keys=st.integers(1, 9),
    lats=st.lists(st.integers(0, 5), min_size=50, max_size=50),
    cut=st.integers(0, 12),
    turns=st.integers(0, 8),
    capacity=st.integers(1, 10),
    chunk=st.integers(1, 12),
    mode=st.sampled_from(list(OutputMode)),
)
def test_a_snapshot_between_chunks_holds_the_records_taken_for_the_next_chunk(
    n: int, keys: int, lats: list[int], cut: int, turns: int, capacity: int, chunk: int, mode: OutputMode
) -> None:
    """``process_batches`` takes finished records for the consumer's next chunk as they finish.
    A snapshot taken while the consumer holds a chunk (the loop running meanwhile) holds them
    with their results: restored, with the source read on from where it was, every record
    comes out once, each key's in order (KEY_ORDERED; all in order when ORDERED), and none
    that had finished is invoked again."""
    rows = [{"id": i, "k": i % keys, "lat": lats[i]} for i in range(n)]
    options: dict[str, Any] = {"mode": mode, "key": "k", "capacity": capacity}
    first = TurnsAction()
    records = iter(rows)
    op = KeyedAsyncWaitOperator(first, **options)
    before, snap = run(_chunks_then_snapshot(op, records, chunk, cut, turns))
    again = TurnsAction()
    fresh = KeyedAsyncWaitOperator(again, **options)
    fresh.restore(snap)
    after = run(collect(fresh, list(records)))
    out = before + after
    assert sorted(r["id"] for r in out) == list(range(n))
    by_key: dict[Any, list[int]] = {}
    for r in out:
        by_key.setdefault(r["k"], []).append(r["id"])
    if mode is not OutputMode.UNORDERED:
        assert all(ids == sorted(ids) for ids in by_key.values())
    if mode is OutputMode.ORDERED:
        assert [r["id"] for r in out] == list(range(n))
    finished_before = {rid for rid in first.attempts if rid not in again.attempts}
    shown = {r["id"] for r in after}
    # a record finished in the first run and restored with its results is not called again
    assert not (finished_before & set(again.attempts))
    assert set(again.attempts) <= shown

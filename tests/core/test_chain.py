"""Chains of named steps: per-key order over the whole chain, completed steps never run again
(retries, deferrals, snapshots restored at another parallelism), batching per step."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keyed_async_wait import Chain, ConfigError, DeferPolicy, RetryStrategy, Step, StepError
from keyed_async_wait.core.chain import PROGRESS_FIELD, ChainProgress, ddl_names
from keyed_async_wait.core.keys import key_group_for, key_group_range
from keyed_async_wait.operator import KeyedAsyncWaitOperator, OperatorSnapshot

from .helpers import Flaky, next_turn, run, taken_then_snapshot

STEPS = ("first", "second", "third")


class Log:
    """What the steps did: per (record, step) calls started and finished, and per key which
    records were inside the chain at once."""

    def __init__(self) -> None:
        self.started: Counter[tuple[int, str]] = Counter()
        self.finished: Counter[tuple[int, str]] = Counter()
        self.inside: Counter[Any] = Counter()
        self.max_inside = 0
        self.key_order: dict[Any, list[int]] = defaultdict(list)


def make_step(log: Log, name: str, index: int, last: bool, fails: dict[tuple[int, str], int]) -> Step:
    async def step(view: dict[str, Any]) -> Any:
        rid, key = view["id"], view["k"]
        if index == 0 and not log.started[(rid, name)]:  # the record enters the chain
            log.inside[key] += 1
            log.max_inside = max(log.max_inside, log.inside[key])
            log.key_order[key].append(rid)
        if index > 0:  # an earlier step's field reached this one
            assert view[f"{STEPS[index - 1]}_of"] == rid
        log.started[(rid, name)] += 1
        for _ in range(view["lat"] + index):
            await next_turn()
        if fails.get((rid, name), 0) >= log.started[(rid, name)]:
            raise Flaky(f"{name} of {rid}")
        log.finished[(rid, name)] += 1
        if last:
            log.inside[key] -= 1
        return {f"{name}_of": rid}

    return Step(name, step, fields=(f"{name}_of",))


def make_chain(log: Log, steps: int, fails: dict[tuple[int, str], int]) -> Chain:
    return Chain(*[make_step(log, STEPS[i], i, i == steps - 1, fails) for i in range(steps)])


def records_of(n: int, keys: int, lats: list[int]) -> list[dict[str, Any]]:
    return [{"id": i, "k": f"key{i % keys}", "lat": lats[i % len(lats)]} for i in range(n)]


async def collect(op: KeyedAsyncWaitOperator, rows: list[dict[str, Any]]) -> list[Any]:
    return [x async for x in op.process(rows)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 40),
    keys=st.integers(1, 6),
    steps=st.integers(1, 3),
    lats=st.lists(st.integers(0, 4), min_size=1, max_size=40),
    fails=st.dictionaries(
        st.tuples(st.integers(0, 39), st.sampled_from(STEPS)), st.integers(1, 2), max_size=15
    ),
    capacity=st.integers(1, 8),
)
def test_key_order_spans_the_chain_and_no_finished_step_runs_again(
    n: int, keys: int, steps: int, lats: list[int], fails: dict[tuple[int, str], int], capacity: int
) -> None:
    log = Log()
    op = KeyedAsyncWaitOperator(
        make_chain(log, steps, fails),
        mode="key_ordered",
        key="k",
        capacity=capacity,
        retry=RetryStrategy.fixed_delay(7, 0),  # attempts per record: up to 2 failures per step
    )
    rows = records_of(n, keys, lats)
    out = run(collect(op, rows))
    assert sorted(r[f"{STEPS[0]}_of"] for r in out) == list(range(n))
    for r in out:  # every step's field, of this record
        assert all(r[f"{STEPS[i]}_of"] == r["first_of"] for i in range(steps))
    assert log.max_inside == 1  # one record of a key inside the chain at a time
    for key, order in log.key_order.items():
        assert order == sorted(order), key  # ... and in arrival order
    for rid in range(n):
        for name in STEPS[:steps]:
            assert log.finished[(rid, name)] == 1  # a finished step never ran again
            assert log.started[(rid, name)] == 1 + fails.get((rid, name), 0)
    assert all(PROGRESS_FIELD not in r for r in rows)  # finished records carry no progress


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 30),
    keys=st.integers(1, 6),
    lats=st.lists(st.integers(0, 5), min_size=1, max_size=30),
    cut=st.integers(0, 30),
    capacity=st.integers(1, 8),
    parallelism=st.integers(1, 3),
)
def test_a_snapshot_resumes_each_record_at_the_step_it_reached(
    n: int, keys: int, lats: list[int], cut: int, capacity: int, parallelism: int
) -> None:
    log = Log()
    rows = records_of(n, keys, lats)
    source = iter(rows)

    first = KeyedAsyncWaitOperator(make_chain(log, 3, {}), mode="key_ordered", key="k", capacity=capacity)
    before, taken = run(taken_then_snapshot(first, source, cut))
    snap = OperatorSnapshot.from_bytes(taken.to_bytes())  # the checkpoint: bytes
    reached = {
        rec.record["id"]: list(ChainProgress.of(rec.record).done)
        for group in snap.key_groups.values()
        for rec in group
    }
    calls_before = Counter(log.started)
    rest = list(source)
    after: list[Any] = []
    for index in range(parallelism):
        owned = key_group_range(index, parallelism, snap.max_parallelism)
        mine = [r for r in rest if key_group_for(r["k"], snap.max_parallelism) in owned]
        op = KeyedAsyncWaitOperator(make_chain(log, 3, {}), mode="key_ordered", key="k", capacity=capacity)
        op.restore(snap, index, parallelism)
        after += run(collect(op, mine))
    assert sorted(r["first_of"] for r in before + after) == list(range(n))  # nothing lost or twice
    assert all(r["third_of"] == r["first_of"] for r in before + after)
    for rid, done in reached.items():  # completed at the snapshot: not called after the restore
        for name in done:
            assert log.started[(rid, name)] == calls_before[(rid, name)], (rid, name)


def test_a_deferred_record_resumes_at_the_step_that_failed() -> None:
    """The second step's service is down: the record is parked after the first step; replayed,
    it calls only the second step."""
    log = Log()
    rows = records_of(6, 2, [0])
    fails = {(i, "second"): 1 for i in range(6)}
    now = [1000.0]
    policy = DeferPolicy(delay=5.0, clock=lambda: now[0])
    common: dict[str, Any] = {"mode": "key_ordered", "key": "k", "output": "pairs", "on_error": "defer"}
    op = KeyedAsyncWaitOperator(make_chain(log, 2, fails), defer=policy, **common)
    assert run(collect(op, rows)) == []  # every key parked behind its first record
    parked = op.leftover
    assert len(parked) == 6 and ChainProgress.of(parked[0].record).done == ["first"]
    assert sum(log.started[(i, "first")] for i in range(6)) == 2  # only each key's first record ran
    now[0] += 10.0  # due
    replay = KeyedAsyncWaitOperator(make_chain(log, 2, {}), defer=policy, **common)
    replay.replay_parked(parked)
    out = run(collect(replay, []))
    assert sorted(r["id"] for r, _ in out) == list(range(6))
    assert all(log.finished[(i, "first")] == 1 for i in range(6))  # the first step never again


def test_a_miss_ends_the_chain_and_later_fields_are_null() -> None:
    calls: list[str] = []

    async def customer(view: dict[str, Any]) -> Any:
        calls.append("customer")
        return None if view["id"] == 0 else {"zip": f"z{view['id']}"}

    async def region(view: dict[str, Any]) -> Any:
        calls.append("region")
        return None if view["zip"] == "z1" else {"region": view["zip"].upper()}

    chain = Chain(Step("customer", customer, fields=("zip",)), Step("region", region, fields=("region",)))
    op = KeyedAsyncWaitOperator(chain, mode="ordered", output="pairs")
    out = run(collect(op, [{"id": 0}, {"id": 1}, {"id": 2}]))
    assert [res for _, res in out] == [[], [{"zip": "z1", "region": None}], [{"zip": "z2", "region": "Z2"}]]
    assert calls.count("region") == 2
    assert chain.stats["customer"].misses == 1 and chain.stats["region"].misses == 1


class Batching:
    """A step with invoke_batch: records that reach it together are one call."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    async def invoke(self, record: dict[str, Any]) -> list[dict[str, Any]]:
        raise AssertionError("a batching step is called in batches")

    async def invoke_batch(self, records: list[dict[str, Any]]) -> list[Any]:
        self.batches.append(len(records))
        await asyncio.sleep(0)
        return [[{"b": r["id"] * 2}] if r["id"] != 3 else Flaky("three") for r in records]


def test_a_batching_step_gets_the_records_that_reach_it_together() -> None:
    batching = Batching()

    async def first(view: dict[str, Any]) -> Any:
        await asyncio.sleep(0)
        return {"a": view["id"]}

    chain = Chain(Step("a", first, fields=("a",)), Step("b", batching, fields=("b",)), batch_size=8)
    op = KeyedAsyncWaitOperator(chain, mode="unordered", output="pairs", on_error="emit", capacity=20)
    out = run(collect(op, [{"id": i} for i in range(20)]))
    ok = {r["id"]: res for r, res in (x for x in out if isinstance(x, tuple))}
    assert ok[5] == [{"a": 5, "b": 10}] and 3 not in ok
    failed = [x for x in out if not isinstance(x, tuple)]
    assert len(failed) == 1 and "step 'b'" in failed[0].error_message
    assert sum(batching.batches) == 20 and max(batching.batches) == 8 and len(batching.batches) <= 4
    assert chain.stats["b"].failures == 1 and chain.stats["b"].calls == 20
    assert chain.stats["b"].batches == len(batching.batches) and chain.stats["a"].batches == 0


def test_step_errors_name_the_step_and_keep_retryable() -> None:
    class Permanent(Exception):
        retryable = False

    async def bad(view: dict[str, Any]) -> Any:
        raise Permanent("no")

    chain = Chain(Step("only", bad))
    op = KeyedAsyncWaitOperator(chain, mode="ordered", retry=RetryStrategy.fixed_delay(5, 0))
    with pytest.raises(Exception) as failed:
        run(collect(op, [{"id": 1}]))
    cause = failed.value.__cause__
    assert isinstance(cause, StepError) and cause.step == "only" and cause.retryable is False
    assert chain.stats["only"].calls == 1  # not retried


def test_chains_are_checked_when_made() -> None:
    async def f(view: Any) -> Any:
        return None

    with pytest.raises(ConfigError, match="at least one Step"):
        Chain()
    with pytest.raises(ConfigError, match="each step named once"):
        Chain(Step("a", f), Step("a", f))
    with pytest.raises(ConfigError, match="identifier"):
        Chain(Step("a b", f))
    with pytest.raises(ConfigError, match="batch_size"):
        Chain(Step("a", f), batch_size=0)


def test_progress_round_trips_and_ddl_names() -> None:
    p = ChainProgress()
    p.started("a")
    p.finish("a", {"x": 1.5, "when": None})
    assert ChainProgress.decode(p.encode()) == p
    odd = ChainProgress()
    odd.finish("a", {"x": {1, 2}})  # not JSON: kept exactly all the same
    assert ChainProgress.decode(odd.encode()).results == {"a": {"x": {1, 2}}}
    assert ddl_names("a int, b struct<x:int,y:int>, `c` map<string,int>") == ["a", "b", "c"]
    with pytest.raises(ConfigError, match="steps this record's progress"):
        p.next_step(["b", "a"])


class Spans:
    """Per key: which records are inside the first step, and the order they entered it."""

    def __init__(self) -> None:
        self.first_inside: Counter[Any] = Counter()
        self.max_first_inside = 0
        self.first_order: dict[Any, list[int]] = defaultdict(list)
        self.overlaps = 0  # a record's first step ran while an earlier record of its key was in its second
        self.in_second: Counter[Any] = Counter()


def released_chain(spans: Spans, lats: list[int]) -> Chain:
    async def first(view: dict[str, Any]) -> Any:
        key = view["k"]
        spans.first_inside[key] += 1
        spans.max_first_inside = max(spans.max_first_inside, spans.first_inside[key])
        spans.first_order[key].append(view["id"])
        spans.overlaps += spans.in_second[key] > 0
        for _ in range(lats[view["id"] % len(lats)]):
            await next_turn()
        spans.first_inside[key] -= 1
        return {"a": view["id"]}

    async def second(view: dict[str, Any]) -> Any:
        spans.in_second[view["k"]] += 1
        for _ in range(1 + lats[(view["id"] + 1) % len(lats)]):
            await next_turn()
        spans.in_second[view["k"]] -= 1
        return {"b": view["a"]}

    return Chain(
        Step("first", first, fields=("a",)), Step("second", second, fields=("b",)), release_after="first"
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 40),
    keys=st.integers(1, 5),
    lats=st.lists(st.integers(0, 4), min_size=1, max_size=40),
    capacity=st.integers(1, 8),
)
def test_release_after_keeps_key_order_up_to_that_step_only(
    n: int, keys: int, lats: list[int], capacity: int
) -> None:
    spans = Spans()
    op = KeyedAsyncWaitOperator(released_chain(spans, lats), mode="key_ordered", key="k", capacity=capacity)
    out = run(collect(op, records_of(n, keys, lats)))
    assert sorted(r["b"] for r in out) == list(range(n))  # each once, whole
    assert spans.max_first_inside == 1  # the first step: one record of a key at a time...
    for key, order in spans.first_order.items():
        assert order == sorted(order), key  # ... in arrival order
    assert op.stats.in_flight == 0


def test_release_after_lets_the_next_record_start_during_the_rest() -> None:
    spans = Spans()
    op = KeyedAsyncWaitOperator(released_chain(spans, [0, 5]), mode="key_ordered", key="k", capacity=4)
    out = run(collect(op, records_of(4, 1, [0, 5])))
    assert len(out) == 4 and spans.overlaps > 0  # a second step overlapped the next first step
    with pytest.raises(ConfigError, match="release_after"):
        Chain(Step("a", released_chain(spans, [0]).steps[0].function), release_after="b")
    with pytest.raises(ConfigError, match="releases its key early"):
        KeyedAsyncWaitOperator(released_chain(spans, [0]), mode="key_ordered", key="k", on_error="defer")

"""``process_batches``: finished records are taken for the consumer's next chunk as they finish,
and their places refilled in the same step, within stated bounds."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keyed_async_wait.operator import KeyedAsyncWaitOperator, OutputMode

from .helpers import TurnsAction, next_turn, run, until


class Gated:
    """Each record's call waits until the test opens its gate; the calls started, in order."""

    def __init__(self) -> None:
        self.started: list[int] = []
        self.gates: dict[int, asyncio.Future[None]] = {}

    async def __call__(self, record: dict[str, Any]) -> dict[str, Any]:
        rid = record["id"]
        self.started.append(rid)
        gate = self.gates[rid] = asyncio.get_running_loop().create_future()
        await gate
        return {"id": rid}


def test_a_place_freed_by_a_finished_record_is_refilled_in_the_same_step() -> None:
    """Capacity 4: when record 0's call ends, record 4 starts in the very step that settles it,
    before the consumer or the intake has had a turn (they would take two more). Every other
    place stays busy meanwhile, and everything comes out once."""
    calls = Gated()
    op = KeyedAsyncWaitOperator(calls, mode="unordered", capacity=4)
    rows = [{"id": i} for i in range(12)]

    async def go() -> list[Any]:
        out: list[Any] = []

        async def consume() -> None:
            async for chunk in op.process_batches([rows]):
                out.extend(chunk)

        consumer = asyncio.ensure_future(consume())
        await until(lambda: calls.started == [0, 1, 2, 3])
        calls.gates[0].set_result(None)
        await next_turn()  # the call's task resumes first, then this one
        assert calls.started == [0, 1, 2, 3, 4]
        assert op.stats.in_flight == 4
        for rid in range(1, 12):
            await until(lambda rid=rid: rid in calls.gates)
            calls.gates[rid].set_result(None)
        await consumer
        return out

    out = run(go())
    assert sorted(r["id"] for r in out) == list(range(12))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(0, 80),
    keys=st.integers(1, 9),
    capacity=st.integers(1, 60),
    lats=st.lists(st.integers(0, 4), min_size=80, max_size=80),
    mode=st.sampled_from(list(OutputMode)),
)
def test_records_taken_for_the_next_chunk_never_hold_more_than_a_capacity(
    n: int, keys: int, capacity: int, lats: list[int], mode: OutputMode
) -> None:
    """A consumer that takes a chunk only every few turns: finished records wait for it, at
    most ``capacity`` taken for its next chunk besides those inside, and calls in flight never
    exceed the capacity."""
    action = TurnsAction()
    blocked = {"blocked_capacity": 0} if mode is OutputMode.KEY_ORDERED else {}  # all count
    op = KeyedAsyncWaitOperator(action, mode=mode, key="k", capacity=capacity, **blocked)
    action.operator = op
    rows = [{"id": i, "k": i % keys, "lat": lats[i]} for i in range(n)]
    most = 0

    async def go() -> list[Any]:
        nonlocal most
        out: list[Any] = []
        async for part in op.process_batches([rows[i : i + 5] for i in range(0, n, 5)]):
            out += part
            for _ in range(3):  # a slow consumer: the loop runs on meanwhile
                runtime = op._runtime  # what waits for the next chunk is not in the stats
                most = max(most, len(runtime.run.taken) if runtime is not None else 0)
                await next_turn()
        return out

    out = run(go())
    assert sorted(r["id"] for r in out) == list(range(n))
    assert most <= capacity
    assert action.max_total_running <= capacity
    assert action.max_inside <= capacity

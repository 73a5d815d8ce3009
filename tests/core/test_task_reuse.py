"""Parked tasks: an attempt that needs a task takes one whose attempt ended, not a new one.

The invariants (``keyed_async_wait/runtime/dispatch.py``): the operator's tasks never outnumber
its capacity; a record runs in one task at a time; closing leaves no task behind; and every
record's outcome is what it would be in a task of its own: its value, its failure after the
retries, or its timeout, over random keys, latencies (in loop turns), failures, hanging records
cut by their timeout, eager and plain actions, and both ways of feeding the operator.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keyed_async_wait import RetryStrategy
from keyed_async_wait.operator import KeyedAsyncWaitOperator

from .helpers import Flaky, next_turn, run

HANG = -1  # a record's latency that never ends: only its timeout stops it
ATTEMPTS = 3
TIMEOUT = 0.05  # seconds: the only clock in these tests, for the hanging records


class Recorder:
    """Takes ``record['lat']`` loop turns (``HANG``: never finishes); fails on the attempts in
    ``fail``. At every start (but an eager one) and resumption it notes the operator's task it
    runs in."""

    def __init__(self, fail: set[tuple[int, int]], eager: bool) -> None:
        self.eager_start = eager
        self.fail = fail
        self.attempts: Counter[int] = Counter()
        self.made: list[asyncio.Task[Any]] = []  # every task the operator made, kept alive here
        self.where: dict[int, asyncio.Task[Any]] = {}  # record id -> the task it runs in now
        self.shared = False  # two records ran in one task at once
        self.most_alive = 0  # the most of the operator's tasks alive (not ending) at once

    def _here(self, rid: int) -> None:
        task = asyncio.current_task()
        if task is None or type(task.get_coro()).__name__ != "Settling":
            return  # started eagerly, in the task that fed the operator
        if all(t is not task for t in self.made):
            self.made.append(task)
        self.shared |= any(t is task for r, t in self.where.items() if r != rid)
        self.where[rid] = task
        alive = [t for t in self.made if not t.done() and not t.cancelling()]
        self.most_alive = max(self.most_alive, len(alive))

    async def __call__(self, record: dict) -> Any:
        rid = record["id"]
        self.attempts[rid] += 1
        attempt = self.attempts[rid]
        if not self.eager_start:  # an eager start runs in whichever task starts it, by design
            self._here(rid)
        try:
            if record["lat"] == HANG:
                await next_turn()  # suspended first, so an eager start hands it to a task
                self._here(rid)
                await asyncio.Event().wait()
            for _ in range(record["lat"]):
                await next_turn()
                self._here(rid)
            if (rid, attempt) in self.fail:
                raise Flaky(f"record {rid} attempt {attempt}")
            return {"id": rid, "k": record["k"]}
        finally:
            self.where.pop(rid, None)


@st.composite
def records(draw: st.DrawFn) -> list[dict]:
    n = draw(st.integers(0, 50))
    keys = draw(st.lists(st.integers(0, 9), min_size=n, max_size=n))
    lats = draw(st.lists(st.integers(HANG, 5), min_size=n, max_size=n))  # one in seven hangs
    return [{"id": i, "k": k, "lat": lat} for i, (k, lat) in enumerate(zip(keys, lats, strict=True))]


async def _outputs(
    op: KeyedAsyncWaitOperator, rows: list[dict], chunk: int
) -> tuple[list[Any], dict[int, float], float]:
    """Every output, fed through ``process`` (``chunk`` 0) or ``process_batches`` in chunks;
    when each record's came out, and when the run started (loop time)."""
    loop, before = asyncio.get_running_loop(), asyncio.all_tasks()
    start = loop.time()
    out: list[Any] = []
    seen: dict[int, float] = {}

    def note(x: Any) -> None:
        out.append(x)
        seen[x["id"] if isinstance(x, dict) else x.record["id"]] = loop.time()

    if chunk == 0:
        async for x in op.process(rows):
            note(x)
    else:
        chunks = [rows[i : i + chunk] for i in range(0, len(rows), chunk)]
        async for batch in op.process_batches(chunks):
            for x in batch:
                note(x)
    left = asyncio.all_tasks() - before
    assert not left, f"tasks left after the operator closed: {left}"
    return out, seen, start


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=records(),
    mode=st.sampled_from(["ordered", "unordered", "key_ordered"]),
    capacity=st.integers(1, 8),
    fail=st.sets(st.tuples(st.integers(0, 49), st.integers(1, 3)), max_size=12),
    eager=st.booleans(),
    chunk=st.integers(0, 9),
)
def test_reused_tasks_keep_every_outcome_and_leave_nothing_behind(
    rows: list[dict], mode: str, capacity: int, fail: set, eager: bool, chunk: int
) -> None:
    action = Recorder(fail=fail, eager=eager)
    op = KeyedAsyncWaitOperator(
        action,
        mode=mode,
        key="k" if mode == "key_ordered" else None,
        capacity=capacity,
        timeout=TIMEOUT,
        retry=RetryStrategy.fixed_delay(ATTEMPTS, 0),
        on_error="emit",
    )
    out, seen, start = run(_outputs(op, rows, chunk))

    got = {x["id"]: x for x in out if isinstance(x, dict)}
    failed = {x.record["id"]: x for x in out if not isinstance(x, dict)}
    assert len(got) + len(failed) == len(out) == len(rows)  # every record once
    for row in rows:
        rid = row["id"]
        if row["lat"] == HANG or (rid in failed and "Timeout" in failed[rid].error_type):
            # a hanging record times out; another may only when a loaded machine stalled it
            # past its time (it started after the run did, so it came out no sooner than that)
            assert rid in failed and "Timeout" in failed[rid].error_type
            assert row["lat"] == HANG or seen[rid] - start >= TIMEOUT
        elif all((rid, attempt) in fail for attempt in range(1, ATTEMPTS + 1)):
            assert rid in failed and failed[rid].error_type == "Flaky"
            assert failed[rid].attempts == ATTEMPTS
        else:
            assert rid in got, failed[rid]
            assert got[rid] == {"id": rid, "k": row["k"]}
    assert action.most_alive <= capacity
    assert not action.shared


def test_a_task_runs_attempt_after_attempt_of_different_keys() -> None:
    # distinct keys, fed in chunks: records start when results are handed out, not while one
    # settles, so without reuse every record would get a task of its own
    action = Recorder(fail=set(), eager=False)
    op = KeyedAsyncWaitOperator(action, mode="key_ordered", key="k", capacity=4)
    rows = [{"id": i, "k": i, "lat": 1} for i in range(60)]
    out, _, _ = run(_outputs(op, rows, 5))
    assert sorted(x["id"] for x in out) == list(range(60))
    assert 1 <= len(action.made) <= 4

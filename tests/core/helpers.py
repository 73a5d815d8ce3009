"""Fake actions for the ordering core: latency in event-loop turns, failures on demand."""

from __future__ import annotations

import asyncio
import types
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterable
from contextlib import aclosing
from typing import Any, TypeVar

from keyed_async_wait.operator import KeyedAsyncWaitOperator, OperatorSnapshot, Watermark

T = TypeVar("T")


@types.coroutine
def next_turn() -> Any:
    """Give the event loop one turn (a bare yield, as asyncio.sleep(0) does)."""
    yield


class Flaky(Exception):
    """A retryable failure of the fake action."""


class TurnsAction:
    """Each record takes ``record['lat']`` loop turns; fails on the attempts listed in ``fail``.

    It records what the invariants need: starts in order, concurrency per key and in all, and
    the operator's own count of records inside (checked against its capacity at every start).
    """

    def __init__(
        self,
        fail: Iterable[tuple[int, int]] = (),
        result_of: Callable[[dict], Any] | None = None,
        eager: bool = False,
    ):
        self.eager_start = eager  # run up to its first suspension without a task (0 turns: no task)
        self.fail = set(fail)
        self.result_of = result_of or (lambda r: {"id": r["id"], "k": r["k"]})
        self.attempts: Counter[int] = Counter()
        self.running: Counter[Any] = Counter()
        self.max_running_per_key = 0
        self.total_running = 0
        self.max_total_running = 0
        self.starts: list[int] = []
        self.starts_per_key: dict[Any, list[int]] = defaultdict(list)
        self.operator: KeyedAsyncWaitOperator | None = None
        self.max_inside = 0

    async def __call__(self, record: dict) -> Any:
        rid, key = record["id"], record["k"]
        self.attempts[rid] += 1
        attempt = self.attempts[rid]
        self.running[key] += 1
        self.total_running += 1
        self.max_running_per_key = max(self.max_running_per_key, self.running[key])
        self.max_total_running = max(self.max_total_running, self.total_running)
        self.starts.append(rid)
        self.starts_per_key[key].append(rid)
        if self.operator is not None:
            self.max_inside = max(self.max_inside, self.operator.stats.inside)
        try:
            for _ in range(record.get("lat", 0)):
                await next_turn()
            if (rid, attempt) in self.fail:
                raise Flaky(f"record {rid} attempt {attempt}")
            return self.result_of(record)
        finally:
            self.running[key] -= 1
            self.total_running -= 1


def run(coro: Awaitable[T], bound: float = 20.0) -> T:
    """Run a test coroutine with a bound on its time."""

    async def bounded() -> T:
        return await asyncio.wait_for(coro, bound)

    return asyncio.run(bounded())


async def collect(op: KeyedAsyncWaitOperator, source: Any) -> list[Any]:
    return [x async for x in op.process(source)]


async def taken_then_snapshot(
    op: KeyedAsyncWaitOperator, source: Any, cut: int
) -> tuple[list[Any], OperatorSnapshot]:
    """The first ``cut`` outputs of ``op`` over ``source``, then its snapshot, taken while the
    consumer holds the last of them (``cut`` 0: before any output)."""
    taken: list[Any] = []
    async with aclosing(op.process(source)) as outputs:
        if cut:
            async for x in outputs:
                taken.append(x)
                if len(taken) >= cut:
                    break
        return taken, op.snapshot()


def epochs_of(inputs: list[Any]) -> dict[int, int]:
    """Record id -> number of watermarks before it in the input."""
    epoch, out = 0, {}
    for x in inputs:
        if isinstance(x, Watermark):
            epoch += 1
        else:
            out[x["id"]] = epoch
    return out


def assert_nothing_crosses_watermarks(inputs: list[Any], outputs: list[Any]) -> None:
    """Each record leaves after exactly the watermarks that arrived before it."""
    epoch_of = epochs_of(inputs)
    seen = 0
    for x in outputs:
        if isinstance(x, Watermark):
            seen += 1
        else:
            assert epoch_of[x["id"]] == seen, f"record {x['id']} crossed a watermark"
    assert [w for w in outputs if isinstance(w, Watermark)] == [w for w in inputs if isinstance(w, Watermark)]


def ids(outputs: list[Any]) -> list[int]:
    return [x["id"] for x in outputs if not isinstance(x, Watermark)]


def per_key(outputs: list[Any]) -> dict[Any, list[int]]:
    groups: dict[Any, list[int]] = defaultdict(list)
    for x in outputs:
        if not isinstance(x, Watermark):
            groups[x["k"]].append(x["id"])
    return dict(groups)


async def until(condition: Callable[[], bool], turns: int = 10_000) -> None:
    """Wait, by event-loop turns and with a bound, until ``condition()`` holds."""
    for _ in range(turns):
        if condition():
            return
        await next_turn()
    raise AssertionError(f"condition not reached within {turns} loop turns")


class FakeLoop:
    """Timers by hand: ``call_at`` records them, :meth:`run_until` fires those due."""

    def __init__(self) -> None:
        self.timers: dict[int, tuple[float, Any, int]] = {}
        self.next_id = 0

    def call_at(self, when: float, callback: Any, bucket: int) -> Any:
        timer_id = self.next_id
        self.next_id += 1
        self.timers[timer_id] = (when, callback, bucket)
        loop = self

        class Handle:
            def cancel(self) -> None:
                loop.timers.pop(timer_id, None)

        return Handle()

    def run_until(self, now: float) -> None:
        while True:
            due = [(when, tid) for tid, (when, _, _) in self.timers.items() if when <= now]
            if not due:
                return
            _, tid = min(due)
            _, callback, bucket = self.timers.pop(tid)
            callback(bucket)

"""Eager start: an action runs up to its first suspension without a task of its own."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from keyed_async_wait import RetryStrategy
from keyed_async_wait.operator import KeyedAsyncWaitOperator
from keyed_async_wait.runtime.eager import NOT_YET, prepare

from .helpers import collect, next_turn, run


class Probe:
    """Records which task each part of an action ran in; ``turns`` suspensions per record."""

    def __init__(self, eager: bool, turns: int, fail_first: bool = False) -> None:
        self.eager_start = eager
        self.turns = turns
        self.fail_first = fail_first
        self.before: list[asyncio.Task[Any] | None] = []
        self.after: list[asyncio.Task[Any] | None] = []
        self.attempts: dict[int, int] = {}
        self.cleaned = 0
        self.running: dict[Any, int] = {}
        self.overlap = False

    async def invoke(self, record: dict) -> list[Any]:
        rid = record["id"]
        self.attempts[rid] = self.attempts.get(rid, 0) + 1
        self.before.append(asyncio.current_task())
        if self.running.get(record["k"]):
            self.overlap = True
        self.running[record["k"]] = 1
        try:
            if self.fail_first and self.attempts[rid] == 1:
                raise ValueError(f"first attempt of {rid}")  # before any suspension
            for _ in range(self.turns):
                await next_turn()
            self.after.append(asyncio.current_task())
            return [rid]
        finally:
            self.running[record["k"]] = 0
            self.cleaned += 1


def _records(n: int, keys: int = 3) -> list[dict]:
    return [{"id": i, "k": i % keys} for i in range(n)]


def _go(probe: Probe, records: list[dict], **kw: Any) -> list[Any]:
    op = KeyedAsyncWaitOperator(probe, mode="key_ordered", key="k", capacity=4, **kw)
    return run(collect(op, records))


def _runner(task: asyncio.Task[Any] | None) -> str:
    assert task is not None
    return type(task.get_coro()).__name__  # Settling: a task the operator made to run actions


def test_an_eager_action_that_never_suspends_runs_in_no_task_of_its_own() -> None:
    probe = Probe(eager=True, turns=0)
    assert sorted(_go(probe, _records(120))) == list(range(120))
    # every record ran, start to end, in the one task that feeds the operator: no task per record
    assert len(set(probe.before)) == 1 and set(probe.after) == set(probe.before)
    assert _runner(probe.before[0]) != "Settling"


def test_a_plain_action_runs_in_a_task_the_operator_made() -> None:
    probe = Probe(eager=False, turns=0)
    assert sorted(_go(probe, _records(12))) == list(range(12))
    assert {_runner(t) for t in probe.before} == {"Settling"}


def test_an_eager_action_that_suspends_goes_on_in_a_task_in_key_order() -> None:
    probe = Probe(eager=True, turns=2)
    out = _go(probe, _records(30))
    assert sorted(out) == list(range(30))
    assert any(_runner(t) != "Settling" for t in probe.before)  # started eagerly by the feeder ...
    assert {_runner(t) for t in probe.after} == {"Settling"}  # ... and resumed in a task
    assert not probe.overlap  # one record per key at a time
    assert [r for r in out if r % 3 == 0] == list(range(0, 30, 3))  # per key, in arrival order
    assert probe.cleaned == 30


def test_an_eager_failure_before_the_first_suspension_is_retried() -> None:
    probe = Probe(eager=True, turns=1, fail_first=True)
    out = _go(probe, _records(9), retry=RetryStrategy.fixed_delay(2, 0))
    assert sorted(out) == list(range(9))
    assert all(n == 2 for n in probe.attempts.values())


def test_an_eager_action_cut_by_its_timeout_runs_its_cleanup() -> None:
    class Slow(Probe):
        async def invoke(self, record: dict) -> list[Any]:
            try:
                await asyncio.Event().wait()  # never set: only the timeout ends it
            finally:
                self.cleaned += 1
            return []

    probe = Slow(eager=True, turns=0)
    op = KeyedAsyncWaitOperator(probe, mode="ordered", capacity=4, timeout=0.05, on_error="emit")
    out = run(collect(op, _records(4)))
    assert len(out) == 4 and all(type(x).__name__ == "FailedRecord" for x in out)
    assert probe.cleaned == 4


def test_prepare_says_what_an_action_returned() -> None:
    async def instant(x: int) -> int:
        return x * 2

    with pytest.raises(StopIteration) as done:
        prepare(instant, 21, True, "instant")
    assert done.value.value == 42

    coro, first = prepare(instant, 1, False, "instant")
    assert first is NOT_YET
    coro.close()  # not started: closed, so it is never "never awaited"

    with pytest.raises(TypeError, match=r"f\(record\) must return an awaitable"):
        prepare(lambda x: x, 1, True, "f")

"""The peak gauges of a task are sampled at a cost bounded by a share of the task's time."""

from __future__ import annotations

import dataclasses
import types
from typing import Any

import pytest

from keyed_async_wait.runtime.stats import EMPTY
from keyed_async_wait.spark import task as task_module
from keyed_async_wait.spark.task import SAMPLE_COST_SHARE, SAMPLE_EVERY, Task


class Clock:
    """A monotonic clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


class Operator:
    """An operator whose statistics take ``cost`` seconds of the clock to gather."""

    def __init__(self, clock: Clock, cost: float, in_flight: int, blocked_keys: int) -> None:
        self.clock, self.cost = clock, cost
        self.gauges = dataclasses.replace(EMPTY, in_flight=in_flight, blocked_keys=blocked_keys)

    @property
    def stats(self) -> Any:
        self.clock.now += self.cost
        return self.gauges


def bare_task(op: Operator) -> Task:
    task = Task.__new__(Task)  # no worker loop needed: only the sampling is under test
    task.op = op  # type: ignore[assignment]
    task.peak_in_flight = task.peak_blocked_keys = 0
    return task


@pytest.mark.parametrize("cost", [0.0, 0.0001, 0.002, 0.01])
def test_next_sample_waits_in_proportion_to_the_cost_of_the_last(
    monkeypatch: pytest.MonkeyPatch, cost: float
) -> None:
    clock = Clock()
    monkeypatch.setattr(task_module, "time", types.SimpleNamespace(monotonic=clock.monotonic))
    task = bare_task(Operator(clock, cost, in_flight=7, blocked_keys=3))

    next_sample = task._sample_peaks()

    assert next_sample == pytest.approx(clock.now + max(SAMPLE_EVERY, SAMPLE_COST_SHARE * cost))
    assert cost <= (next_sample - clock.now + cost) / SAMPLE_COST_SHARE  # at most 1/50 of the time
    assert (task.peak_in_flight, task.peak_blocked_keys) == (7, 3)


def test_peaks_only_rise(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(task_module, "time", types.SimpleNamespace(monotonic=clock.monotonic))
    op = Operator(clock, 0.0, in_flight=9, blocked_keys=4)
    task = bare_task(op)
    task._sample_peaks()
    op.gauges = EMPTY
    task._sample_peaks()
    assert (task.peak_in_flight, task.peak_blocked_keys) == (9, 4)


def test_a_function_that_reports_its_lookups_stats_is_counted_per_task() -> None:
    from keyed_async_wait.app.enrich import OrderEnricher
    from keyed_async_wait.spark.task import lookup_counts
    from lookup import HttpLookup

    fn = OrderEnricher("http://127.0.0.1:1", "redis://127.0.0.1:1/0", 1.0)
    fn.customers.stats.requests, fn.prices.stats.cache_hits = 3, 2
    assert lookup_counts(fn) == {"lookups": 3, "cache_hits": 2, "deduplicated": 0, "shared_cache_hits": 0}
    assert lookup_counts(HttpLookup("http://127.0.0.1:1/{id}"))["lookups"] == 0
    assert lookup_counts(object()) == {}

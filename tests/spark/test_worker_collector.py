"""The worker process's collector settings and the collections counted for the task log."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from keyed_async_wait.spark.worker import MIDDLE_THRESHOLD, YOUNG_THRESHOLD, CollectorWatch, tune_collector


@pytest.fixture
def python_defaults() -> Iterator[None]:
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        yield
    finally:
        gc.set_threshold(*saved)


def test_a_task_raises_the_young_and_middle_thresholds_only(
    python_defaults: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KAW_GC", raising=False)
    assert tune_collector() is True
    assert gc.get_threshold() == (YOUNG_THRESHOLD, MIDDLE_THRESHOLD, 10)
    gc.set_threshold(50_000, 5, 5)  # a threshold already set higher is kept; the oldest untouched
    assert tune_collector() is True
    assert gc.get_threshold() == (50_000, MIDDLE_THRESHOLD, 5)
    gc.set_threshold(100, 80, 5)
    tune_collector()
    assert gc.get_threshold() == (YOUNG_THRESHOLD, 80, 5)


def test_kaw_gc_default_leaves_python_alone(python_defaults: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAW_GC", "default")
    assert tune_collector() is False
    assert gc.get_threshold() == (700, 10, 10)


def test_a_disabled_threshold_stays_disabled(python_defaults: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KAW_GC", raising=False)
    gc.set_threshold(0)  # 0: automatic collection off; not ours to turn on
    tune_collector()
    assert gc.get_threshold() == (0, 10, 10)


def test_the_watch_counts_collections_per_generation() -> None:
    watch = CollectorWatch()
    gc.disable()  # only the collections asked for here
    try:
        before = watch.sample()
        gc.collect(0)
        gc.collect(2)
        young, middle, full, seconds = (a - b for a, b in zip(watch.sample(), before, strict=True))
    finally:
        watch.close()
        gc.enable()
    assert (young, middle, full) == (1, 0, 1)
    assert seconds >= 0
    gc.collect()
    assert watch.sample()[2] == full + before[2]  # closed: no longer counting

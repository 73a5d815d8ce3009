"""The groups of a task share one call: the hand-over rules, without Spark (sql_ext.groups)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sql_ext import groups
from sql_ext.groups import SharedCalls, at_group_boundary


class Call:
    def __init__(self) -> None:
        self.running, self.aborted = True, False

    def eval(self, row: Any) -> Iterator[tuple[Any, ...]]:
        return iter(())

    def flush(self) -> Iterator[tuple[Any, ...]]:
        return iter(())

    def terminate(self) -> Iterator[tuple[Any, ...]]:
        self.running = False
        return iter(())

    def abort(self) -> None:
        self.running, self.aborted = False, True


def test_the_groups_of_one_task_share_a_call_and_a_new_task_aborts_a_stale_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shared = SharedCalls()
    monkeypatch.setattr(groups, "task_attempt", lambda: 7)
    _, first = shared.get(1, Call)
    _, again = shared.get(1, Call)
    _, other_site = shared.get(2, Call)
    assert again is first and other_site is not first
    monkeypatch.setattr(groups, "task_attempt", lambda: 8)  # task 7 failed before its last terminate
    _, fresh = shared.get(1, Call)
    assert fresh is not first and first.aborted and other_site.aborted  # its lookups stop
    assert len(shared) == 1


def test_a_call_left_running_at_cleanup_is_aborted_and_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    shared = SharedCalls()
    monkeypatch.setattr(groups, "task_attempt", lambda: 1)
    slot, call = shared.get(1, Call)
    assert shared.left_open(slot) is call and call.aborted
    slot, done = shared.get(1, Call)
    done.terminate()
    shared.last(slot)
    assert shared.left_open(slot) is None


class _PartitioningWrapper:
    """Stands in for pyspark's wrapper: it calls terminate from eval at a group boundary."""

    def __init__(self, udtf: Any) -> None:
        self._udtf = udtf

    def _check_partition_boundaries(self, arguments: list[Any]) -> bool:
        return True

    def eval(self) -> bool:
        return bool(self._udtf.terminate())

    def terminate(self) -> bool:
        return bool(self._udtf.terminate())


class _Udtf:
    def terminate(self) -> bool:
        return at_group_boundary()


def test_a_boundary_is_a_terminate_from_the_wrappers_eval_and_anything_else_is_the_last() -> None:
    wrapper = _PartitioningWrapper(_Udtf())
    assert wrapper.eval() is True
    assert wrapper.terminate() is False
    assert _Udtf().terminate() is False  # called by anything else: the last (the safe side)

"""The classic tasks' counts of a micro-batch (``TaskCounts``), merged in any order: they stand
only when every partition's task read its input to the end; a task run again changes no bit."""

from __future__ import annotations

import functools
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from keyed_async_wait.spark.batch_counts import TaskCounts, every_partition_read

REPORT = st.tuples(
    st.integers(0, 69),  # the task's partition
    st.booleans(),  # it read its input to the end
    st.lists(st.integers(0, 1_000), min_size=5, max_size=5),  # new, replayed, peak, out, parked
)


def _added(report: tuple[int, bool, list[int]]) -> list[int]:
    partition, read_all, counts = report
    return [*counts, 1 << partition if read_all else 0]


def _merged(reports: list[Any]) -> list[int]:
    param = TaskCounts()
    return functools.reduce(param.addInPlace, map(_added, reports), param.zero([]))


@given(st.integers(1, 70), st.lists(REPORT, max_size=150), st.randoms())
def test_counts_stand_only_when_every_partition_read_to_the_end(
    partitions: int, reports: list[Any], order: Any
) -> None:
    reports = [r for r in reports if r[0] < partitions]
    merged = _merged(reports)
    read = {partition for partition, read_all, _ in reports if read_all}
    assert every_partition_read(merged[5], partitions) == (read == set(range(partitions)))
    shuffled = list(reports)
    order.shuffle(shuffled)
    assert _merged(shuffled) == merged  # the order the driver merges them in changes nothing
    assert merged[:2] + merged[3:5] == [sum(r[2][i] for r in reports) for i in (0, 1, 3, 4)]
    assert merged[2] == max((r[2][2] for r in reports), default=0)


@given(st.lists(REPORT, min_size=1, max_size=50))
def test_a_task_run_again_sets_no_new_bit(reports: list[Any]) -> None:
    once = _merged(reports)
    again = _merged(reports + reports[:1])
    assert again[5] == once[5]

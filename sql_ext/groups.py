"""One operator per task across the groups of a partitioned table-function call.

With ``PARTITION BY`` (an update stream's key buckets), Spark's Python worker makes one UDTF
instance per group and runs the groups of a task one after another: ``terminate`` of a group is
called before the first ``eval`` of the next. If each group waited for its own lookups, a task
would only ever run the keys of one group at once, and more buckets would mean less
concurrency. So the groups of one task share one call (one operator): at a group boundary the
instance hands over what it has and returns the results ready so far, without waiting; only the
task's last ``terminate`` waits for every lookup in flight.

Invariant: every row admitted in a task is emitted by the time its last ``terminate`` returns,
or the task fails. Keys never span groups, so per-key order is the operator's, as before. A call
left unfinished (no last ``terminate``) is found at ``cleanup`` and fails the task, never
silently dropped; one left by a failed task is aborted when the next task of the process
starts.

Whether a ``terminate`` is a boundary or the last is read from pyspark's partitioning wrapper:
:func:`keyed_async_wait.spark.compat.at_group_boundary`, checked on every supported version.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

__all__ = ["GroupCall", "SharedCalls", "task_attempt"]


class GroupCall(Protocol):
    """What the groups of a task share (a :class:`~sql_ext.calls.TableCall` or an
    :class:`~sql_ext.arrow_call.ArrowTableCall`): rows or Arrow batches in and out."""

    def eval(self, table: Any) -> Iterator[Any]: ...
    def flush(self) -> Iterator[Any]: ...
    def terminate(self) -> Iterator[Any]: ...
    def abort(self) -> None: ...
    @property
    def running(self) -> bool: ...


def task_attempt() -> int:
    """The Spark task attempt this worker runs now (-1 outside a task)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return int(context.taskAttemptId()) if context is not None else -1


class SharedCalls:
    """The process's open calls, by (task attempt, call site); at most one task's at a time."""

    def __init__(self) -> None:
        self._open: dict[tuple[int, int], GroupCall] = {}

    def get(self, site: int, make: Callable[[], GroupCall]) -> tuple[tuple[int, int], GroupCall]:
        """The call the groups of this task at ``site`` share (made by ``make`` for the first)."""
        slot = (task_attempt(), site)
        for stale in [s for s in self._open if s[0] != slot[0]]:
            self._open.pop(stale).abort()  # a failed task's: its lookups stop, nothing is emitted
        call = self._open.get(slot)
        if call is None:
            call = self._open[slot] = make()
        return slot, call

    def last(self, slot: tuple[int, int]) -> None:
        self._open.pop(slot, None)

    def left_open(self, slot: tuple[int, int]) -> GroupCall | None:
        """The call at ``slot`` if no last ``terminate`` finished it (aborted, to be reported)."""
        call = self._open.pop(slot, None)
        if call is not None and call.running:
            call.abort()
            return call
        return None

    def __len__(self) -> int:
        return len(self._open)

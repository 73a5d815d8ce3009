"""The plan of a wait, as the tasks get it: what :func:`~keyed_async_wait.spark.options.make_plan`
checked on the driver, pickled into the ``mapInArrow`` function; :func:`task_operator` builds a
task's operator from it, the one place that does so. No pyspark here: this is the task side.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..core.backlog import BacklogPolicy, Gear
from ..core.elements import OutputMode
from ..core.parking import DeferPolicy
from ..core.settings import OperatorSettings
from ..runtime.function import FunctionAdapter
from ..runtime.operator import KeyedAsyncWaitOperator
from .worker import shared

__all__ = ["Plan", "task_operator"]


@dataclass
class Plan:
    """Everything a task needs, built (and checked) on the driver, pickled into the mapInArrow
    function."""

    token: str
    function: Any
    settings: OperatorSettings  # mode, key, capacity, timeout, retry, batch size, latency tracking
    join: str  # "left" | "inner"
    input_columns: list[str]  # taken from the input batches as they are
    result_columns: list[str]
    out_schema: Any  # pyarrow.Schema: input columns, result columns, error column, passthrough
    error_column: str | None
    session_tz: str | None = None  # how a naive datetime in a TIMESTAMP result is read
    passthrough: tuple[str, ...] = ()  # columns set by the stage itself (parked state)
    sort_by: list[str] | None = None  # order inside the task (streaming: no sortWithinPartitions)
    metrics: Any = None  # AsyncWaitMetrics (accumulators), or None
    task_column: str | None = None  # observed metrics: each task ends with a row of its counts here
    backlog: BacklogPolicy | None = None  # None: fixed settings, no gears
    bounded: bool = False  # a batch query (always backlog under a policy)
    event_time: str | None = None  # a column whose lag behind the clock signals a backlog

    @property
    def mode(self) -> OutputMode:
        return self.settings.mode


def task_operator(
    plan: Plan,
    adapter: FunctionAdapter,
    gear: Gear | None = None,
    defer: DeferPolicy | None = None,
    emit_parked: bool = False,
) -> KeyedAsyncWaitOperator:
    """A task's operator: the plan's settings, in the task's backlog gear, with the error
    policy its output asks for (``defer``: parked state; an error column: emit; else fail)."""
    settings = plan.settings
    capacity, batch_size = settings.capacity, settings.batch_size
    buffer_timeout: float | None = 0.0
    if gear is not None and gear.is_backlog:
        capacity, batch_size, buffer_timeout = max(capacity, gear.capacity), gear.batch_size, None
    elif gear is not None:
        batch_size = min(batch_size or gear.batch_size, gear.batch_size)
        buffer_timeout = gear.buffer_timeout or 0.0
    settings = dataclasses.replace(
        settings,
        capacity=capacity,
        batch_size=batch_size,
        buffer_timeout=buffer_timeout,
        on_error="defer" if defer is not None else "emit" if plan.error_column else "fail",
        defer=defer,
        output="pairs",
        track_latency=plan.metrics is not None or plan.task_column is not None,
        emit_parked=emit_parked,
    )
    return KeyedAsyncWaitOperator.from_settings(shared(adapter), settings)

"""The plan of a wait, as its tasks get it, and the one place that builds a task's operator.

:func:`plan_of` is the one plan builder: the three waits and ``key_ordered_stream`` (on the
driver, through :mod:`keyed_async_wait.spark.options`), the SQL table function and the SQL
scalar function (in the task, from the task's settings) all call it, and it alone decides what
follows from the output form: results leave as ``(record, results)`` pairs, a failure is an
error row with an error column (or a parked row with a deferral), latency is tracked for
metrics. :meth:`Plan.operator` is the one place a task's operator is made. No pyspark here:
this is the task side.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..core.backlog import BacklogPolicy, Gear
from ..core.elements import OutputMode
from ..core.parking import DeferPolicy
from ..core.spec import WaitSpec
from ..runtime.backend import FunctionAdapter
from ..runtime.operator import KeyedAsyncWaitOperator
from ..runtime.overflow import Overflow
from .worker import shared

__all__ = ["Plan", "plan_of"]


@dataclass
class Plan:
    """Everything a task needs, built (and checked) before it runs; pickled into the task."""

    token: str  # names the function's instance in each worker process
    function: Any
    spec: WaitSpec  # the operator's options, as the task runs them (before a backlog gear)
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
    # every input column's name, given back to each batch: the stage ran with names Spark
    # misreads renamed (spark.column_names); None: the batches carry their names
    input_names: tuple[str, ...] | None = None

    @property
    def mode(self) -> OutputMode:
        return self.spec.mode

    def operator(
        self, adapter: FunctionAdapter, gear: Gear | None = None, overflow: Overflow | None = None
    ) -> KeyedAsyncWaitOperator:
        """The task's operator: the plan's spec in the task's backlog gear, over the process's
        instance of the function (whose open and close the process owns); ``overflow``: where
        it keeps the records it sets aside (a hot key's past the waiting bound)."""
        return KeyedAsyncWaitOperator.from_spec(shared(adapter), self.spec.in_gear(gear), overflow)


def plan_of(
    spec: WaitSpec,
    function: Any,
    *,
    input_columns: Sequence[str],
    result_columns: Sequence[str],
    out_schema: Any,
    session_tz: str | None,
    join: str = "left",
    error_column: str | None = None,
    defer: DeferPolicy | None = None,
    parked: bool = False,
    token: str | None = None,
    **edge: Any,
) -> Plan:
    """The plan of a wait of ``spec`` over ``function``: what its output form asks of the
    operator decided here, once. ``defer``: failed records are parked for a later micro-batch;
    ``parked``: records left unfinished leave as parked rows (``key_ordered_stream``); an
    ``error_column``: a failure is that row's error; else it fails the task. ``edge``: the
    other :class:`Plan` fields (passthrough, sort_by, metrics, task_column, backlog, bounded,
    event_time)."""
    on_error = "defer" if defer is not None else "emit" if error_column else "fail"
    tracked = edge.get("metrics") is not None or edge.get("task_column") is not None
    spec = spec.replaced(
        output="pairs", on_error=on_error, defer=defer, emit_parked=parked, track_latency=tracked
    )
    return Plan(
        token=token or uuid.uuid4().hex,
        function=function,
        spec=spec,
        join=join,
        input_columns=list(input_columns),
        result_columns=list(result_columns),
        out_schema=out_schema,
        error_column=error_column,
        session_tz=session_tz,
        **edge,
    )

"""A task's run of the table function: its operator, fed by Spark's calls (row form).

:func:`start_call` decides the mode of the task from its settings (FLIP-519's truth table,
:mod:`sql_ext.modes`), logs it (logger ``sql_ext.table``), counts it, and starts the operator
behind a :class:`~keyed_async_wait.runtime.push.PushDriver`. :class:`TableCall` is the row
form (pyspark 4.0, one ``eval`` per pickled row); :mod:`sql_ext.arrow_call` the Arrow form.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from keyed_async_wait.runtime.push import PushDriver
from keyed_async_wait.spark.compat import arrow_type
from keyed_async_wait.spark.plan import Plan
from keyed_async_wait.spark.runner import pushed
from keyed_async_wait.spark.values import column_converter

from .analysis import LookupAnalysis
from .modes import decide
from .rows import OutputRows
from .runtime import task_plan, task_time_zone, task_view
from .sources import LookupSource
from .values import row_reader

__all__ = ["DrivenCall", "StartedCall", "TableCall", "start_call"]

log = logging.getLogger("sql_ext.table")  # the logger the docs name for the mode decision

_PUSH_SIZE = 64  # rows per hand-over to the operator: fewer loop turns, still prompt


@dataclass
class StartedCall:
    """A task's operator, driven by the caller's thread, with its plan."""

    driver: PushDriver
    plan: Plan

    @property
    def zone(self) -> str:  # the task's session time zone
        assert self.plan.session_tz is not None
        return self.plan.session_tz


def start_call(
    source: LookupSource,
    analysis: LookupAnalysis,
    decisions: Any,
    time_zone: str,
    out_schema: Any = None,
) -> StartedCall:
    """The mode of this task (from its settings, logged and counted), its plan and operator."""
    view = task_view(source)  # a bad setting fails here, before any lookup
    zone = task_time_zone(time_zone)
    assert analysis.shape is not None
    decision = decide(view.operator, analysis.shape)
    log.info("async_lookup(%s): %s", source.name, decision.describe())
    if decisions is not None:
        decisions.add({f"{source.name}: {decision.describe()}": 1})
    # Spark hands a task's rows over group by group: many updates of few keys at a time; they
    # wait behind their keys outside the capacity (blocked-capacity), so the other keys still run
    plan, adapter = task_plan(
        source,
        view,
        decision.mode,
        key=decision.key or None,
        session_tz=zone,
        out_schema=out_schema,
        input_columns=analysis.columns,
        join=analysis.join,
        error_column=analysis.error_column,  # with an error column, failures are rows
    )
    return StartedCall(pushed(plan, adapter), plan)


class DrivenCall:
    """What both forms share: the source and its call, the task's driver, stopped cleanly
    when a step fails."""

    def __init__(
        self, sources: Mapping[str, LookupSource], analysis: LookupAnalysis, decisions: Any, time_zone: str
    ) -> None:
        self.source = analysis.declared or sources[analysis.source]
        self.analysis = analysis
        self.decisions = decisions
        self.time_zone = time_zone
        self.driver: PushDriver | None = None

    @property
    def running(self) -> bool:
        return self.driver is not None

    def abort(self) -> None:
        driver, self.driver = self.driver, None
        if driver is not None:
            driver.abort()

    def _guarded(self, step: Any, *args: Any) -> list[Any]:
        assert self.driver is not None
        try:
            outputs: list[Any] = step(*args)
        except BaseException:
            self.driver.abort()  # no lookups left running in the worker's loop
            raise
        return outputs


class TableCall(DrivenCall):
    """One instance's run: the operator fed row by row through a :class:`PushDriver`."""

    def __init__(
        self, sources: Mapping[str, LookupSource], analysis: LookupAnalysis, decisions: Any, time_zone: str
    ) -> None:
        super().__init__(sources, analysis, decisions, time_zone)
        self.columns = analysis.columns
        self.input_schema = analysis.input_schema
        self.read: Any = None
        self.left = analysis.join == "left"
        self.error_column = analysis.error_column
        self.out: OutputRows | None = None
        self.pending: list[dict[str, Any]] = []
        self.push_size = _PUSH_SIZE

    def _start(self) -> PushDriver:
        started = start_call(self.source, self.analysis, self.decisions, self.time_zone)
        self.read = row_reader(self.input_schema, started.zone)
        convert = {
            f.name: column_converter(arrow_type(f.dataType, started.zone), started.zone, arrow=False)
            for f in self.source.result_schema.fields
        }
        self.out = OutputRows(
            self.source.name,
            self.columns,
            self.source.result_columns,
            self.source.inputs,
            convert,
            left=self.left,
            error_column=self.error_column,
        )
        self.push_size = max(1, min(_PUSH_SIZE, started.plan.spec.capacity))
        self.driver = started.driver
        return self.driver

    def eval(self, row: Any) -> Iterator[tuple[Any, ...]]:
        driver = self.driver or self._start()
        self.pending.append(self.read(row))
        if len(self.pending) >= self.push_size:
            batch, self.pending = self.pending, []
            yield from self._rows(self._guarded(driver.push, batch))

    def flush(self) -> Iterator[tuple[Any, ...]]:
        """A group ended, the task goes on: hand over what is pending, the rows ready so far."""
        driver = self.driver
        if driver is None:
            return iter(())
        if not self.pending:
            return self._rows(driver.take())
        batch, self.pending = self.pending, []
        return self._rows(self._guarded(driver.push, batch))

    def terminate(self) -> Iterator[tuple[Any, ...]]:
        """The task's input ended: every row still in flight, waited for."""
        driver = self.driver
        if driver is None:
            return
        batch, self.pending = self.pending, []
        outputs = self._guarded(driver.push, batch) if batch else []
        outputs += self._guarded(driver.finish)
        self.driver = None
        yield from self._rows(outputs)

    def _rows(self, outputs: list[Any]) -> Iterator[tuple[Any, ...]]:
        assert self.out is not None
        return self.out.rows(outputs)

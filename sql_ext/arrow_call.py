"""The Arrow form of a task's run of the table function (pyspark 4.1+).

Spark hands ``eval`` an Arrow batch of the table (a group's slice of one, with ``PARTITION
BY``) and takes Arrow batches back, so no row is pickled or made a Python object twice. The
batches are read and assembled by the DataFrame waits' :class:`RowSource`: the table's columns
leave exactly as they came, the result columns are checked against their types, and a result
that does not fit fails the task or, with ``error_column``, is that row's error. The values a
function sees and the rows that come out are those of the row form (:mod:`sql_ext.calls`).

Invariant (as the row form's): every row handed to the operator is held by the
:class:`RowSource` until its output batch is assembled; :meth:`terminate` waits for all of
them and hands every one out. Finished rows are gathered into batches of at least
``OUTPUT_ROWS`` before they leave (each batch sent costs Spark a fixed amount).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa

from keyed_async_wait.runtime.push import PushDriver
from keyed_async_wait.spark.compat import arrow_type
from keyed_async_wait.spark.output import RowSource
from keyed_async_wait.spark.runner import OUTPUT_ROWS

from .analysis import LookupAnalysis
from .calls import DrivenCall, start_call
from .runtime import task_time_zone
from .sources import LookupSource

__all__ = ["ArrowTableCall"]


class ArrowTableCall(DrivenCall):
    """One task's run, fed Arrow batches through a :class:`PushDriver` (see the module)."""

    def __init__(
        self, sources: Mapping[str, LookupSource], analysis: LookupAnalysis, decisions: Any, time_zone: str
    ) -> None:
        super().__init__(sources, analysis, decisions, time_zone)
        self.rows: RowSource | None = None
        self.held: list[Any] = []  # finished, gathered into a bigger batch (see Task.outputs)

    def _start(self) -> PushDriver:
        zone = task_time_zone(self.time_zone)
        out = arrow_type(self.analysis.schema, zone)  # nullability as analyzed: Spark checks it
        started = start_call(self.source, self.analysis, self.decisions, zone, pa.schema(list(out)))
        self.rows = RowSource(started.plan)
        self.driver = started.driver
        return self.driver

    def eval(self, batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
        driver = self.driver or self._start()
        assert self.rows is not None
        yield from self._out(self._guarded(driver.push, self.rows.read(batch)))

    def flush(self) -> Iterator[pa.RecordBatch]:
        """A group ended, the task goes on: the rows finished so far (once enough are)."""
        if self.driver is None:
            return iter(())
        return self._out(self.driver.take())

    def terminate(self) -> Iterator[pa.RecordBatch]:
        """The task's input ended: every row still in flight, waited for."""
        if self.driver is None:
            return
        outputs = self._guarded(self.driver.finish)
        self.driver = None
        yield from self._out(outputs, last=True)

    def _out(self, outputs: list[Any], last: bool = False) -> Iterator[pa.RecordBatch]:
        assert self.rows is not None
        self.held += outputs
        if self.held and (last or len(self.held) >= OUTPUT_ROWS):
            held, self.held = self.held, []
            yield self.rows.assemble(held)

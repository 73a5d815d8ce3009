"""A plan's operator run in a task: the SQL functions' side of what :class:`~.task.Task` does for
the DataFrame waits (no pyspark here).

The worker process keeps one event loop and one instance of each function
(:mod:`keyed_async_wait.spark.worker`); :func:`outputs` drives a plan's operator over chunks of
records from the task's thread, :func:`pushed` hands records to it as Spark calls in with them.
Either way finished records are gathered into lists of at least :data:`OUTPUT_ROWS` before they
leave (each Arrow batch sent costs Spark a fixed amount).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

from ..runtime.backend import FunctionAdapter
from ..runtime.push import PushDriver
from .plan import Plan
from .worker import drive, worker_loop

__all__ = ["OUTPUT_ROWS", "outputs", "process_instance", "pushed"]

OUTPUT_ROWS = 4096  # operator outputs gathered into one Arrow batch (see worker.drive)


def process_instance(token: str, function: Any) -> FunctionAdapter:
    """This worker process's instance of ``function`` (one per ``token``), opened once."""
    return worker_loop().function(token, function)


def outputs(plan: Plan, adapter: FunctionAdapter, chunks: Iterable[list[Any]]) -> Iterator[list[Any]]:
    """The outputs of ``plan``'s operator over ``chunks`` of records, this thread driving the
    process's loop, in lists of at least :data:`OUTPUT_ROWS`."""
    operator = plan.operator(adapter)
    with contextlib.closing(
        drive(worker_loop().loop, operator.process_batches(chunks), OUTPUT_ROWS)
    ) as produced:
        yield from produced


def pushed(plan: Plan, adapter: FunctionAdapter) -> PushDriver:
    """``plan``'s operator behind a :class:`PushDriver`: records pushed in as Spark hands them
    over, outputs taken as they finish."""
    return PushDriver(plan.operator(adapter), worker_loop().loop)

"""What runs inside a Spark Python worker: one event loop per process, one instance of each
function per process, and the ``mapInArrow`` body that runs the operator over a partition.

This module keeps its state at module level on purpose: with ``spark.python.worker.reuse`` (the
default) a worker process runs many tasks, and its loop and clients serve all of them.
Importing it does not import pyspark; pyarrow is imported where batches are built.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import logging
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from itertools import chain
from typing import Any

from ..core.backlog import BacklogPolicy, Gear
from ..core.elements import OutputMode
from ..core.latency import LatencyHistogram
from ..core.parking import DeferPolicy
from ..core.settings import OperatorSettings
from ..runtime.function import FunctionAdapter, adapt_function
from ..runtime.operator import KeyedAsyncWaitOperator
from .columnar import ColumnarRun, supports_columnar
from .output import ResultSchemaError, RowSource

__all__ = [
    "Plan",
    "ResultSchemaError",  # re-exported: raised from the tasks
    "drive",
    "instance_of",
    "lookup_counts",
    "run_partition",
    "shared",
    "worker_loop",
]

log = logging.getLogger("keyed_async_wait.spark")


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
    backlog: BacklogPolicy | None = None  # None: fixed settings, no gears
    bounded: bool = False  # a batch query (always backlog under a policy)
    event_time: str | None = None  # a column whose lag behind the clock signals a backlog

    @property
    def mode(self) -> OutputMode:
        return self.settings.mode


# ---------------------------------------------------------------------- per-process state


class _WorkerLoop:
    """The process's event loop and function instances, for the life of the worker process.

    The task thread drives the loop itself (``run_until_complete`` until the next output chunk),
    as a hand-written ``asyncio.run`` per batch would, but the loop and its clients outlive the
    task. No second thread: measured, handing the GIL between a loop thread and the task
    thread cost about a sixth of the throughput of CPU-bound lookups.
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.functions: dict[str, FunctionAdapter] = {}
        atexit.register(self.shutdown)

    def function(self, token: str, function: Any) -> FunctionAdapter:
        """The process's instance of ``function`` (one per ``token``), opened once in the loop."""
        adapter = self.functions.get(token)
        if adapter is None:
            adapter = adapt_function(function)
            if adapter.open is not None:
                self.loop.run_until_complete(_awaited(adapter.open()))
            self.functions[token] = adapter
        return adapter

    def shutdown(self) -> None:
        async def close_all() -> None:
            for adapter in self.functions.values():
                if adapter.close is not None:
                    try:
                        await adapter.close()
                    except Exception:
                        log.warning("closing %s failed", adapter.name, exc_info=True)

        if self.loop.is_closed() or self.loop.is_running():
            return
        with contextlib.suppress(Exception):  # best effort at process exit
            self.loop.run_until_complete(asyncio.wait_for(close_all(), 10))
        self.loop.close()


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


_WORKER: _WorkerLoop | None = None


def worker_loop() -> _WorkerLoop:
    global _WORKER
    if _WORKER is None:
        _WORKER = _WorkerLoop()
    return _WORKER


# ---------------------------------------------------------------------- one task


def shared(adapter: FunctionAdapter) -> FunctionAdapter:
    """The adapter without open/close: the process owns those, not the task."""
    return FunctionAdapter(
        name=adapter.name,
        call=adapter.call,
        to_results=adapter.to_results,
        call_batch=adapter.call_batch,
        fallback=adapter.fallback,
        eager=adapter.eager,
    )


def drive(loop: asyncio.AbstractEventLoop, outputs: Any) -> Generator[list[Any], None, None]:
    """The chunks of an operator's ``process_batches``, the caller's thread driving ``loop``.
    Close it (``contextlib.closing``) to close the operator's run in the loop, also early."""
    try:
        while True:
            try:
                yield loop.run_until_complete(outputs.__anext__())
            except StopAsyncIteration:
                return
    finally:
        loop.run_until_complete(outputs.aclose())


def _operator(
    plan: Plan,
    adapter: FunctionAdapter,
    gear: Gear | None = None,
    defer: DeferPolicy | None = None,
    emit_parked: bool = False,
) -> KeyedAsyncWaitOperator:
    settings = plan.settings
    capacity, batch_size = settings.capacity, settings.batch_size
    buffer_timeout: float | None = 0.0
    if gear is not None and gear.name == "backlog":
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
        track_latency=plan.metrics is not None,
        emit_parked=emit_parked,
    )
    return KeyedAsyncWaitOperator.from_settings(shared(adapter), settings)


def _choose_gear(plan: Plan, batches: Iterator[Any]) -> tuple[Gear, str, Iterator[Any]]:
    """Look ahead at the task's Arrow batches until the policy can decide; the gear, the reason,
    and the batches again (those looked at first)."""
    policy = plan.backlog
    assert policy is not None
    seen: list[Any] = []
    rows, ended = 0, False
    if not plan.bounded and policy.is_backlog is None:
        while rows < policy.threshold_rows:
            batch = next(batches, None)
            if batch is None:
                ended = True
                break
            seen.append(batch)
            rows += batch.num_rows
    gear, reason = policy.decide(bounded=plan.bounded, rows=rows, input_ended=ended, lag=_lag(plan, seen))
    return gear, reason, chain(seen, batches)


def _lag(plan: Plan, batches: list[Any]) -> float | None:
    """Seconds the newest event time seen lags the clock (None without an event-time column)."""
    import pyarrow.compute as pc

    column = plan.event_time
    if column is None:
        return None
    newest = None
    for batch in batches:
        value = pc.max(batch.column(column)).as_py()
        if value is not None and (newest is None or value > newest):
            newest = value
    if newest is None:
        return None
    stamp = newest.timestamp() if hasattr(newest, "timestamp") else float(newest)
    return time.time() - stamp


def run_partition(plan: Plan, iterator: Iterator[Any]) -> Iterator[Any]:
    """The mapInArrow body: Arrow batches in, Arrow batches of input + result columns out.

    Intake reads the next Arrow batch whenever the operator has room, so records of later
    batches start while earlier ones are in flight: concurrency does not stop at batch ends.
    """
    worker = worker_loop()
    loop = worker.loop
    adapter = worker.function(plan.token, plan.function)
    batches: Iterator[Any] = iter(iterator)
    gear = None
    if plan.backlog is not None:
        gear, reason, batches = _choose_gear(plan, batches)
        log.info("async wait task: gear=%s because %s", gear.name, reason)
    op = _operator(plan, adapter, gear)
    source = RowSource(plan)
    instance = instance_of(adapter)
    before = lookup_counts(instance)
    started = time.monotonic()
    # backlog: identical lookups of the whole task are made once (a lookup's run-scoped cache)
    memo = getattr(instance, "memoized", None)
    backlog = gear is not None and gear.name == "backlog"
    with memo() if backlog and memo is not None else contextlib.nullcontext():
        if backlog and supports_columnar(plan, instance):
            columnar = ColumnarRun(plan, instance, loop)
            yield from columnar.batches(batches)
            if columnar.pending is None:
                _report_columnar(plan, instance, before, columnar, time.monotonic() - started)
                return
            batches = chain([columnar.pending], batches)
        yield from _run_task(plan, op, loop, source, batches, instance, before, started, gear)


def _report_columnar(
    plan: Plan, instance: Any, before: dict[str, int], run: ColumnarRun, wall: float
) -> None:
    after = lookup_counts(instance)
    delta = {k: after[k] - before.get(k, 0) for k in after}
    log.info(
        "async wait task: mode=%s gear=backlog (columnar) records=%d rows_out=%d wall=%.2fs lookups=%s "
        "cache_hits=%s",
        plan.mode.name,
        run.records,
        run.rows_out,
        wall,
        delta.get("lookups", "-"),
        delta.get("cache_hits", "-"),
    )
    if plan.metrics is not None:
        plan.metrics.add_task(
            records=run.records,
            rows_out=run.rows_out,
            attempts=delta.get("lookups", 0),
            lookups=delta.get("lookups", 0),
            cache_hits=delta.get("cache_hits", 0),
            backlog_tasks=1,
        )


def _run_task(
    plan: Plan,
    op: KeyedAsyncWaitOperator,
    loop: asyncio.AbstractEventLoop,
    source: RowSource,
    batches: Iterator[Any],
    instance: Any,
    before: dict[str, int],
    started: float,
    gear: Gear | None,
) -> Iterator[Any]:
    rows_out = 0
    peaks = {"in_flight": 0, "blocked_keys": 0}
    chunks = source.chunks(batches, plan.sort_by)
    try:
        with contextlib.closing(drive(loop, op.process_batches(chunks))) as produced:
            for chunk in produced:
                gauges = op.stats  # sampled once per output chunk
                peaks["in_flight"] = max(peaks["in_flight"], gauges.in_flight)
                peaks["blocked_keys"] = max(peaks["blocked_keys"], gauges.blocked_keys)
                batch = source.assemble(chunk)
                rows_out += batch.num_rows
                yield batch
    finally:
        _report(plan, op, instance, before, rows_out, time.monotonic() - started, peaks, gear)


def instance_of(adapter: FunctionAdapter) -> Any:
    return getattr(adapter.call, "__self__", None)


def lookup_counts(instance: Any) -> dict[str, int]:
    stats = getattr(instance, "stats", None)
    if stats is None:
        return {}
    return {"lookups": stats.requests, "cache_hits": stats.cache_hits, "deduplicated": stats.deduplicated}


def _report(
    plan: Plan,
    op: KeyedAsyncWaitOperator,
    instance: Any,
    before: dict[str, int],
    rows_out: int,
    wall: float,
    peaks: dict[str, int],
    gear: Gear | None = None,
) -> None:
    stats = op.stats
    after = lookup_counts(instance)
    delta = {k: after[k] - before.get(k, 0) for k in after}
    latency = op.latency or LatencyHistogram()
    pct = {p: latency.percentile(p) for p in (50, 95, 99)}
    log.info(
        "async wait task: mode=%s records=%d rows_out=%d wall=%.2fs attempts=%d retries=%d timeouts=%d "
        "failures=%d lookups=%s cache_hits=%s peak_in_flight=%d peak_blocked_keys=%d "
        "latency_p50=%s p95=%s p99=%s",
        plan.mode.name,
        stats.records_in,
        rows_out,
        wall,
        stats.attempts,
        stats.retries,
        stats.timeouts,
        stats.failures,
        delta.get("lookups", "-"),
        delta.get("cache_hits", "-"),
        peaks["in_flight"],
        peaks["blocked_keys"],
        _ms(pct.get(50)),
        _ms(pct.get(95)),
        _ms(pct.get(99)),
    )
    metrics = plan.metrics
    if metrics is not None:
        metrics.add_task(
            records=stats.records_in,
            rows_out=rows_out,
            attempts=stats.attempts,
            retries=stats.retries,
            timeouts=stats.timeouts,
            failures=stats.failures,
            lookups=delta.get("lookups", 0),
            cache_hits=delta.get("cache_hits", 0),
            peak_in_flight=peaks["in_flight"],
            peak_blocked_keys=peaks["blocked_keys"],
            backlog_tasks=int(gear is not None and gear.name == "backlog"),
            caught_up_tasks=int(gear is not None and gear.name != "backlog"),
            latency=latency,
        )


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}ms"

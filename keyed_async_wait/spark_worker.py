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
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from .elements import FailedRecord, OutputMode
from .exceptions import KeyedAsyncWaitError
from .function import FunctionAdapter, adapt_function
from .operator import KeyedAsyncWaitOperator
from .retry import RetryStrategy

__all__ = ["Plan", "ResultSchemaError", "run_partition", "worker_loop"]

log = logging.getLogger("keyed_async_wait.spark")

LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)


class ResultSchemaError(KeyedAsyncWaitError, TypeError):
    """A result does not fit the declared output schema; names the column and the key."""


@dataclass
class Plan:
    """Everything a task needs, built on the driver and pickled into the mapInArrow function."""

    token: str
    function: Any
    mode: OutputMode
    key: Any
    capacity: int
    timeout: float | None
    retry: RetryStrategy | None
    join: str  # "left" | "inner"
    input_columns: list[str]
    result_columns: list[str]
    out_schema: Any  # pyarrow.Schema
    error_column: str | None
    sort_by: list[str] | None = None  # order inside the task (streaming: no sortWithinPartitions)
    batch_size: int | None = 1000
    metrics: Any = None  # AsyncWaitMetrics (accumulators), or None
    extra: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------- per-process state


class _WorkerLoop:
    """An event loop on a daemon thread, for the life of the worker process."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.functions: dict[str, FunctionAdapter] = {}
        self.lock = threading.Lock()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.call_soon(ready.set)
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, name="keyed-async-wait-loop", daemon=True)
        self.thread.start()
        ready.wait(30)
        atexit.register(self.shutdown)

    def function(self, plan: Plan) -> FunctionAdapter:
        """The process's instance of the plan's function, opened once in the loop."""
        with self.lock:
            adapter = self.functions.get(plan.token)
            if adapter is None:
                adapter = adapt_function(plan.function)
                if adapter.open is not None:
                    asyncio.run_coroutine_threadsafe(_awaited(adapter.open()), self.loop).result(60)
                self.functions[plan.token] = adapter
        return adapter

    def shutdown(self) -> None:
        async def close_all() -> None:
            for adapter in self.functions.values():
                if adapter.close is not None:
                    try:
                        await adapter.close()
                    except Exception:
                        log.warning("closing %s failed", adapter.name, exc_info=True)

        with contextlib.suppress(Exception):  # best effort at process exit
            asyncio.run_coroutine_threadsafe(close_all(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


_WORKER: _WorkerLoop | None = None
_WORKER_LOCK = threading.Lock()


def worker_loop() -> _WorkerLoop:
    global _WORKER
    with _WORKER_LOCK:
        if _WORKER is None:
            _WORKER = _WorkerLoop()
        return _WORKER


# ---------------------------------------------------------------------- one task

_END = object()


class _Bridge:
    """Output chunks from the loop thread to the task thread, bounded (back-pressure)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, size: int = 4) -> None:
        self.loop = loop
        self.queue: queue.Queue[Any] = queue.Queue(maxsize=size)

    async def put(self, item: Any) -> None:
        try:
            self.queue.put_nowait(item)
        except queue.Full:
            await self.loop.run_in_executor(None, self.queue.put, item)


async def _read_batches(
    iterator: Iterator[Any], loop: asyncio.AbstractEventLoop, plan: Plan
) -> AsyncIterator[list]:
    """Arrow batches as lists of row dicts, read off the loop thread so the loop never blocks."""
    if plan.sort_by:
        rows: list[dict] = []
        batch: Any
        while (batch := await loop.run_in_executor(None, next, iterator, _END)) is not _END:
            rows.extend(batch.to_pylist())
        rows.sort(key=lambda r: tuple(r[c] for c in plan.sort_by or ()))
        for i in range(0, len(rows), 10_000):
            yield rows[i : i + 10_000]
        return
    chunk: Any
    while (chunk := await loop.run_in_executor(None, _next_rows, iterator)) is not _END:
        yield chunk


def _next_rows(iterator: Iterator[Any]) -> Any:
    batch: Any = next(iterator, _END)
    return batch if batch is _END else batch.to_pylist()


def _operator(plan: Plan, adapter: FunctionAdapter) -> KeyedAsyncWaitOperator:
    shared = FunctionAdapter(  # the process owns open/close, not the task
        name=adapter.name,
        call=adapter.call,
        to_results=adapter.to_results,
        call_batch=adapter.call_batch,
        fallback=adapter.fallback,
        eager=adapter.eager,
    )
    return KeyedAsyncWaitOperator(
        shared,
        mode=plan.mode,
        key=plan.key,
        capacity=plan.capacity,
        timeout=plan.timeout,
        retry=plan.retry,
        on_error="emit" if plan.error_column else "fail",
        output="pairs",
        batch_size=plan.batch_size,
        track_latency=plan.metrics is not None,
    )


def run_partition(plan: Plan, iterator: Iterator[Any]) -> Iterator[Any]:
    """The mapInArrow body: Arrow batches in, Arrow batches of input + result columns out."""
    worker = worker_loop()
    loop = worker.loop
    adapter = worker.function(plan)
    op = _operator(plan, adapter)
    bridge = _Bridge(loop)
    instance = _instance_of(adapter)
    before = _lookup_counts(instance)
    started = time.monotonic()

    async def pump() -> None:
        try:
            async for chunk in op.process_batches(_read_batches(iterator, loop, plan)):
                await bridge.put(chunk)
        except BaseException as exc:
            await bridge.put(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
        else:
            await bridge.put(_END)

    future = asyncio.run_coroutine_threadsafe(pump(), loop)
    rows_out = 0
    try:
        while True:
            item = bridge.queue.get()
            if item is _END:
                break
            if isinstance(item, BaseException):
                raise item
            batch = _to_arrow(plan, item)
            rows_out += batch.num_rows
            yield batch
    finally:
        if not future.done():
            loop.call_soon_threadsafe(future.cancel)
            with contextlib.suppress(BaseException):  # the task is ending anyway
                future.result(30)
        _report(plan, op, instance, before, rows_out, time.monotonic() - started)


def _instance_of(adapter: FunctionAdapter) -> Any:
    return getattr(adapter.call, "__self__", None)


def _lookup_counts(instance: Any) -> dict[str, int]:
    stats = getattr(instance, "stats", None)
    if stats is None:
        return {}
    return {"lookups": stats.requests, "cache_hits": stats.cache_hits, "deduplicated": stats.deduplicated}


def _report(
    plan: Plan, op: KeyedAsyncWaitOperator, instance: Any, before: dict[str, int], rows_out: int, wall: float
) -> None:
    stats = op.stats
    after = _lookup_counts(instance)
    delta = {k: after[k] - before.get(k, 0) for k in after}
    latencies = sorted(op.latencies)
    pct = (
        {p: latencies[min(len(latencies) - 1, int(len(latencies) * p / 100))] for p in (50, 95, 99)}
        if latencies
        else {}
    )
    log.info(
        "async wait task: mode=%s records=%d rows_out=%d wall=%.2fs attempts=%d retries=%d timeouts=%d "
        "failures=%d lookups=%s cache_hits=%s latency_p50=%s p95=%s p99=%s",
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
            latencies=latencies,
        )


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}ms"


# ---------------------------------------------------------------------- output rows


def _to_arrow(plan: Plan, chunk: list[Any]) -> Any:
    import pyarrow as pa

    rows: list[dict[str, Any]] = []
    result_columns, error_column, left = plan.result_columns, plan.error_column, plan.join == "left"
    allowed = set(result_columns)
    for item in chunk:
        if isinstance(item, FailedRecord):
            row = dict(item.record)
            if error_column:
                row[error_column] = {
                    "error_type": item.error_type,
                    "error_message": item.error_message,
                    "attempts": item.attempts,
                }
            rows.append(row)
            continue
        record, results = item
        if not results:
            if left:
                rows.append(record)
            continue
        for result in results:
            if not isinstance(result, dict):
                raise ResultSchemaError(
                    f"a result must be a dict of result columns {result_columns}, got "
                    f"{type(result).__name__} {result!r:.100} for the record with key "
                    f"{_key_of(plan, record)!r}"
                )
            if not allowed.issuperset(result):
                extra = sorted(set(result) - allowed)
                raise ResultSchemaError(
                    f"result column {extra[0]!r} is not in the output schema (result columns: "
                    f"{result_columns}) for the record with key {_key_of(plan, record)!r}"
                )
            rows.append({**record, **result})
    try:
        return pa.RecordBatch.from_pylist(rows, schema=plan.out_schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as exc:
        raise _explain(plan, rows, exc) from exc


def _key_of(plan: Plan, record: dict[str, Any]) -> Any:
    key = plan.key
    if isinstance(key, str):
        return record.get(key)
    if isinstance(key, (list, tuple)):
        return tuple(record.get(k) for k in key)
    return {c: record.get(c) for c in plan.input_columns[:3]}


def _explain(plan: Plan, rows: list[dict[str, Any]], exc: Exception) -> ResultSchemaError:
    import pyarrow as pa

    for name in plan.result_columns:
        arrow_type = plan.out_schema.field(name).type
        for row in rows:
            value = row.get(name)
            try:
                pa.array([value], type=arrow_type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
                return ResultSchemaError(
                    f"result column {name!r} ({arrow_type}) cannot hold {value!r:.100} "
                    f"({type(value).__name__}) for the record with key {_key_of(plan, row)!r}"
                )
    return ResultSchemaError(f"results do not fit the output schema: {exc}")

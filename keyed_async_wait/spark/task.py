"""One Spark task, whatever its kind: plain, parked-state or columnar.

:class:`Task` holds what every task needs (the process's loop and function instance, the
operator built from the plan, the row source, peaks and counts) and reports once at its end,
in the task log and in the plan's :class:`~keyed_async_wait.spark.metrics.AsyncWaitMetrics`.
:func:`run_partition` is the ``mapInArrow`` body of the three waits;
:func:`~keyed_async_wait.spark.parked.run_parking_partition` that of ``key_ordered_stream``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from itertools import chain
from typing import Any

from ..core.backlog import Gear
from ..core.latency import LatencyHistogram
from ..runtime.backend import counters_of
from .column_names import named
from .columnar import ColumnarRun, supports_columnar
from .instances import Instances
from .metrics import BACKEND_COUNTERS
from .output import RowSource
from .plan import Plan
from .runner import OUTPUT_ROWS
from .spill import ArrowSpill
from .worker import drive, worker_loop

__all__ = ["Task", "lookup_counts", "run_partition"]

log = logging.getLogger(__name__)

SAMPLE_EVERY = 0.05  # seconds between samples of the peak gauges (in flight, blocked keys)
# a sample walks every record inside (its cost grows with capacity): the next one waits at
# least this many times as long as the last one took, so sampling stays under 1/50 of the task
SAMPLE_COST_SHARE = 50

# counts a backend reports (its counters()) that the task log line names first; the others follow
SHOWN_FIRST = ("lookups", "cache_hits")


class Task:
    """What one task runs and counts; :meth:`report` once at its end (in a ``finally``)."""

    def __init__(self, plan: Plan, gear: Gear | None = None) -> None:
        worker = worker_loop()
        self.plan, self.gear, self.loop = plan, gear, worker.loop
        self.collector = worker.collector
        self._collected = self.collector.sample()
        self._instances: Instances | None = worker.instances
        self.adapter = worker.instances.acquire(plan.token, plan.function)  # released in report()
        self.source = RowSource(plan)
        self.spill = ArrowSpill(self.source)  # a hot key's records past the waiting bound
        self.op = plan.operator(self.adapter, gear, self.spill)
        self._before = dict(self.adapter.counters())
        self._started = time.monotonic()
        self._cpu_started = time.process_time()  # the worker process's CPU: what executors pay
        self.rows_out = 0
        self.peak_in_flight = self.peak_blocked_keys = 0
        self._next_sample = -1.0
        self.columnar: ColumnarRun | None = None  # the part a backlog task ran column-wise

    def outputs(self, chunks: Iterator[list[Any]]) -> Iterator[list[Any]]:
        """The operator's outputs over ``chunks``, the task thread driving the loop, joined
        into lists of at least :data:`OUTPUT_ROWS` (:func:`~.worker.drive` says why)."""
        outputs = self.op.process_batches(chunks)
        with contextlib.closing(drive(self.loop, outputs, OUTPUT_ROWS, self._sample)) as produced:
            yield from produced

    def _sample(self) -> None:
        """Sample the peak gauges, when it is time to."""
        if time.monotonic() >= self._next_sample:
            self._next_sample = self._sample_peaks()

    def _sample_peaks(self) -> float:
        """Raise the peak gauges to what the operator holds now; when to sample next."""
        started = time.monotonic()
        gauges = self.op.stats  # walks every record inside
        self.peak_in_flight = max(self.peak_in_flight, gauges.in_flight)
        self.peak_blocked_keys = max(self.peak_blocked_keys, gauges.blocked_keys)
        ended = time.monotonic()
        return ended + max(SAMPLE_EVERY, SAMPLE_COST_SHARE * (ended - started))

    def report(self) -> dict[str, Any]:
        """One log line and the plan's metrics, for the whole task (columnar part included);
        the counts reported."""
        if self._instances is not None:  # the task no longer uses its function's instance
            self._instances.release(self.plan.token)
            self._instances = None
        plan, stats, columnar = self.plan, self.op.stats, self.columnar
        after = self.adapter.counters()
        lookups = {k: after[k] - self._before.get(k, 0) for k in after}
        records = stats.records_in + (columnar.records if columnar else 0)
        rows_out = self.rows_out + (columnar.rows_out if columnar else 0)
        # a columnar lookup is one attempt per distinct key
        attempts = stats.attempts + (lookups.get("lookups", 0) if columnar and not stats.attempts else 0)
        latency = self.op.latency or LatencyHistogram()
        gear = self.gear
        log.info(
            "async wait task: mode=%s gear=%s%s records=%d rows_out=%d wall=%.2fs cpu=%.2fs attempts=%d "
            "batches=%d retries=%d timeouts=%d failures=%d lookups=%s cache_hits=%s peak_in_flight=%d "
            "peak_blocked_keys=%d set_aside=%d latency_p50=%s p95=%s p99=%s gc=%s%s",
            plan.mode.name,
            gear.name if gear else "-",
            " (columnar)" if columnar else "",
            records,
            rows_out,
            time.monotonic() - self._started,
            time.process_time() - self._cpu_started,
            attempts,
            stats.batches,
            stats.retries,
            stats.timeouts,
            stats.failures,
            lookups.get("lookups", "-"),
            lookups.get("cache_hits", "-"),
            self.peak_in_flight,
            self.peak_blocked_keys,
            self.spill.spilled,
            *(_ms(latency.percentile(p)) for p in (50, 95, 99)),
            self._collections(),
            _backend_text(lookups, self.adapter.gauges()),
        )
        counts = dict(
            records=records,
            rows_out=rows_out,
            attempts=attempts,
            retries=stats.retries,
            timeouts=stats.timeouts,
            failures=stats.failures,
            set_aside=self.spill.spilled,
            **{name: lookups.get(name, 0) for name in BACKEND_COUNTERS},
            peak_in_flight=self.peak_in_flight,
            peak_blocked_keys=self.peak_blocked_keys,
            backlog_tasks=int(gear is not None and gear.is_backlog),
            caught_up_tasks=int(gear is not None and not gear.is_backlog),
        )
        if plan.metrics is not None:
            plan.metrics.add_task(latency=latency, **counts)
        return {**counts, "latency": latency.counts}

    def _collections(self) -> str:
        """The garbage collections during the task: young/middle/full and their CPU time."""
        now = self.collector.sample()
        young, middle, full, seconds = (a - b for a, b in zip(now, self._collected, strict=True))
        return f"{young}/{middle}/{full}:{_ms(seconds)}"

    def task_row(self, counts: dict[str, Any]) -> Any:
        """The row that carries this task's counts to observed metrics (the rest null)."""
        import pyarrow as pa

        column, schema = self.plan.task_column, self.plan.out_schema
        arrays = [
            pa.array([counts], type=f.type) if f.name == column else pa.nulls(1, type=f.type) for f in schema
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


def run_partition(plan: Plan, iterator: Iterator[Any]) -> Iterator[Any]:
    """The mapInArrow body: Arrow batches in, Arrow batches of input + result columns out.

    Intake reads the next Arrow batch whenever the operator has room, so records of later
    batches start while earlier ones are in flight: concurrency does not stop at batch ends.
    """
    batches: Iterator[Any] = iter(iterator)
    if plan.input_names is not None:
        batches = named(batches, plan.input_names)
    gear = None
    if plan.backlog is not None:
        gear, reason, batches = _choose_gear(plan, batches)
        log.info("async wait task: gear=%s because %s", gear.name, reason)
    task = Task(plan, gear)
    # backlog: identical lookups of the whole task are made once (a lookup's run-scoped cache)
    backlog = gear is not None and gear.is_backlog
    try:
        with task.adapter.memoized() if backlog else contextlib.nullcontext():
            yield from _run(plan, task, batches, backlog)
    except BaseException:
        task.report()
        raise
    counts = task.report()
    if plan.task_column is not None:
        yield task.task_row(counts)


def _run(plan: Plan, task: Task, batches: Iterator[Any], backlog: bool) -> Iterator[Any]:
    if backlog and supports_columnar(plan, task.adapter):
        task.columnar = columnar = ColumnarRun(plan, task.adapter.columnar, task.loop)
        yield from columnar.batches(batches)
        if columnar.pending is None:
            return
        batches = chain([columnar.pending], batches)
    source = task.source
    for chunk in task.outputs(source.chunks(batches, plan.sort_by)):
        batch = source.assemble(chunk)
        task.rows_out += batch.num_rows
        yield batch


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


def lookup_counts(instance: Any) -> dict[str, int]:
    """What a backend (a lookup, a write, a chain, a function of the user's made of lookups) has
    counted in this process so far: its ``counters()``, read through the backend protocol."""
    return counters_of(instance)


def _backend_text(counts: dict[str, int], gauges: Any) -> str:
    """The backend's part of the task log line: the counts it reported that the line has not
    named yet (limits: 429s, 5xx, short-circuited, throttled ms; writes: applied, stale), then
    its gauges as they are now (an adaptive limit, a chain's steps)."""
    shown = "".join(f" {name}={value}" for name, value in counts.items() if name not in SHOWN_FIRST)
    return shown + "".join(f" {name}={value}" for name, value in gauges.items())


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}ms"

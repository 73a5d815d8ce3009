"""The task side of rescale-safe streaming (no pyspark here): one partition of a micro-batch,
parked rows of earlier micro-batches first, then new rows; what does not finish leaves as
parked rows again.

A row is parked when it carries the state column (a struct, see :data:`STATE_FIELDS`); new rows
have it null. The partition arrives sorted: parked rows in their order, then new rows in arrival
order, and every row of a key in this one partition (the driver repartitions by the key).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .keys import DEFAULT_MAX_PARALLELISM, key_group_for
from .operator import KeyedAsyncWaitOperator
from .parking import DeferPolicy, ParkedItem, ParkInfo
from .spark_output import RowSource
from .spark_worker import Plan, _operator, _report, drive, instance_of, lookup_counts, worker_loop

__all__ = ["STATE_COLUMN", "STATE_FIELDS", "ParkingPlan", "run_parking_partition"]

STATE_COLUMN = "_kaw_parked"
STATE_FIELDS = (
    ("order", "long"),  # position among the parked rows of the partition that wrote them
    ("key_group", "int"),  # the core's stable hash of the key, in max_parallelism groups
    ("attempts", "int"),
    ("deferrals", "int"),
    ("next_try", "double"),  # wall-clock seconds; null: at once
    ("deferred_since", "double"),
    ("error", "string"),
)


@dataclass(frozen=True)
class ParkingPlan:
    time_cap: float | None  # seconds a task may start work for; None: no cap
    defer: DeferPolicy | None  # with on_error="defer"
    max_parallelism: int = DEFAULT_MAX_PARALLELISM
    counts: Any = None  # an accumulator of [new rows, replayed rows], for the batch reports


def _split(
    source: RowSource, iterator: Iterator[Any]
) -> tuple[list[tuple[dict[str, Any], Any]], list[dict[str, Any]]]:
    """``(parked rows with their state, in their order; new rows)``, the state column taken out."""
    parked: list[tuple[dict[str, Any], Any]] = []
    new: list[dict[str, Any]] = []
    for rows in source.chunks(iterator):
        for row in rows:
            state = row.pop(STATE_COLUMN)
            if state is None:
                new.append(row)
            else:
                parked.append((row, state))
    parked.sort(key=lambda pair: pair[1]["order"])
    return parked, new


def _parked_item(row: dict[str, Any], state: dict[str, Any], key_of: Any) -> ParkedItem:
    info = ParkInfo(
        state["attempts"] or 0,
        state["deferrals"] or 0,
        state["next_try"],
        state["deferred_since"],
        state["error"],
    )
    return ParkedItem(row, key_of(row), info)


def _parked_state(item: ParkedItem, order: int, max_parallelism: int) -> dict[str, Any]:
    info = item.info
    return {
        "order": order,
        "key_group": key_group_for(item.key, max_parallelism),
        "attempts": info.attempts,
        "deferrals": info.deferrals,
        "next_try": info.next_try,
        "deferred_since": info.deferred_since,
        "error": info.error,
    }


def run_parking_partition(plan: Plan, parking: ParkingPlan, iterator: Iterator[Any]) -> Iterator[Any]:
    """mapInArrow body: replay this partition's parked rows, run the new ones until the time cap,
    and emit results (state column null) followed by the rows parked again (state set)."""
    worker = worker_loop()
    loop = worker.loop
    adapter = worker.function(plan.token, plan.function)
    op: KeyedAsyncWaitOperator = _operator(plan, adapter, defer=parking.defer)
    started = time.monotonic()
    source = RowSource(plan)
    rows, new = _split(source, iterator)
    if parking.counts is not None:
        parking.counts.add([len(new), len(rows)])
    key_of = op.key_selector
    assert key_of is not None
    op.replay_parked([_parked_item(row, state, key_of) for row, state in rows])
    instance = instance_of(adapter)
    before = lookup_counts(instance)
    cap = loop.call_later(parking.time_cap, op.hold) if parking.time_cap is not None else None
    outputs = op.process_batches(new[i : i + 10_000] for i in range(0, len(new), 10_000))
    rows_out = 0
    peaks = {"in_flight": 0, "blocked_keys": 0}
    try:
        with contextlib.closing(drive(loop, outputs)) as produced:
            for chunk in produced:
                gauges = op.stats
                peaks["in_flight"] = max(peaks["in_flight"], gauges.in_flight)
                peaks["blocked_keys"] = max(peaks["blocked_keys"], gauges.blocked_keys)
                batch = source.assemble(chunk)
                rows_out += batch.num_rows
                yield batch
    finally:
        if cap is not None:
            cap.cancel()
        _report(plan, op, instance, before, rows_out, time.monotonic() - started, peaks)
    left = op.leftover
    base = _partition_id() << 32
    for i in range(0, len(left), 10_000):
        part = left[i : i + 10_000]
        states = [_parked_state(item, base + i + n, parking.max_parallelism) for n, item in enumerate(part)]
        yield source.assemble([(item.record, []) for item in part], state=states)


def _partition_id() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.partitionId() if context is not None else 0

"""The task side of rescale-safe streaming (no pyspark here): one partition of a micro-batch,
parked rows of earlier micro-batches first, then new rows; what does not finish leaves as
parked rows again.

A row is parked when it carries the state column (a struct, see :data:`STATE_FIELDS`); new rows
have it null. The partition arrives sorted by Spark: parked rows in their order, then new rows
in arrival order, and every row of a key in this one partition (the driver repartitions by the
key; with ``assume_partitioned`` the source holds it so, and the task reports its keys to the
driver, which checks). Rows stream through: the task holds no more than the operator's
capacity and one Arrow batch, whatever the size of its share of the micro-batch; a parked row
leaves the moment it is parked, with its position in the task's input as its order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark import TaskContext

from ..core.chain import PROGRESS_FIELD, ChainProgress
from ..core.exceptions import RecordKeyError
from ..core.keys import DEFAULT_MAX_PARALLELISM, key_group_for, keys_of_many, stable_hash
from ..core.parking import ParkedBatch, ParkedItem, ParkInfo
from .journal import ProgressJournal, TaskProgress
from .memory import PeakMemory
from .output import RowSource
from .plan import Plan
from .task import Task

__all__ = ["STATE_COLUMN", "STATE_FIELDS", "ParkingPlan", "run_parking_partition"]

STATE_COLUMN = "_kaw_parked"
STATE_FIELDS = (
    ("seg", "long"),  # the micro-batch that first parked the row (orders a key's rows with order)
    ("order", "long"),  # position within that micro-batch's task input
    ("key_group", "int"),  # the core's stable hash of the key, in max_parallelism groups
    ("attempts", "int"),
    ("deferrals", "int"),
    ("next_try", "double"),  # wall-clock seconds; null: at once
    ("deferred_since", "double"),
    ("error", "string"),
    ("progress", "string"),  # a chain's progress (steps finished, their results): resumes there
)


@dataclass(frozen=True)
class ParkingPlan:
    time_cap: float | None  # seconds a task may start work for; None: no cap
    max_parallelism: int = DEFAULT_MAX_PARALLELISM
    counts: Any = None  # accumulator: [new, replayed, peak KiB a task added, rows out, rows parked]
    batch_id: int = 0  # the micro-batch: what re-parked rows carry as their seg
    journal: ProgressJournal | None = None  # a chain's step journal (spark.journal)
    journal_prefix: str = ""  # its hash names: <prefix>:<batch_id>
    spread: Any = None  # accumulator: the keys' stable hashes each task ran (spark.key_spread)


def _parked_item(row: dict[str, Any], state: dict[str, Any], key_of: Any) -> ParkedItem:
    if state.get("progress") and PROGRESS_FIELD not in row:  # the journal's, when it has one, is newer
        row[PROGRESS_FIELD] = state["progress"]
    info = ParkInfo(
        state["attempts"] or 0,
        state["deferrals"] or 0,
        state["next_try"],
        state["deferred_since"],
        state["error"],
    )
    return ParkedItem(row, key_of(row), info)


def _state(item: ParkedItem, seg: int, order: int, max_parallelism: int) -> dict[str, Any]:
    info = item.info
    return {
        "seg": seg,
        "order": order,
        "key_group": key_group_for(item.key, max_parallelism),
        "attempts": info.attempts,
        "deferrals": info.deferrals,
        "next_try": info.next_try,
        "deferred_since": info.deferred_since,
        "error": info.error,
        "progress": ChainProgress.encoded(item.record.pop(PROGRESS_FIELD, None))
        if isinstance(item.record, dict)
        else None,
    }


class _Intake:
    """The partition as operator chunks: ParkedBatch for parked rows, lists for new ones."""

    def __init__(
        self,
        source: RowSource,
        key_of: Any,
        journal: TaskProgress | None = None,
        keys: set[Any] | None = None,
    ) -> None:
        self.source, self.key_of, self.journal = source, key_of, journal
        self.new = self.replayed = 0
        self.keys = keys  # the new rows' keys, when the driver checks where they ran

    def _note_keys(self, rows: list[dict[str, Any]]) -> None:
        assert self.keys is not None
        try:
            self.keys.update(keys_of_many(self.key_of, rows))
        except RecordKeyError:  # a row without a key (the operator fails or emits it): the rest
            key_of, keys = self.key_of, self.keys
            for row in rows:
                with contextlib.suppress(RecordKeyError):
                    keys.add(key_of(row))

    def chunks(self, batches: Iterator[Any]) -> Iterator[list[Any]]:
        key_of = self.key_of
        for rows in self.source.chunks(batches):
            if self.journal is not None:
                self.journal.load(rows)  # a re-run: resume at the step journaled
            parked: list[ParkedItem] = []
            new: list[dict[str, Any]] = []
            for row in rows:
                state = row.pop(_STATE)
                if state is None:
                    new.append(row)
                else:
                    parked.append(_parked_item(row, state, key_of))
            self.new += len(new)
            self.replayed += len(parked)
            if parked:  # sorted input: a batch's parked rows come before its new ones
                yield ParkedBatch(parked)
            if new:
                if self.keys is not None:
                    self._note_keys(new)
                yield new


_STATE = STATE_COLUMN


def run_parking_partition(plan: Plan, parking: ParkingPlan, iterator: Iterator[Any]) -> Iterator[Any]:
    """mapInArrow body: replay this partition's parked rows, run the new ones until the time cap,
    and emit results (state column null) and the rows parked again (state set), as they come."""
    memory = PeakMemory()
    task = Task(plan)
    source = task.source
    key_of = plan.spec.selector
    assert key_of is not None
    journal = _task_journal(plan, parking, task.adapter.instance)
    intake = _Intake(source, key_of, journal, set() if parking.spread is not None else None)
    cap = task.loop.call_later(parking.time_cap, task.op.hold) if parking.time_cap is not None else None
    parked_out, read_all = 0, False
    try:
        for chunk in task.outputs(intake.chunks(iterator)):
            parked = [item for item in chunk if type(item) is ParkedItem]
            if len(parked) != len(chunk):
                batch = source.assemble([item for item in chunk if type(item) is not ParkedItem])
                task.rows_out += batch.num_rows
                yield batch
            if parked:
                parked_out += len(parked)
                yield _parked_batch(source, parked, parking)
        read_all = True  # its input to the end (a consumer that stopped early leaves it unset)
    finally:
        if cap is not None:
            cap.cancel()
        if journal is not None:
            task.adapter.instance.progress_sink = None
            journal.close_sync()
            task.loop.run_until_complete(journal.aclose())
        task.report()
        if intake.keys is not None:
            parking.spread.add((frozenset(stable_hash(key) for key in intake.keys), frozenset()))
        if parking.counts is not None:
            growth = memory.growth_kib()
            context = TaskContext.get()  # a Spark task's (None elsewhere: nothing to report)
            read = 1 << context.partitionId() if read_all and context is not None else 0
            parking.counts.add([intake.new, intake.replayed, growth, task.rows_out, parked_out, read])


def _task_journal(plan: Plan, parking: ParkingPlan, instance: Any) -> TaskProgress | None:
    """The task's side of the step journal, hooked into the chain (None without one)."""
    if parking.journal is None:
        return None
    columns = [c for c in plan.input_columns if c != STATE_COLUMN]
    journal = parking.journal.for_task(f"{parking.journal_prefix}:{parking.batch_id}", columns)
    instance.progress_sink = journal.write
    return journal


def _parked_batch(source: RowSource, items: list[ParkedItem], parking: ParkingPlan) -> Any:
    seg, groups = parking.batch_id, parking.max_parallelism
    states = [_state(item, seg, source.position(item.record), groups) for item in items]
    return source.assemble([(item.record, []) for item in items], state=states)

"""A task's input rows, held as the Arrow batches they came in until each row's output
leaves (:class:`~.output.RowSource` is one): where a row is, its input columns for the output,
batches compacted once mostly out, and rows handed to the spill."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["HeldRows"]

RETAINED = 16  # input batches held before the mostly-finished ones are compacted


class HeldRows:
    """The input batches of a task's rows still inside, and where each row is."""

    def __init__(self, plan: Any) -> None:
        self.plan = plan
        self._batches: dict[int, pa.RecordBatch] = {}  # held, by number (in input order)
        self._left: dict[int, int] = {}  # rows of each batch not yet out
        self._starts: dict[int, int] = {}  # position of each batch's first row in the task input
        self._kept: dict[int, Any] = {}  # a compacted batch: the rows it still holds (sorted)
        self._rows_in = 0
        self._shrinkable = 0  # batches with at most a quarter of their held rows still live
        self._where: dict[int, int] = {}  # id(row) -> its position in the task input
        self._count = 0

    def _owners(self, positions: Any) -> tuple[list[int], Any, Any]:
        """The held batch numbers, their first positions, and for each of ``positions`` (an
        int64 array) the index of the batch it is in."""
        numbers = list(self._batches)
        starts = np.fromiter((self._starts[n] for n in numbers), dtype=np.int64, count=len(numbers))
        return numbers, starts, np.searchsorted(starts, positions, side="right") - 1

    def _input_arrays(self, positions: list[int]) -> list[pa.Array]:
        out = self.plan.out_schema
        names = self.plan.input_columns
        if not positions:
            return [pa.array([], type=out.field(name).type) for name in names]
        wanted = np.asarray(positions, dtype=np.int64)
        numbers, starts, index = self._owners(wanted)
        rows = wanted - starts[index]  # the row in its batch as it came in
        bases = np.zeros(len(numbers), dtype=np.int64)
        used, base = np.unique(index).tolist(), 0
        for j in used:
            bases[j] = base
            base += self._batches[numbers[j]].num_rows
            kept = self._kept.get(numbers[j])
            if kept is not None:
                mine = index == j
                rows[mine] = np.searchsorted(kept, rows[mine])
        table = pa.Table.from_batches([self._batches[numbers[j]].select(names) for j in used])
        taken = table.take(pa.array(bases[index] + rows))
        arrays = []
        for name in names:
            column = taken.column(name).combine_chunks()
            kind = out.field(name).type
            arrays.append(column if column.type.equals(kind) else column.cast(kind))
        return arrays

    def _row_at(self, position: int) -> dict[str, Any]:
        """The input row at ``position`` (its batch still held), as a dict."""
        numbers, starts, index = self._owners(np.array([position], dtype=np.int64))
        j = int(index[0])
        row = position - int(starts[j])
        kept = self._kept.get(numbers[j])
        if kept is not None:
            row = int(np.searchsorted(kept, row))
        record: dict[str, Any] = self._batches[numbers[j]].slice(row, 1).to_pylist()[0]
        return record

    def _release(self, positions: list[int]) -> None:
        if not positions:
            return
        numbers, _, index = self._owners(np.asarray(positions, dtype=np.int64))
        counts = np.bincount(index, minlength=len(numbers))
        left = self._left
        for j in np.flatnonzero(counts).tolist():
            number = numbers[j]
            before = left[number]
            left[number] = now = before - int(counts[j])
            if not now:
                del left[number]
                del self._batches[number]
                del self._starts[number]
                self._kept.pop(number, None)
            elif now * 4 <= self._batches[number].num_rows < before * 4:
                self._shrinkable += 1  # it just fell to a quarter of what it holds

    def compact_if_worth(self) -> None:
        """Compact when many batches are held and some hold mostly rows that left: a task whose
        batches are all mostly live (a hot key's rows coming back one at a time) never pays
        for a compaction that frees nothing."""
        if self._shrinkable and len(self._batches) > RETAINED:
            self._compact()

    def _compact(self) -> None:
        """Keep only the live rows of batches that are mostly out: a few slow rows must not
        hold many whole Arrow batches (memory stays bounded by capacity, not by batch size)."""
        self._shrinkable = 0
        live = np.fromiter(self._where.values(), dtype=np.int64, count=len(self._where))
        numbers, starts, index = self._owners(live)
        counts = np.bincount(index, minlength=len(numbers))
        for j, number in enumerate(numbers):
            batch = self._batches[number]
            if counts[j] * 4 > batch.num_rows or number == self._count - 1:
                continue
            rows = np.sort(live[index == j] - starts[j])  # as the batch came in
            kept = self._kept.get(number)
            held = rows if kept is None else np.searchsorted(kept, rows)
            self._batches[number] = batch.take(pa.array(held))
            self._kept[number] = rows

    def position(self, record: dict[str, Any]) -> int:
        """A row's position in the task's input (orders parked rows of a key)."""
        return self._where[id(record)]

    def take_rows(self, records: Sequence[dict[str, Any]]) -> pa.RecordBatch:
        """The input rows of ``records``, in that order, as one batch of the input columns;
        the rows leave this source (as if output): it holds nothing of them any more. Read the
        batch back with :meth:`read` for the same records."""
        where = self._where
        positions = [where.pop(id(record)) for record in records]
        names = list(self.plan.input_columns)
        # the input's own schema (a column's NOT NULL kept), so the batch read back joins the
        # input batches it came from in one table
        schema = next(iter(self._batches.values())).select(names).schema
        batch = pa.RecordBatch.from_arrays(self._input_arrays(positions), schema=schema)
        self._release(positions)
        return batch

"""Rows in, Arrow batches out, for one task (pyarrow only; no pyspark).

:class:`RowSource` turns a task's Arrow batches into the row dicts the operator runs, and
remembers where each row came from. :meth:`RowSource.assemble` builds the output batch: the
input columns are taken from the input batches as they were (so they come back unchanged,
whatever the function did to its dict), the result columns are built from the results, each
value checked against its column (see :mod:`keyed_async_wait.spark.values`).

Invariant: every row dict handed to the operator is known here until it is assembled into an
output (or left parked); a batch is released once every one of its rows has left.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import repeat
from typing import Any

import pyarrow as pa

from ..core.elements import FailedRecord
from ..core.exceptions import KeyedAsyncWaitError
from .values import ValueMismatch, column_converter, row_fixer, sort_key

__all__ = ["ResultSchemaError", "RowSource", "key_text"]

_RETAINED = 16  # input batches held before the mostly-finished ones are compacted

ERROR_FIELDS = ("error_type", "error_message", "attempts")


class ResultSchemaError(KeyedAsyncWaitError, TypeError):
    """A result does not fit the declared output schema; names the column and the key."""


def key_text(plan: Any, record: dict[str, Any]) -> str:
    """The record's key, for messages (the key columns, else the first input columns)."""
    key = plan.settings.key
    if isinstance(key, str):
        return repr(record.get(key))
    if isinstance(key, (list, tuple)) and all(isinstance(k, str) for k in key):
        return repr(tuple(record.get(k) for k in key))
    return repr({c: record.get(c) for c in plan.input_columns[:3]})


class RowSource:
    """The task's input rows, and the output batches assembled for them."""

    def __init__(self, plan: Any) -> None:
        self.plan = plan
        self._batches: dict[int, pa.RecordBatch] = {}
        self._left: dict[int, int] = {}  # rows of each batch not yet out
        self._offsets: dict[int, int] = {}  # position of each batch's first row in the task input
        self._rows_in = 0
        self._where: dict[int, tuple[int, int]] = {}  # id(row) -> (batch number, row in batch)
        self._count = 0
        self._positions: dict[int, int] = {}  # id(row) -> input position, for rows compacted
        self._fix: Any = None
        self._fixed_for: pa.Schema | None = None
        out = plan.out_schema
        self._results = [(name, out.field(name).type) for name in plan.result_columns]
        self._convert = {name: column_converter(kind, plan.session_tz) for name, kind in self._results}
        self._allowed = frozenset(plan.result_columns)

    # ------------------------------------------------------------------ in

    def _rows(self, batch: pa.RecordBatch) -> list[dict[str, Any]]:
        if self._fixed_for is None or not batch.schema.equals(self._fixed_for):
            self._fix, self._fixed_for = row_fixer(batch.schema), batch.schema
        rows: list[dict[str, Any]] = batch.to_pylist()
        if self._fix is not None:
            rows = self._fix(rows)
        number = self._count
        self._count += 1
        self._batches[number] = batch
        self._left[number] = len(rows)
        self._offsets[number] = self._rows_in
        self._rows_in += len(rows)
        if len(self._batches) > _RETAINED:
            self._compact()
        self._where.update(zip(map(id, rows), zip(repeat(number), range(len(rows))), strict=True))
        return rows

    def chunks(
        self, batches: Iterable[pa.RecordBatch], sort_by: Sequence[str] | None = None
    ) -> Iterator[list[Any]]:
        """Row dicts, a list per input batch; with ``sort_by`` all of them first, sorted as
        Spark's ascending sort (NULL first, NaN last), in chunks of 10,000."""
        if not sort_by:
            for batch in batches:
                yield self._rows(batch)
            return
        rows = [row for batch in batches for row in self._rows(batch)]
        rows.sort(key=sort_key(sort_by))
        for i in range(0, len(rows), 10_000):
            yield rows[i : i + 10_000]

    # ------------------------------------------------------------------ out

    def assemble(self, chunk: Sequence[Any], state: Sequence[Any] | None = None) -> pa.RecordBatch:
        """The output batch for an operator chunk (``(record, results)`` pairs and
        FailedRecords). ``state``: one value per item of the state column (parking plans)."""
        left, error_column = self.plan.join == "left", self.plan.error_column
        positions: list[tuple[int, int]] = []
        results: list[Any] = []
        errors: list[Any] = []
        states: list[Any] = []
        where, done = self._where, []
        allowed = self._allowed
        for n, item in enumerate(chunk):
            extra = state[n] if state is not None else None
            if extra is None and type(item) is tuple and not self._positions:
                # the common output: one result, a dict of exactly the result columns
                record, found = item
                if len(found) == 1 and type(result := found[0]) is dict and result.keys() == allowed:
                    position = where.pop(id(record))
                    done.append(position[0])
                    positions.append(position)
                    results.append(result)
                    errors.append(None)
                    states.append(None)
                    continue
            if isinstance(item, FailedRecord):
                position = where.pop(id(item.record))
                if self._positions:
                    self._positions.pop(id(item.record), None)
                done.append(position[0])
                positions.append(position)
                results.append(None)
                errors.append(
                    {
                        "error_type": item.error_type,
                        "error_message": item.error_message,
                        "attempts": item.attempts,
                    }
                )
                states.append(extra)
                continue
            record, found = item
            position = where.pop(id(record))
            if self._positions:
                self._positions.pop(id(record), None)
            done.append(position[0])
            if not found:
                if left or extra is not None:
                    positions.append(position)
                    results.append(None)
                    errors.append(None)
                    states.append(extra)
                continue
            self._check_keys(found, record)
            for result in found:
                positions.append(position)
                results.append(result)
                errors.append(None)
                states.append(extra)
        arrays = self._input_arrays(positions)
        arrays += self._result_arrays(results, positions)
        out = self.plan.out_schema
        if error_column is not None:
            arrays.append(pa.array(errors, type=out.field(error_column).type))
        for field in self.plan.passthrough:
            arrays.append(
                pa.array(states if state is not None else [None] * len(positions), type=out.field(field).type)
            )
        self._release(done)
        return pa.RecordBatch.from_arrays(arrays, schema=out)

    def _check_keys(self, found: list[Any], record: dict[str, Any]) -> None:
        allowed = self._allowed
        for result in found:
            if not isinstance(result, dict):
                raise ResultSchemaError(
                    f"a result must be a dict of the result columns {self.plan.result_columns}, got "
                    f"{type(result).__name__} {result!r:.100} for the record with key "
                    f"{key_text(self.plan, record)}"
                )
            keys = result.keys()
            if keys == allowed:
                continue
            extra = sorted(set(keys) - allowed)
            if extra:
                raise ResultSchemaError(
                    f"result column {extra[0]!r} is not in the output schema (result columns: "
                    f"{self.plan.result_columns}) for the record with key {key_text(self.plan, record)}"
                )
            missing = [c for c in self.plan.result_columns if c not in keys]
            raise ResultSchemaError(
                f"result column {missing[0]!r} is missing from the result for the record with key "
                f"{key_text(self.plan, record)} (give None for a null value; a miss is no result at all)"
            )

    def _input_arrays(self, positions: list[tuple[int, int]]) -> list[pa.Array]:
        out = self.plan.out_schema
        names = self.plan.input_columns
        if not positions:
            return [pa.array([], type=out.field(name).type) for name in names]
        numbers = sorted({number for number, _ in positions})
        offsets, base = {}, 0
        for number in numbers:
            offsets[number] = base
            base += self._batches[number].num_rows
        table = pa.Table.from_batches([self._batches[n].select(names) for n in numbers])
        taken = table.take(pa.array([offsets[number] + row for number, row in positions], type=pa.int64()))
        arrays = []
        for name in names:
            column = taken.column(name).combine_chunks()
            wanted = out.field(name).type
            arrays.append(column if column.type.equals(wanted) else column.cast(wanted))
        return arrays

    def _result_arrays(self, results: list[Any], positions: list[tuple[int, int]]) -> list[pa.Array]:
        arrays = []
        for name, kind in self._results:
            values = [None if r is None else r[name] for r in results]
            try:
                self._convert[name](values)
                arrays.append(pa.array(values, type=kind))
            except ValueMismatch as why:
                index = why.index  # type: ignore[attr-defined]
                raise self._mismatch(name, kind, results[index][name], why, positions[index]) from None
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as exc:
                raise ResultSchemaError(f"result column {name!r} ({kind}): {exc}") from exc
        return arrays

    def _mismatch(
        self, name: str, kind: pa.DataType, value: Any, why: Exception, position: tuple[int, int]
    ) -> ResultSchemaError:
        number, row = position
        record = self._batches[number].slice(row, 1).to_pylist()[0]
        return ResultSchemaError(
            f"result column {name!r} ({kind}) cannot hold {value!r:.100} for the record with key "
            f"{key_text(self.plan, record)}: {why}"
        )

    def _release(self, numbers: list[int]) -> None:
        left = self._left
        for number in numbers:
            left[number] -= 1
            if not left[number]:
                del left[number]
                del self._batches[number]
                del self._offsets[number]

    def _compact(self) -> None:
        """Keep only the live rows of batches that are mostly out: a few slow rows must not
        hold many whole Arrow batches (memory stays bounded by capacity, not by batch size)."""
        live: dict[int, list[tuple[int, int]]] = {}
        for ident, (number, row) in self._where.items():
            live.setdefault(number, []).append((row, ident))
        for number, rows in live.items():
            batch = self._batches[number]
            if len(rows) * 4 > batch.num_rows or number == self._count - 1:
                continue
            rows.sort()
            self._batches[number] = batch.take(pa.array([row for row, _ in rows], type=pa.int64()))
            base = self._offsets[number]
            for i, (row, ident) in enumerate(rows):
                self._positions.setdefault(ident, base + row)  # where it was in the input
                self._where[ident] = (number, i)

    def position(self, record: dict[str, Any]) -> int:
        """A row's position in the task's input (orders parked rows of a key)."""
        moved = self._positions.get(id(record))
        if moved is not None:
            return moved
        number, row = self._where[id(record)]
        return self._offsets[number] + row

    def record_position(self, record: dict[str, Any]) -> tuple[int, int]:
        """Where a row dict came from (it stays known)."""
        return self._where[id(record)]

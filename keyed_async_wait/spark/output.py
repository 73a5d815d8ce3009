"""Rows in, Arrow batches out, for one task (pyarrow only; no pyspark).

:class:`RowSource` turns a task's Arrow batches into the row dicts the operator runs, and
remembers where each row came from. :meth:`RowSource.assemble` builds the output batch: the
input columns are taken from the input batches as they were (so they come back unchanged,
whatever the function did to its dict), the result columns are built from the results, each
value checked against its column (see :mod:`keyed_async_wait.spark.values`).

Invariant: every row dict handed to the operator is known here, by its position in the task's
input, until it is assembled into an output (or left parked); a batch is released once every one
of its rows has left. A row is found from its position alone: batches are held in input order,
each with the position of its first row, and a compacted batch keeps the (sorted) input rows it
still holds. Positions are plain ints, looked up for a whole output batch at once with numpy:
per row the source keeps one dict item and allocates no container.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator, Sequence
from itertools import repeat
from typing import Any

import pyarrow as pa

from ..core.elements import FailedRecord
from ..core.exceptions import ResultSchemaError
from .held_rows import HeldRows
from .values import ValueMismatch, column_converter, row_fixer, sort_key

__all__ = ["ResultSchemaError", "RowSource", "key_text"]

ERROR_FIELDS = ("error_type", "error_message", "attempts")


def key_text(plan: Any, record: dict[str, Any]) -> str:
    """The record's key, for messages (the key columns, else the first input columns)."""
    fields = plan.spec.key_fields
    if fields is not None and len(fields) == 1:
        return repr(record.get(fields[0]))
    if fields is not None:
        return repr(tuple(record.get(k) for k in fields))
    return repr({c: record.get(c) for c in plan.input_columns[:3]})


class RowSource(HeldRows):
    """The task's input rows, and the output batches assembled for them."""

    def __init__(self, plan: Any) -> None:
        super().__init__(plan)
        self._fix: Any = None
        self._fixed_for: pa.Schema | None = None
        out = plan.out_schema
        self._results = [(name, out.field(name).type) for name in plan.result_columns]
        self._convert = {name: column_converter(kind, plan.session_tz) for name, kind in self._results}
        self._allowed = frozenset(plan.result_columns)

    # ------------------------------------------------------------------ in
    def read(self, batch: pa.RecordBatch) -> list[dict[str, Any]]:
        """The row dicts of ``batch``, known here until they leave (see :meth:`chunks`)."""
        if self._fixed_for is None or not batch.schema.equals(self._fixed_for):
            self._fix, self._fixed_for = row_fixer(batch.schema), batch.schema
        rows: list[dict[str, Any]] = batch.to_pylist()
        if self._fix is not None:
            rows = self._fix(rows)
        number, start = self._count, self._rows_in
        self._count += 1
        self._batches[number] = batch
        self._left[number] = len(rows)
        self._starts[number] = start
        self._rows_in += len(rows)
        self.compact_if_worth()
        self._where.update(zip(map(id, rows), range(start, self._rows_in), strict=True))
        return rows

    def chunks(
        self, batches: Iterable[pa.RecordBatch], sort_by: Sequence[str] | None = None
    ) -> Iterator[list[Any]]:
        """Row dicts, a list per input batch; with ``sort_by`` all of them first, sorted as
        Spark's ascending sort (NULL first, NaN last), in chunks of 10,000."""
        if not sort_by:
            for batch in batches:
                yield self.read(batch)
            return
        rows = [row for batch in batches for row in self.read(batch)]
        rows.sort(key=sort_key(sort_by))
        for i in range(0, len(rows), 10_000):
            yield rows[i : i + 10_000]

    # ------------------------------------------------------------------ out

    def assemble(self, chunk: Sequence[Any], state: Sequence[Any] | None = None) -> pa.RecordBatch:
        """The output batch for an operator chunk (``(record, results)`` pairs and
        FailedRecords). ``state``: one value per item of the state column (parking plans).

        A result that does not fit fails the task, or is that record's error with an error column."""
        if self.plan.error_column is None:
            return self._assemble(chunk, state)
        ids = {id(x.record if type(x) is FailedRecord else x[0]) for x in chunk}
        positions = {i: self._where[i] for i in ids}
        try:
            return self._assemble(chunk, state)
        except ResultSchemaError:
            self._where.update(positions)  # nothing was released: the rows are all still held
            return self._assemble([_misfit_failed(self, item) for item in chunk], state)

    def _assemble(self, chunk: Sequence[Any], state: Sequence[Any] | None) -> pa.RecordBatch:
        plain = self._plain(chunk) if state is None else None
        if plain is not None:
            return self._batch(plain[0], plain[1], None, None, plain[0])
        left = self.plan.join == "left"
        positions: list[int] = []  # the input row of each output row
        done: list[int] | None = None  # the rows that left, once rows and outputs differ
        results: list[Any] = []
        errors: list[Any] = []
        states: list[Any] = []
        where = self._where
        allowed = self._allowed
        for n, item in enumerate(chunk):
            extra = state[n] if state is not None else None
            if extra is None and type(item) is tuple:
                # the common output: one result, a dict of exactly the result columns
                record, found = item
                if len(found) == 1 and type(result := found[0]) is dict and result.keys() == allowed:
                    position = where.pop(id(record))
                    if done is not None:
                        done.append(position)
                    positions.append(position)
                    results.append(result)
                    errors.append(None)
                    states.append(None)
                    continue
            if done is None:
                done = positions.copy()
            if isinstance(item, FailedRecord):
                position = where.pop(id(item.record))
                done.append(position)
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
            done.append(position)
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
        return self._batch(
            positions,
            results,
            errors,
            states if state is not None else None,
            positions if done is None else done,
        )

    def _plain(self, chunk: Sequence[Any]) -> tuple[list[int], list[Any]] | None:
        """The common chunk, checked in a few passes in C: every item a ``(record, [result])``
        pair whose one result is a dict of exactly the result columns. (positions, results),
        or None: then :meth:`assemble` goes item by item (and names what is wrong)."""
        try:
            records, founds = zip(*chunk, strict=True)
        except (TypeError, ValueError):  # empty, a FailedRecord, or not pairs
            return None
        if set(map(len, founds)) != {1}:
            return None
        results = [found[0] for found in founds]
        if set(map(type, results)) != {dict} or sum(map(len, results)) != len(results) * len(self._allowed):
            return None
        # as many keys as result columns, and every column among them: exactly the columns
        for name in self._allowed:
            if not all(map(operator.contains, results, repeat(name))):
                return None
        return list(map(self._where.pop, map(id, records))), results

    def _batch(
        self,
        positions: list[int],
        results: list[Any],
        errors: list[Any] | None,
        states: list[Any] | None,
        done: list[int],
    ) -> pa.RecordBatch:
        """The output batch: input columns at ``positions``, then results, errors, state."""
        arrays = self._input_arrays(positions)
        arrays += self._result_arrays(results, positions)
        out = self.plan.out_schema
        error_column = self.plan.error_column
        if error_column is not None:
            kind = out.field(error_column).type
            arrays.append(pa.nulls(len(positions), kind) if errors is None else pa.array(errors, type=kind))
        for field in self.plan.passthrough:
            kind = out.field(field).type
            arrays.append(pa.nulls(len(positions), kind) if states is None else pa.array(states, type=kind))
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

    def _result_arrays(self, results: list[Any], positions: list[int]) -> list[pa.Array]:
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
        self, name: str, kind: pa.DataType, value: Any, why: Exception, position: int
    ) -> ResultSchemaError:
        return ResultSchemaError(
            f"result column {name!r} ({kind}) cannot hold {value!r:.100} for the record with key "
            f"{key_text(self.plan, self._row_at(position))}: {why}"
        )


def _misfit_failed(source: RowSource, item: Any) -> Any:
    """``item``, or a FailedRecord when one of its results does not fit the schema."""
    if isinstance(item, FailedRecord):
        return item
    record, found = item
    try:
        source._check_keys(found, record)
        for result in found:
            for name, kind in source._results:
                try:
                    source._convert[name]([result[name]])
                except ValueMismatch as why:
                    position = source._where[id(record)]
                    raise source._mismatch(name, kind, result[name], why, position) from None
    except ResultSchemaError as misfit:
        return FailedRecord(record, None, type(misfit).__name__, str(misfit), 1, misfit)
    return item

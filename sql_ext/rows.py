"""The table function's output rows from the operator's outputs: the table's columns, the
result columns converted to their Spark types, and with ``error_column`` the error of a record
that failed (the operator's ``FailedRecord``) or whose result does not fit its columns.

Without ``error_column`` a result that does not fit fails the task with a
:class:`ResultSchemaError` naming the source, the column and the record; with it, that row
keeps its input with NULL results and the error, and the other rows are untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from keyed_async_wait.core.elements import FailedRecord
from keyed_async_wait.spark.output import ResultSchemaError
from keyed_async_wait.spark.values import ValueMismatch

__all__ = ["OutputRows"]

Error = tuple[str, str, int]  # the error struct: type, message, attempts
Row = tuple[Any, "dict[str, Any] | None", "Error | None"]


class OutputRows:
    """Turns a chunk of outputs into rows for one source (see the module)."""

    def __init__(
        self,
        source: str,
        columns: Sequence[str],
        results: Sequence[str],
        inputs: Sequence[str],
        convert: dict[str, Callable[[list[Any]], list[Any]]],
        *,
        left: bool,
        error_column: str | None,
    ) -> None:
        self.source, self.columns, self.results, self.inputs = source, tuple(columns), tuple(results), inputs
        self.convert, self.left, self.errors = convert, left, error_column is not None
        self._allowed = set(results)

    def rows(self, outputs: list[Any]) -> Iterator[tuple[Any, ...]]:
        rows: list[Row] = []
        for item in outputs:
            if isinstance(item, FailedRecord):
                rows.append((item.record, None, (item.error_type, item.error_message, item.attempts)))
                continue
            record, results = item
            if not results:
                if self.left:
                    rows.append((record, None, None))
                continue
            rows += [self._fitting(record, result) for result in results]
        values = self._converted(rows)
        for i, (record, _, error) in enumerate(rows):
            row = tuple(record[c] for c in self.columns) + tuple(values[name][i] for name in self.results)
            yield (*row, error) if self.errors else row

    def _fitting(self, record: Any, result: Any) -> Row:
        if isinstance(result, dict) and result.keys() == self._allowed:
            return (record, result, None)
        error = ResultSchemaError(
            f"async_lookup({self.source}): result {result!r:.100} is not a dict of exactly the result "
            f"columns {list(self.results)} for the record with lookup fields {self._named(record)!r}"
        )
        return self._failed(record, error)

    def _converted(self, rows: list[Row]) -> dict[str, list[Any]]:
        """Each result column in its Spark type; a value that does not fit fails its row (or,
        without an error column, the task). At most one pass per row that fails."""
        for _ in range(len(rows) + 1):
            try:
                return {name: self._column(name, rows) for name in self.results}
            except _Misfit as misfit:
                rows[misfit.index] = self._failed(rows[misfit.index][0], misfit.error)
        raise AssertionError("unreachable: every pass fails one more row")

    def _column(self, name: str, rows: list[Row]) -> list[Any]:
        values = [None if result is None else result[name] for _, result, _ in rows]
        try:
            return self.convert[name](values)
        except ValueMismatch as why:
            index: int = why.index  # type: ignore[attr-defined]
            record, result, _ = rows[index]
            error = ResultSchemaError(
                f"async_lookup({self.source}): result column {name!r} cannot hold "
                f"{result[name] if result else None!r:.100} for the record with lookup fields "
                f"{self._named(record)!r}: {why}"
            )
            raise _Misfit(index, error) from None

    def _failed(self, record: Any, error: ResultSchemaError) -> Row:
        if not self.errors:
            raise error
        return (record, None, (type(error).__name__, str(error), 1))

    def _named(self, record: Any) -> dict[str, Any]:
        return {n: record.get(n) for n in self.inputs}


class _Misfit(Exception):
    def __init__(self, index: int, error: ResultSchemaError) -> None:
        super().__init__(str(error))
        self.index, self.error = index, error

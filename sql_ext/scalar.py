"""The scalar form: ``SELECT o.*, users(o.user_id) AS u FROM orders o``.

One Arrow iterator UDF per source. Its arguments are the source's input fields, in order; it
returns the first result as a struct (NULL for a miss or a NULL argument), in input order:
the results are positional, so this form is always ORDERED, whatever output-mode says.
Records of later Arrow batches start while earlier ones are in flight.

With ``error_field`` (chosen in Python, at registration) the struct has one more field, the
error struct (``error_type``, ``error_message``, ``attempts``): a row whose lookup failed
(retries spent, time out) or whose result does not fit the struct gets NULL results and its
error there, and the query goes on. Without it such a row fails the query, naming the source,
the record and, for a misfit, the column.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from keyed_async_wait.core.elements import FailedRecord, OutputMode
from keyed_async_wait.core.exceptions import ConfigError
from keyed_async_wait.spark import compat
from keyed_async_wait.spark.compat import arrow_scalar_udf
from keyed_async_wait.spark.options import ERROR_STRUCT
from keyed_async_wait.spark.output import ResultSchemaError
from keyed_async_wait.spark.runner import outputs
from keyed_async_wait.spark.values import ValueMismatch, column_converter, python_rows

from .runtime import task_plan, task_time_zone, task_view
from .sources import LookupSource

__all__ = ["scalar_function"]

log = logging.getLogger(__name__)


def scalar_function(source: LookupSource, time_zone: str, error_field: str | None = None) -> Any:
    """The UDF to register under ``source.name`` (``time_zone``: the session's, at install;
    ``error_field``: see the module)."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        return _lookup_batches(source, time_zone, error_field, batches)

    udf = arrow_scalar_udf(run, return_type(source, error_field), len(source.inputs))
    return udf.asNondeterministic()  # a lookup's answer may change: never fold or reorder calls


def return_type(source: LookupSource, error_field: str | None) -> Any:
    """The struct the function returns: the result columns, and the error field if any."""
    if error_field is None:
        return source.result_schema
    from pyspark.sql.types import StructField, StructType

    return StructType([*source.result_schema.fields, StructField(error_field, ERROR_STRUCT, True)])


def _records(source: LookupSource, batches: Iterator[Any]) -> Iterator[list[dict[str, Any]]]:
    import pyarrow as pa

    inputs = source.inputs
    for arrays in batches:
        if not isinstance(arrays, tuple):
            arrays = (arrays,)
        if len(arrays) != len(inputs):
            allowed = f"{len(inputs)}: {', '.join(inputs)}, in that order"
            raise ConfigError(f"{source.name}() arguments", len(arrays), allowed)
        yield python_rows(pa.RecordBatch.from_arrays(list(arrays), names=list(inputs)))


def _lookup_batches(
    source: LookupSource, time_zone: str, error_field: str | None, batches: Iterator[Any]
) -> Iterator[Any]:
    import pyarrow as pa

    view = task_view(source)  # a bad setting fails here, before any lookup
    zone = task_time_zone(time_zone)
    arrow_type = compat.arrow_type(return_type(source, error_field), zone)
    convert = column_converter(arrow_type, zone)
    # with an error field, a failure is a value (the plan's error column, by that name)
    plan, adapter = task_plan(source, view, OutputMode.ORDERED, session_tz=zone, error_column=error_field)
    log.info("%s(): ORDERED (the scalar form returns results in input order)", source.name)
    values = _Values(source, error_field)
    for chunk in outputs(plan, adapter, _records(source, batches)):
        yield pa.array(values.converted(chunk, convert), type=arrow_type)


class _Values:
    """A chunk's struct values: the first result of each record, or its error (see the module)."""

    def __init__(self, source: LookupSource, error_field: str | None) -> None:
        self.source, self.error_field = source, error_field

    def converted(self, chunk: list[Any], convert: Any) -> list[Any]:
        values = [self._value(item) for item in chunk]
        for _ in range(len(values) + 1):  # each pass turns one more misfit into its error
            try:
                return list(convert(values))
            except ValueMismatch as why:
                index: int = why.index  # type: ignore[attr-defined]
                values[index] = self._error(self._misfit(chunk[index], why))
        raise AssertionError("unreachable: every pass fails one more value")

    def _value(self, item: Any) -> Any:
        if isinstance(item, FailedRecord):  # only with an error field (the operator emits failures)
            return self._error((item.error_type, item.error_message, item.attempts))
        results = item[1]
        if not results:
            return None
        if self.error_field is None:
            return results[0]
        first = results[0]
        if not isinstance(first, dict):
            return first  # not a dict: the conversion names it
        if self.error_field in first:  # it would pass for an error: never taken as one
            why = ValueMismatch(f"field {self.error_field!r} is the error field, not a result column")
            return self._error(self._misfit(item, why))
        return {**first, self.error_field: None}

    def _misfit(self, item: Any, why: ValueMismatch) -> tuple[str, str, int]:
        record, results = item
        key = {name: record.get(name) for name in self.source.inputs}
        error = ResultSchemaError(
            f"{self.source.name}(): the result {results[0]!r:.100} does not fit "
            f"{self.source.schema_ddl!r} for the lookup of {key!r}: {why}"
        )
        if self.error_field is None:
            raise error from None
        return (type(error).__name__, str(error), 1)

    def _error(self, error: tuple[str, str, int]) -> dict[str, Any]:
        assert self.error_field is not None
        empty: dict[str, Any] = dict.fromkeys(self.source.result_columns)
        kind, message, attempts = error
        empty[self.error_field] = {"error_type": kind, "error_message": message, "attempts": attempts}
        return empty

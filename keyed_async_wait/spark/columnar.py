"""The backlog gear's columnar path for read-only lookups (no pyspark here).

In the backlog gear a lookup's answers are taken as fixed for the run (its memo), so a record's
result depends only on its lookup key, not on when it runs. The task then works on whole Arrow
batches: the distinct lookup keys of a batch, one set of batch calls for those the memo lacks,
and the result columns built by key; the rows leave in input order, so every per-key order (and
the ORDERED order) holds, and the output is the one the record path gives. Only rows' lookup
fields are turned into Python objects.

Anything this path does not cover (a failed call, a row without a lookup key, an error column,
results that do not fit the schema) hands the rest of the task, from the current batch on, to
the record path, which retries, times out and reports per record; rows already emitted are all
earlier in the input, so order still holds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

from .values import ValueMismatch, column_converter

__all__ = ["ColumnarRun", "supports_columnar"]

log = logging.getLogger(__name__)

CHUNK = 2_000  # keys per batch call


class _Fallback(Exception):
    """This batch needs the record path."""


def supports_columnar(plan: Any, adapter: Any) -> bool:
    """Whether a task may run column-wise: its backend has a columnar form (the backend
    protocol's ``columnar()``), and its rows need no error column and no sort in the task."""
    return adapter.columnar is not None and plan.error_column is None and not plan.sort_by


class ColumnarRun:
    """Enrich Arrow batches until one needs the record path; that one is left in ``pending``."""

    def __init__(self, plan: Any, columnar: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.plan, self.columnar, self.loop = plan, columnar, loop
        self.pending: Any = None
        self.records = 0
        self.rows_out = 0

    def batches(self, batches: Iterator[Any]) -> Iterator[Any]:
        for batch in batches:
            try:
                out = _enrich(self.plan, self.columnar, self.loop, batch)
            except _Fallback as why:
                log.info("async wait task: the record path takes over from the columnar one: %s", why)
                self.pending = batch
                return
            self.records += batch.num_rows
            self.rows_out += out.num_rows
            yield out


def _enrich(plan: Any, columnar: Any, loop: asyncio.AbstractEventLoop, batch: Any) -> Any:
    import pyarrow as pa

    if batch.num_rows == 0:
        return pa.RecordBatch.from_pylist([], schema=plan.out_schema)
    try:
        keys = columnar.column_keys(batch)
    except Exception as exc:
        raise _Fallback(f"a row without a lookup key ({type(exc).__name__})") from exc
    distinct = list(dict.fromkeys(keys))
    fetch = columnar.results_for_keys(distinct, CHUNK)
    timeout = plan.spec.timeout
    try:
        answers = loop.run_until_complete(asyncio.wait_for(fetch, timeout) if timeout else fetch)
    except Exception as exc:
        raise _Fallback(f"{type(exc).__name__}: {exc}") from exc
    found: list[Any] = []
    for key, answer in zip(distinct, answers, strict=True):
        if isinstance(answer, BaseException) or len(answer) > 1:
            raise _Fallback(f"lookup key {key!r}: {answer!r:.100}")
        found.append(answer[0] if answer else None)
    allowed = set(plan.result_columns)
    for result in found:
        if result is not None and (not isinstance(result, dict) or result.keys() != allowed):
            raise _Fallback("a result that is not a dict of exactly the result columns")
    # checked per distinct key, then spread over the rows by position
    index = {key: i for i, key in enumerate(distinct)}
    rows = pa.array([index[key] for key in keys], type=pa.int64())
    missed = [result is None for result in found]
    columns = [_cast(batch.column(name), plan.out_schema.field(name).type) for name in plan.input_columns]
    try:
        for name in plan.result_columns:
            kind = plan.out_schema.field(name).type
            values = column_converter(kind, plan.session_tz)([None if r is None else r[name] for r in found])
            columns.append(pa.array(values, type=kind).take(rows))
    except (ValueMismatch, pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as exc:
        raise _Fallback(f"results do not fit the schema ({exc})") from exc
    out = pa.RecordBatch.from_arrays(columns, schema=plan.out_schema)
    if plan.join == "inner":
        out = out.filter(pa.array([not m for m in missed], type=pa.bool_()).take(rows))
    return out


def _cast(column: Any, kind: Any) -> Any:
    return column if column.type.equals(kind) else column.cast(kind)

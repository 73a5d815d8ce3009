"""The scalar form: ``SELECT o.*, users(o.user_id) AS u FROM orders o``.

One Arrow iterator UDF per source. Its arguments are the source's input fields, in order; it
returns the first result as a struct (NULL for a miss or a NULL argument), in input order:
the results are positional, so this form is always ORDERED, whatever output-mode says.
Records of later Arrow batches start while earlier ones are in flight.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from keyed_async_wait.core.elements import OutputMode
from keyed_async_wait.core.exceptions import ConfigError
from keyed_async_wait.runtime.operator import KeyedAsyncWaitOperator
from keyed_async_wait.spark import compat
from keyed_async_wait.spark.compat import arrow_scalar_udf
from keyed_async_wait.spark.output import ResultSchemaError
from keyed_async_wait.spark.values import ValueMismatch, column_converter, python_rows
from keyed_async_wait.spark.worker import drive, worker_loop

from .runtime import source_adapter, task_conf, task_time_zone
from .sources import LookupSource

__all__ = ["scalar_function"]

log = logging.getLogger(__name__)


def scalar_function(source: LookupSource, time_zone: str) -> Any:
    """The UDF to register under ``source.name`` (``time_zone``: the session's, at install)."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        return _lookup_batches(source, time_zone, batches)

    udf = arrow_scalar_udf(run, source.result_schema, len(source.inputs))
    return udf.asNondeterministic()  # a lookup's answer may change: never fold or reorder calls


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


def _lookup_batches(source: LookupSource, time_zone: str, batches: Iterator[Any]) -> Iterator[Any]:
    import pyarrow as pa

    conf = task_conf()  # a bad setting fails here, before any lookup
    zone = task_time_zone(time_zone)
    arrow_type = compat.arrow_type(source.result_schema, zone)
    convert = column_converter(arrow_type, zone)
    loop = worker_loop().loop
    settings = conf.operator_settings(OutputMode.ORDERED, output="pairs")
    op = KeyedAsyncWaitOperator.from_settings(source_adapter(source, conf), settings)
    log.info("%s(): ORDERED (the scalar form returns results in input order)", source.name)
    with contextlib.closing(drive(loop, op.process_batches(_records(source, batches)))) as produced:
        for chunk in produced:
            values = [results[0] if results else None for _, results in chunk]
            try:
                yield pa.array(convert(values), type=arrow_type)
            except ValueMismatch as why:
                record, results = chunk[why.index]  # type: ignore[attr-defined]
                key = {name: record.get(name) for name in source.inputs}
                raise ResultSchemaError(
                    f"{source.name}(): the result {results[0]!r:.100} does not fit {source.schema_ddl!r} "
                    f"for the lookup of {key!r}: {why}"
                ) from None

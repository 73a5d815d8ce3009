"""The scalar form: ``SELECT o.*, users(o.user_id) AS u FROM orders o``.

One Arrow iterator UDF per source. Its arguments are the source's input fields, in order; it
returns the first result as a struct (NULL for a miss or a NULL argument), in input order:
the results are positional, so this form is always ORDERED, whatever output-mode says.
Records of later Arrow batches start while earlier ones are in flight.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from keyed_async_wait.elements import OutputMode
from keyed_async_wait.exceptions import ConfigError
from keyed_async_wait.operator import KeyedAsyncWaitOperator
from keyed_async_wait.spark_worker import ResultSchemaError, drive, worker_loop

from .runtime import log, source_adapter, task_conf
from .sources import LookupSource

__all__ = ["scalar_function"]


def scalar_function(source: LookupSource) -> Any:
    """The UDF to register under ``source.name``."""
    import pyarrow as pa
    from pyspark.sql.pandas.functions import arrow_udf
    from pyspark.sql.pandas.types import to_arrow_type

    struct = source.result_schema
    arrow_type = to_arrow_type(struct)

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        return _lookup_batches(source, arrow_type, batches)

    # Spark picks the iterator form from the hints (naming the type instead is deprecated)
    arguments = Iterator[tuple[pa.Array, ...]] if len(source.inputs) > 1 else Iterator[pa.Array]
    run.__annotations__ = {"batches": arguments, "return": Iterator[pa.Array]}
    udf = arrow_udf(run, struct)  # type: ignore[call-overload]
    return udf.asNondeterministic()  # a lookup's answer may change: never fold or reorder calls


def _records(source: LookupSource, batches: Iterator[Any]) -> Iterator[list[dict[str, Any]]]:
    inputs = source.inputs
    for arrays in batches:
        if not isinstance(arrays, tuple):
            arrays = (arrays,)
        if len(arrays) != len(inputs):
            allowed = f"{len(inputs)}: {', '.join(inputs)}, in that order"
            raise ConfigError(f"{source.name}() arguments", len(arrays), allowed)
        columns = [a.to_pylist() for a in arrays]
        yield [dict(zip(inputs, values, strict=True)) for values in zip(*columns, strict=True)]


def _lookup_batches(source: LookupSource, arrow_type: Any, batches: Iterator[Any]) -> Iterator[Any]:
    import pyarrow as pa

    conf = task_conf()  # a bad setting fails here, before any lookup
    loop = worker_loop().loop
    op = KeyedAsyncWaitOperator(
        source_adapter(source, conf),
        mode=OutputMode.ORDERED,
        capacity=conf.buffer_capacity,
        timeout=conf.timeout,
        retry=conf.retry(),
        output="pairs",
    )
    log.info("%s(): ORDERED (the scalar form returns results in input order)", source.name)
    with contextlib.closing(drive(loop, op.process_batches(_records(source, batches)))) as produced:
        for chunk in produced:
            values = [results[0] if results else None for _, results in chunk]
            try:
                yield pa.array(values, type=arrow_type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as exc:
                raise _explain(source, chunk, arrow_type, exc) from exc


def _explain(source: LookupSource, chunk: list[Any], arrow_type: Any, exc: Exception) -> ResultSchemaError:
    import pyarrow as pa

    for record, results in chunk:
        if not results:
            continue
        try:
            pa.array([results[0]], type=arrow_type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as cause:
            key = {name: record.get(name) for name in source.inputs}
            return ResultSchemaError(
                f"{source.name}(): the result {results[0]!r:.100} does not fit {source.schema_ddl!r} "
                f"for the lookup of {key!r}: {cause}"
            )
    return ResultSchemaError(f"{source.name}(): results do not fit {source.schema_ddl!r}: {exc}")

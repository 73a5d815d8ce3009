"""The table function's analysis: its call checked, its output schema and partitioning
derived, at query analysis on the driver (so every error here comes before any lookup).

See :mod:`sql_ext.table` for the arguments.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from keyed_async_wait.core.exceptions import ConfigError
from keyed_async_wait.spark.key_hash import check_byte_for_byte, map_key, quoted
from keyed_async_wait.spark.options import ERROR_STRUCT

from .buckets import DEFAULT_BUCKETS, bucket_expression
from .declared import DECLARED_KINDS, DECLARED_OPTIONS, Declarations, declared_source
from .exceptions import TableArgumentError, UnknownSourceError
from .modes import InputShape, describe_input
from .sources import LookupSource

__all__ = ["CALL_OPTIONS", "DEFAULT_BUCKETS", "LookupAnalysis", "analyze"]


def _analysis_base() -> type:
    from pyspark.sql.udtf import AnalyzeResult

    return AnalyzeResult


try:  # pyspark is an optional extra; the class exists only with it
    _AnalyzeResult = _analysis_base()
except ImportError:  # pragma: no cover
    _AnalyzeResult = object


@dataclass
class LookupAnalysis(_AnalyzeResult):  # type: ignore[misc,valid-type]
    """Spark's AnalyzeResult plus what each instance needs (Spark hands it to ``__init__``)."""

    source: str = ""
    declared: LookupSource | None = None  # a source declared in the SQL call itself
    shape: InputShape | None = None
    columns: tuple[str, ...] = ()
    input_schema: Any = None  # the table's StructType
    join: str = "left"
    error_column: str | None = None  # failed rows kept, with their error in this struct column


def _constant(name: str, argument: Any) -> Any:
    if argument is None:
        return None
    if not argument.isConstantExpression:
        raise ConfigError(name, "(a column or an expression)", "a constant, e.g. 'order_id'")
    return argument.value


def _order_columns(value: Any, columns: tuple[str, ...]) -> tuple[str, ...]:
    if value is None:
        return ()
    names = tuple(c.strip() for c in str(value).split(",") if c.strip())
    missing = [c for c in names if c not in columns]
    if not names or missing:
        raise TableArgumentError("order_by", value, f"columns of the table ({', '.join(columns)})")
    return names


CALL_OPTIONS = ("upsert_key", "order_by", "change_column", "buckets", "join", "error_column")


def analyze(
    sources: Mapping[str, LookupSource],
    table: Any,
    source: Any,
    options: Mapping[str, Any],
    allowed: Declarations | None = None,
    spread: list[int] | None = None,
    default_buckets: int = DEFAULT_BUCKETS,
) -> LookupAnalysis:
    """Check the call and derive the output schema and partitioning (runs at analysis time,
    so every error here comes before any lookup). ``options``: the named arguments;
    ``default_buckets``: the bucket count without ``buckets =>``."""
    from pyspark.sql.types import StructField, StructType
    from pyspark.sql.udtf import OrderingColumn, PartitioningColumn

    if table is None or not table.isTable:
        raise ConfigError("async_lookup first argument", None, "a table: async_lookup(TABLE(t), 'source')")
    unknown = sorted(set(options) - set(CALL_OPTIONS) - set(DECLARED_OPTIONS))
    if unknown:
        raise ConfigError(unknown[0], "(given)", ", ".join((*CALL_OPTIONS, *DECLARED_OPTIONS)))
    upsert_key, order_by, change_column, buckets, join, errors = (options.get(name) for name in CALL_OPTIONS)
    name = _constant("source", source)
    spec = {k: _constant(k, options[k]) for k in DECLARED_OPTIONS if options.get(k) is not None}
    lookup, inline = _resolve_source(sources, name, spec, allowed)
    input_schema: StructType = table.dataType
    columns = tuple(input_schema.fieldNames())
    _check_inputs(lookup, name, columns)
    shape = describe_input(
        columns,
        upsert_key=_constant("upsert_key", upsert_key),
        change_column=_constant("change_column", change_column),
    )
    order = _order_columns(_constant("order_by", order_by), columns)
    if order and not shape.update_stream:
        raise TableArgumentError(
            "order_by", ", ".join(order), "only with an update stream: declare upsert_key => ... too"
        )
    count = _constant("buckets", buckets)
    count = default_buckets if count is None else count
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ConfigError("buckets", count, "an integer >= 1")
    mode = _constant("join", join) or "left"
    if mode not in ("left", "inner"):
        raise ConfigError("join", mode, "'left', 'inner'")
    results: StructType = lookup.result_schema
    clash = [f for f in results.fieldNames() if f in columns]
    if clash:
        raise TableArgumentError(
            "source",
            name,
            f"a source whose result columns are not table columns; clashing: {', '.join(clash)}",
        )
    metadata = {"async_lookup.source": name, "async_lookup.input": shape.why}
    fields = list(input_schema.fields) + [
        StructField(f.name, f.dataType, True, metadata) for f in results.fields
    ]
    error_column = _error_column(_constant("error_column", errors), columns, results.fieldNames())
    if error_column is not None:
        fields.append(StructField(error_column, ERROR_STRUCT, True))
    partition_by, order_columns = [], []
    if shape.update_stream:
        _check_key_types(input_schema, _constant("upsert_key", upsert_key), list(shape.key))
        hashed = ", ".join(quoted(c) for c in shape.key)
        partition_by = [PartitioningColumn(bucket_expression(hashed, count, spread))]
        order_columns = [OrderingColumn(quoted(c)) for c in order]
    return LookupAnalysis(
        schema=StructType(fields),
        partitionBy=partition_by,
        orderBy=order_columns,
        source=name,
        declared=inline,
        shape=shape,
        columns=columns,
        input_schema=input_schema,
        join=mode,
        error_column=error_column,
    )


def _check_key_types(schema: Any, upsert_key: Any, key: list[str]) -> None:
    """The update stream's key is hashed into buckets and compared in the task: no map (Spark
    hashes a map's entries in the order listed) and no string compared other than byte for byte
    (``order_by`` is Spark's to sort, by the collation)."""
    whole_row = " (without upsert_key the whole row is the key: declare one)" if upsert_key is None else ""
    mapped = map_key(schema, key)
    if mapped is not None:
        allowed = f"columns Spark hashes by value: {mapped!r} holds a MAP (hashed in the order its "
        allowed += f"entries are listed); key by to_json of it, or by other columns{whole_row}"
        raise TableArgumentError("upsert_key", upsert_key, allowed)
    check_byte_for_byte(schema, "upsert_key", upsert_key, key, hint=whole_row)


def _error_column(value: Any, columns: tuple[str, ...], results: list[str]) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.isidentifier():
        raise ConfigError("error_column", value, "a column name")
    if value in columns or value in results:
        raise TableArgumentError("error_column", value, "a name that is no table column and no result column")
    return value


def _resolve_source(
    sources: Mapping[str, LookupSource],
    name: str,
    spec: dict[str, Any],
    allowed: Declarations | None,
) -> tuple[LookupSource, LookupSource | None]:
    """The source named, and whether it was declared in the call itself (inline)."""
    if name in sources and not spec:
        return sources[name], None
    if name in DECLARED_KINDS and name not in sources:
        inline = declared_source(name, spec, allowed)
        return inline, inline
    if spec:
        raise ConfigError(
            next(iter(spec)), "(given)", f"only with a source declared in SQL: {', '.join(DECLARED_KINDS)}"
        )
    known = sorted(sources) + [f"'{k}' with url => ..." for k in DECLARED_KINDS]
    raise UnknownSourceError("source", name, ", ".join(known))


def _check_inputs(lookup: LookupSource, name: str, columns: tuple[str, ...]) -> None:
    missing = [c for c in lookup.inputs if c not in columns]
    if missing:  # in a task every row would miss (a NULL lookup key): say so now
        raise TableArgumentError(
            "source",
            name,
            f"a source whose input fields are columns of the table ({', '.join(columns)}); "
            f"it reads {', '.join(lookup.inputs)}, and {missing[0]!r} is not a column",
        )

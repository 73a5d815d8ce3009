"""The key columns as Spark hashes them to place a key's rows in one partition.

A map is unordered: ``{a: 1, b: 2}`` and ``{b: 2, a: 1}`` are one key to a key-ordered wait
(:func:`keyed_async_wait.core.keys.freeze`), and Spark 4 groups and repartitions them as one.
Spark 3.5 hashes a map's entries in the order they are listed, so a ``repartition`` by such a
key could put its rows in two partitions, run by two tasks at once. Every placement by key
therefore hashes a key holding a map (at any depth: in an array, a struct, a map's values) with
each map's entries sorted by their key; any other key column is hashed as it is, so its plan is
the one Spark makes for the column's name.

A string with a collation other than ``UTF8_BINARY`` (Spark 4: ``UTF8_LCASE``, ``UNICODE_CI``,
a trimming one) is refused as a key (:func:`check_byte_for_byte`): Spark places and groups
``'abc'`` and ``'ABC'`` as one such key, while a task compares keys byte for byte, so their
order would be lost with no error. So too as an ``order_by`` column that the tasks sort (a
streaming DataFrame's ``key_ordered_wait``): elsewhere Spark sorts, by the collation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DataType, MapType, StringType, StructType

from ..core.exceptions import ConfigError

__all__ = ["check_byte_for_byte", "holds_map", "in_key_order", "map_key", "placement_columns", "quoted"]

_BINARY = "UTF8_BINARY"


def placement_columns(schema: StructType, key_columns: list[str]) -> list[str | Column]:
    """What to ``repartition`` (or ``hash``) by to place each key's rows together: the key
    column names, except a column holding a map, given with its maps' entries in key order."""
    types = {field.name: field.dataType for field in schema.fields}
    return [
        in_key_order(F.col(quoted(name)), types[name]).alias(name) if holds_map(types[name]) else name
        for name in key_columns
    ]


def in_key_order(column: Column, kind: DataType) -> Column:
    """``column`` (of type ``kind``) with every map in it listing its entries sorted by key;
    equal maps come out equal in Spark's hash and in their JSON text."""
    if isinstance(kind, MapType):
        value = kind.valueType
        entries = F.map_entries(column)
        if holds_map(value):
            entries = F.transform(
                entries,
                lambda e: F.struct(e["key"].alias("key"), in_key_order(e["value"], value).alias("value")),
            )
        # by key alone: keys are unique, and a value holding a map is not orderable
        by_key = F.array_sort(
            entries, lambda a, b: F.when(a["key"] < b["key"], -1).when(a["key"] > b["key"], 1).otherwise(0)
        )
        return F.map_from_entries(by_key)
    if isinstance(kind, ArrayType) and holds_map(kind.elementType):
        element = kind.elementType
        return F.transform(column, lambda item: in_key_order(item, element))
    if isinstance(kind, StructType) and holds_map(kind):
        fields = [in_key_order(column[f.name], f.dataType).alias(f.name) for f in kind.fields]
        return F.when(column.isNull(), F.lit(None)).otherwise(F.struct(*fields))
    return column


def check_byte_for_byte(
    schema: StructType, option: str, value: Any, columns: Sequence[str], hint: str = ""
) -> None:
    """Raise a :class:`ConfigError` naming ``option`` when one of ``columns`` holds a string
    with a collation that does not compare byte for byte (``hint`` ends what it allows)."""
    types = {field.name: field.dataType for field in schema.fields}
    for name in columns:
        collation = _collation(types[name])
        if collation is not None:
            raise ConfigError(
                option,
                value,
                f"columns compared byte for byte: column {name!r} holds strings of collation "
                f"{collation}, which Spark groups as equal when their bytes differ (a task compares "
                f"and sorts them byte for byte); give collate({name}, '{_BINARY}'), or a normal "
                f"form such as lower({name}), instead{hint}",
            )


def _collation(kind: DataType) -> str | None:
    """The first collation other than UTF8_BINARY in a value of ``kind`` (None: none)."""
    if isinstance(kind, StringType):
        collation = getattr(kind, "collation", _BINARY)  # pyspark 3.5 has none
        return None if collation == _BINARY else str(collation)
    if isinstance(kind, ArrayType):
        return _collation(kind.elementType)
    if isinstance(kind, MapType):
        return _collation(kind.keyType) or _collation(kind.valueType)
    if isinstance(kind, StructType):
        return next((c for f in kind.fields if (c := _collation(f.dataType)) is not None), None)
    return None


def map_key(schema: StructType, key_columns: Sequence[str]) -> str | None:
    """The first of ``key_columns`` holding a map (or a variant), which Spark cannot compare
    in a join or a set; None when none does."""
    types = {field.name: field.dataType for field in schema.fields}
    return next((name for name in key_columns if holds_map(types[name])), None)


def holds_map(kind: DataType) -> bool:
    """Whether a value of ``kind`` can hold a map (a variant can)."""
    if isinstance(kind, MapType) or type(kind).__name__ == "VariantType":
        return True
    if isinstance(kind, ArrayType):
        return holds_map(kind.elementType)
    return isinstance(kind, StructType) and any(holds_map(f.dataType) for f in kind.fields)


def quoted(name: str) -> str:
    """Column ``name`` as a reference Spark reads as one name (dots and backticks in it)."""
    return "`" + name.replace("`", "``") + "`"

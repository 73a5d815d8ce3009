"""The key columns as Spark hashes them to place a key's rows in one partition.

A map is unordered: ``{a: 1, b: 2}`` and ``{b: 2, a: 1}`` are one key to a key-ordered wait
(:func:`keyed_async_wait.core.keys.freeze`), and Spark 4 groups and repartitions them as one.
Spark 3.5 hashes a map's entries in the order they are listed, so a ``repartition`` by such a
key could put its rows in two partitions, run by two tasks at once. Every placement by key
therefore hashes a key holding a map (at any depth: in an array, a struct, a map's values) with
each map's entries sorted by their key; any other key column is hashed as it is, so its plan is
the one Spark makes for the column's name.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DataType, MapType, StructType

__all__ = ["holds_map", "in_key_order", "placement_columns", "quoted"]


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

"""Row values of the table function, as the DataFrame API gives them (natural Python types).

The table function receives pyspark Rows. PySpark turns a TIMESTAMP into a naive datetime in
the worker's local time zone, BINARY into a bytearray and a struct into a Row; the DataFrame
API (Arrow) gives an aware datetime in the session time zone, bytes and dicts. A function must
see the same values whichever form calls it, so the table function converts them here.
Results are checked with the same rules as everywhere (:mod:`keyed_async_wait.spark.values`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any
from zoneinfo import ZoneInfo

from pyspark.sql.types import ArrayType, BinaryType, DataType, MapType, StructType, TimestampType

__all__ = ["row_reader"]

Convert = Callable[[Any], Any]


def _reader(kind: DataType, zone: ZoneInfo) -> Convert | None:
    if isinstance(kind, TimestampType):
        # naive local time of this process, as PySpark made it: the same instant, in the session zone
        return lambda v: v.astimezone(zone) if isinstance(v, dt.datetime) else v
    if isinstance(kind, BinaryType):
        return lambda v: bytes(v) if isinstance(v, bytearray) else v
    if isinstance(kind, ArrayType):
        element = _reader(kind.elementType, zone)
        return None if element is None else lambda v: None if v is None else [element(x) for x in v]
    if isinstance(kind, MapType):
        key, item = _reader(kind.keyType, zone), _reader(kind.valueType, zone)
        if key is None and item is None:
            return None
        return lambda v: None if v is None else {_apply(key, k): _apply(item, x) for k, x in v.items()}
    if isinstance(kind, StructType):
        parts = [(f.name, _reader(f.dataType, zone)) for f in kind.fields]
        return lambda v: None if v is None else {name: _apply(part, v[name]) for name, part in parts}
    return None


def _apply(convert: Convert | None, value: Any) -> Any:
    return value if convert is None or value is None else convert(value)


def row_reader(schema: StructType, time_zone: str) -> Callable[[Any], dict[str, Any]]:
    """A function from a table-function Row to a dict of natural Python values."""
    zone = ZoneInfo(time_zone)
    parts = [(f.name, _reader(f.dataType, zone)) for f in schema.fields]
    fixes = [(name, part) for name, part in parts if part is not None]

    def read(row: Any) -> dict[str, Any]:
        record: dict[str, Any] = row.asDict()
        for name, part in fixes:
            value = record[name]
            if value is not None:
                record[name] = part(value)
        return record

    return read

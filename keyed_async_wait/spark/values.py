"""Values between Arrow and Python, exactly (pyarrow only; no pyspark).

Reading: a row reaches the user's function with natural Python types: a MAP is a dict (Arrow
gives a list of pairs), a TIMESTAMP an aware datetime in the session time zone, a TIMESTAMP_NTZ
a naive one, DECIMAL a Decimal, BINARY bytes, nested as deep as the type goes.

Writing: a result value must fit its column exactly, or it is refused with the reason, for the
caller to name the column and the record's key. pyarrow on its own would turn 5.7 into 5 for
a BIGINT, a datetime into its date for a DATE, and would read a naive datetime as UTC; it
would also drop unknown struct fields and fill missing ones with NULL. None of that passes
here: ints for integer columns (in range), ints or floats for floating columns (ints only when
exact), Decimal or int for DECIMAL (no digits lost), str for STRING, bytes for BINARY, bool for
BOOLEAN, date (not datetime) for DATE, a naive time for TIME, datetime for TIMESTAMP (a naive
one is read in the session time zone, as Spark reads a timestamp without an offset), a naive
datetime for TIMESTAMP_NTZ, timedelta for intervals, lists for arrays, dicts for maps, and for structs dicts
with exactly the struct's fields.
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from zoneinfo import ZoneInfo

import pyarrow as pa

__all__ = ["ValueMismatch", "column_converter", "python_rows", "row_fixer", "sort_key"]

Convert = Callable[[Any], Any]


class ValueMismatch(Exception):
    """A result value that does not fit its column; ``str()`` says why."""


# ---------------------------------------------------------------------- reading


def _reader(kind: pa.DataType) -> Convert | None:
    """A function fixing what ``to_pylist`` gives for ``kind``; None when nothing needs fixing."""
    if pa.types.is_map(kind):
        key, item = _reader(kind.key_type), _reader(kind.item_type)
        return lambda pairs: None if pairs is None else _map(pairs, key, item)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        element = _reader(kind.value_type)
        if element is None:
            return None
        return lambda values: None if values is None else [element(v) for v in values]
    if pa.types.is_struct(kind):
        parts = {kind.field(i).name: _reader(kind.field(i).type) for i in range(kind.num_fields)}
        fixes = {name: fix for name, fix in parts.items() if fix is not None}
        if not fixes:
            return None
        return lambda value: (
            None if value is None else {k: fixes[k](v) if k in fixes else v for k, v in value.items()}
        )
    return None


def _map(pairs: Sequence[tuple[Any, Any]], key: Convert | None, item: Convert | None) -> dict[Any, Any]:
    out = {}
    for k, v in pairs:
        k = key(k) if key is not None else k
        if isinstance(k, (list, dict)):  # a dict key must be hashable: an ARRAY key as a tuple
            k = _hashable(k)
        out[k] = item(v) if item is not None else v
    return out


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _hashable(v)) for k, v in value.items())
    return value


def row_fixer(schema: pa.Schema) -> Callable[[list[dict[str, Any]]], list[dict[str, Any]]] | None:
    """What :func:`python_rows` applies after ``to_pylist`` for this schema (None: nothing)."""
    fixes = {f.name: fix for f in schema if (fix := _reader(f.type)) is not None}
    if not fixes:
        return None

    def fix_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for name, fix in fixes.items():
            for row in rows:
                row[name] = fix(row[name])
        return rows

    return fix_rows


def python_rows(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    """The rows of ``batch`` as dicts of natural Python values."""
    rows: list[dict[str, Any]] = batch.to_pylist()
    fix = row_fixer(batch.schema)
    return fix(rows) if fix is not None else rows


# ---------------------------------------------------------------------- writing

_EXACT_FLOAT = 2**53
_EXACT = decimal.Context(prec=1000)  # wide enough that normalizing never rounds


def _check_int(kind: pa.DataType) -> Convert:
    bits = kind.bit_width
    low, high = (
        (0, 2**bits - 1) if pa.types.is_unsigned_integer(kind) else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    )

    def check(value: Any) -> Any:
        if type(value) is not int:
            if isinstance(value, float) and value.is_integer() and abs(value) < _EXACT_FLOAT:
                raise ValueMismatch(f"{value!r} is a float; give an int for an integer column")
            raise ValueMismatch(f"{value!r} ({type(value).__name__}) is not an int")
        if not low <= value <= high:
            raise ValueMismatch(f"{value} is outside {kind} ({low} to {high})")
        return value

    return check


def _check_float(value: Any) -> Any:
    if type(value) is float:
        return value
    if type(value) is int:
        if abs(value) > _EXACT_FLOAT:
            raise ValueMismatch(f"{value} has no exact floating-point value (beyond 2**53)")
        return value
    raise ValueMismatch(f"{value!r} ({type(value).__name__}) is not a float or int")


def _check_decimal(kind: pa.DataType) -> Convert:
    precision, scale = kind.precision, kind.scale

    def check(value: Any) -> Any:
        if type(value) is int:
            value = decimal.Decimal(value)
        elif not isinstance(value, decimal.Decimal):
            raise ValueMismatch(f"{value!r} ({type(value).__name__}) is not a Decimal or int")
        if not value.is_finite():
            raise ValueMismatch(f"{value} has no DECIMAL value")
        if not value:
            return value
        exponent = value.normalize(_EXACT).as_tuple().exponent  # trailing zeros do not count
        assert isinstance(exponent, int)
        if exponent < -scale:
            raise ValueMismatch(f"{value} has more than {scale} digits after the point ({kind})")
        if value.adjusted() + 1 > precision - scale:
            raise ValueMismatch(f"{value} has more than {precision - scale} digits before the point ({kind})")
        return value

    return check


def _of(kinds: tuple[type, ...], name: str) -> Convert:
    def check(value: Any) -> Any:
        if not isinstance(value, kinds):
            raise ValueMismatch(f"{value!r} ({type(value).__name__}) is not {name}")
        return value

    return check


def _check_date(value: Any) -> Any:
    if type(value) is dt.date or (isinstance(value, dt.date) and not isinstance(value, dt.datetime)):
        return value
    if isinstance(value, dt.datetime):
        raise ValueMismatch(f"{value!r} is a datetime; a DATE column takes a date (datetime.date)")
    raise ValueMismatch(f"{value!r} ({type(value).__name__}) is not a date")


def _check_time(value: Any) -> Any:
    if not isinstance(value, dt.time):
        raise ValueMismatch(f"{value!r} ({type(value).__name__}) is not a time")
    if value.tzinfo is not None:
        raise ValueMismatch(f"{value!r} has a time zone; a TIME column takes a naive time")
    return value


def _check_timestamp(kind: pa.DataType, session_tz: str | None) -> Convert:
    if kind.tz is None:

        def local(value: Any) -> Any:
            if not isinstance(value, dt.datetime):
                raise ValueMismatch(f"{value!r} ({type(value).__name__}) is not a datetime")
            if value.tzinfo is not None:
                raise ValueMismatch(
                    f"{value!r} has a time zone; a TIMESTAMP_NTZ column takes a naive datetime "
                    "(use a TIMESTAMP column for instants)"
                )
            return value

        return local
    zone = ZoneInfo(session_tz or kind.tz)

    def instant(value: Any) -> Any:
        if not isinstance(value, dt.datetime):
            raise ValueMismatch(f"{value!r} ({type(value).__name__}) is not a datetime")
        # a naive datetime is a wall-clock time in the session time zone, as Spark reads one
        return value if value.tzinfo is not None else value.replace(tzinfo=zone)

    return instant


def _check_list(element: Convert) -> Convert:
    def check(value: Any) -> Any:
        if not isinstance(value, (list, tuple)):
            raise ValueMismatch(f"{value!r} ({type(value).__name__}) is not a list")
        return [None if v is None else element(v) for v in value]

    return check


def _check_map(key: Convert, item: Convert, arrow: bool) -> Convert:
    def check(value: Any) -> Any:
        if not isinstance(value, Mapping):
            raise ValueMismatch(f"{value!r} ({type(value).__name__}) is not a dict")
        out = []
        for k, v in value.items():
            if k is None:
                raise ValueMismatch("a MAP key is None")
            k = key(list(k) if arrow and isinstance(k, tuple) else k)
            out.append((_hashable(k) if not arrow else k, None if v is None else item(v)))
        return out if arrow else dict(out)

    return check


def _check_struct(kind: pa.DataType, session_tz: str | None, arrow: bool) -> Convert:
    names = [kind.field(i).name for i in range(kind.num_fields)]
    parts = {
        kind.field(i).name: _checker(kind.field(i).type, session_tz, arrow) for i in range(kind.num_fields)
    }

    def check(value: Any) -> Any:
        if not isinstance(value, Mapping):
            raise ValueMismatch(f"{value!r} ({type(value).__name__}) is not a dict of the fields {names}")
        extra = [k for k in value if k not in parts]
        if extra:
            raise ValueMismatch(f"field {extra[0]!r} is not in the struct's fields {names}")
        missing = [k for k in names if k not in value]
        if missing:
            raise ValueMismatch(f"field {missing[0]!r} is missing (give None for a null field)")
        out = {}
        for name, part in parts.items():
            v = value[name]
            try:
                out[name] = None if v is None else part(v)
            except ValueMismatch as why:
                raise ValueMismatch(f"field {name!r}: {why}") from None
        return out

    return check


def _checker(kind: pa.DataType, session_tz: str | None, arrow: bool = True) -> Convert:
    types = pa.types
    if types.is_integer(kind):
        return _check_int(kind)
    if types.is_floating(kind):
        return _check_float
    if types.is_decimal(kind):
        return _check_decimal(kind)
    if types.is_string(kind) or types.is_large_string(kind):
        return _of((str,), "a str")
    if types.is_binary(kind) or types.is_large_binary(kind):
        return _of((bytes, bytearray, memoryview), "bytes")
    if types.is_boolean(kind):
        return _of((bool,), "a bool")
    if types.is_date(kind):
        return _check_date
    if types.is_timestamp(kind):
        return _check_timestamp(kind, session_tz)
    if types.is_duration(kind):
        return _of((dt.timedelta,), "a timedelta")
    if types.is_time(kind):
        return _check_time
    if types.is_list(kind) or types.is_large_list(kind) or types.is_fixed_size_list(kind):
        return _check_list(_checker(kind.value_type, session_tz, arrow))
    if types.is_map(kind):
        key, item = _checker(kind.key_type, session_tz, arrow), _checker(kind.item_type, session_tz, arrow)
        return _check_map(key, item, arrow)
    if types.is_struct(kind):
        return _check_struct(kind, session_tz, arrow)
    if types.is_null(kind):
        return _of((), "None")

    def unknown(value: Any) -> Any:
        return value  # Arrow itself checks what we have no rule for

    return unknown


# the values that need no conversion at all, per kind of column (the hot path skips the checker)
def _plain_types(kind: pa.DataType) -> frozenset[type]:
    types = pa.types
    if types.is_integer(kind) and kind.bit_width == 64 and types.is_signed_integer(kind):
        return frozenset()  # range-checked: ints beyond 64 bits must be named, not overflow in C
    if types.is_floating(kind):
        return frozenset({float})
    if types.is_string(kind) or types.is_large_string(kind):
        return frozenset({str})
    if types.is_binary(kind) or types.is_large_binary(kind):
        return frozenset({bytes})
    if types.is_boolean(kind):
        return frozenset({bool})
    if types.is_date(kind):
        return frozenset({dt.date})
    return frozenset()


def column_converter(
    kind: pa.DataType, session_tz: str | None = None, *, arrow: bool = True
) -> Callable[[list[Any]], list[Any]]:
    """A function checking and converting one column's values in place (see the module doc),
    for ``pa.array`` (``arrow``; a MAP becomes a list of pairs) or for PySpark's row
    conversion (a MAP stays a dict).

    It raises :class:`ValueMismatch` whose ``index`` attribute is the position of the value.
    """
    check, plain = _checker(kind, session_tz, arrow), _plain_types(kind)

    def convert(values: list[Any]) -> list[Any]:
        for i, value in enumerate(values):
            if value is None or type(value) in plain:
                continue
            try:
                values[i] = check(value)
            except ValueMismatch as why:
                why.index = i  # type: ignore[attr-defined]
                raise
        return values

    return convert


# ---------------------------------------------------------------------- ordering


def _sortable(value: Any) -> tuple[int, Any]:
    if value is None:
        return (0, 0)  # ascending order puts NULL first, as Spark's does
    if isinstance(value, float) and value != value:
        return (2, 0)
    return (1, value)


def sort_key(columns: Sequence[str]) -> Callable[[Mapping[str, Any]], tuple[tuple[int, Any], ...]]:
    """A sort key over ``columns`` ordering as Spark's ascending sort: NULL first, NaN last."""
    return lambda row: tuple(_sortable(row[c]) for c in columns)

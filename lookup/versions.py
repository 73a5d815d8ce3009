"""A record's version as a string whose byte order is the order Spark gives the column, so a
store (a Redis script, an HTTP service) can fence writes by comparing two strings.

Tags keep kinds apart (one column has one kind): ``i`` a whole number (long, int, short,
byte), ``f`` a double or float, ``t`` a timestamp (microseconds since the epoch; a naive one,
Spark's TIMESTAMP_NTZ, as UTC wall time), ``d`` a date (days since the epoch), ``s`` a string
(its UTF-8 bytes in hex: byte order, Spark's string order), ``b`` binary (hex). Numbers and
times are 16 hex digits, offset or bit-flipped so that unsigned order is numeric order; the
alphabet is ``[0-9a-z]``, so the string is also safe in an HTTP header. Spark's own rules hold:
``-0.0`` equals ``0.0`` and NaN is above every other double. A decimal version is refused
(give a long, a timestamp or a string): no fixed-width encoding keeps its order.
"""

from __future__ import annotations

import datetime as dt
import math
import struct
from typing import Any

__all__ = ["VERSION_KINDS", "encode_version"]

VERSION_KINDS = "a long, int, short, byte, double, float, timestamp, date, string or binary column"
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_EPOCH_DAY = dt.date(1970, 1, 1).toordinal()
_OFFSET = 1 << 63
_MICRO = dt.timedelta(microseconds=1)


def encode_version(value: Any) -> str:
    """The order-preserving string of ``value``; ValueError (naming what is allowed) for None
    or a kind that has no order here."""
    if value is None:
        raise ValueError(f"the version is NULL; a write needs one ({VERSION_KINDS})")
    if isinstance(value, bool):
        raise ValueError(f"a boolean version has two values; give {VERSION_KINDS}")
    if isinstance(value, int):
        return "i" + _whole(value)
    if isinstance(value, float):
        return "f" + _double(value)
    if isinstance(value, dt.datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=dt.timezone.utc)
        return "t" + _whole((aware - _EPOCH) // _MICRO)
    if isinstance(value, dt.date):
        return "d" + _whole(value.toordinal() - _EPOCH_DAY)
    if isinstance(value, str):
        return "s" + value.encode("utf-8").hex()
    if isinstance(value, (bytes, bytearray)):
        return "b" + bytes(value).hex()
    raise ValueError(f"a version of type {type(value).__name__} ({value!r:.40}); give {VERSION_KINDS}")


def _whole(number: int) -> str:
    if not -_OFFSET <= number < _OFFSET:
        raise ValueError(f"the version {number} does not fit a long")
    return f"{number + _OFFSET:016x}"


def _double(number: float) -> str:
    if math.isnan(number):
        number = math.nan  # one NaN, above +inf as in Spark
    elif number == 0.0:
        number = 0.0  # -0.0 equals 0.0 in Spark
    (bits,) = struct.unpack(">Q", struct.pack(">d", number))
    bits = bits ^ 0xFFFFFFFFFFFFFFFF if bits >> 63 else bits | (1 << 63)
    return f"{bits:016x}"

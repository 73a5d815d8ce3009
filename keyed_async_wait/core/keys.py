"""Key selectors, a stable key hash and Flink's key-group arithmetic.

The hash must be the same in every process and every run (Python's ``hash()`` of a str is
salted per process), because snapshots are split by key group and Spark partitions by it.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import hashlib
import struct
import uuid
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from operator import itemgetter
from typing import Any, Final

from .exceptions import ConfigError, RecordKeyError

__all__ = [
    "DEFAULT_MAX_PARALLELISM",
    "WHOLE_RECORD",
    "KeySelector",
    "freeze",
    "key_group_for",
    "key_group_range",
    "make_key_selector",
    "stable_hash",
    "subtask_for_key",
    "subtask_for_key_group",
]

DEFAULT_MAX_PARALLELISM: Final = 128

NAN: Final = float("nan")
"""The one NaN every NaN key becomes: NaN != NaN, but Spark groups NaN with NaN, and so do we."""

# key values of these types are used as they are; anything else goes through freeze()
_PLAIN: Final = frozenset({int, str, bytes, bool})

KeySelector = Callable[[Any], Hashable]


class _WholeRecord:
    """Sentinel: use the whole record as its key (FLIP-519's rule when there is no upsert key)."""

    _instance: _WholeRecord | None = None

    def __new__(cls) -> _WholeRecord:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "WHOLE_RECORD"

    def __reduce__(self) -> str:
        return "WHOLE_RECORD"


WHOLE_RECORD: Final = _WholeRecord()


def freeze(value: Any) -> Hashable:
    """A hashable form of a key or record that groups as Spark groups: lists become tuples,
    dicts (and Rows) order-independent tuples, sets frozensets, every NaN :data:`NAN` and
    -0.0 becomes 0.0, nested."""
    kind = type(value)
    if kind in _PLAIN or value is None:
        return value
    if kind is float:
        if value != value:
            return NAN
        return 0.0 if value == 0 else value
    if hasattr(value, "asDict"):  # a pyspark Row (a tuple), without importing pyspark
        return freeze(value.asDict(recursive=True))
    if isinstance(value, Mapping):
        return tuple(sorted(((k, freeze(v)) for k, v in value.items()), key=lambda kv: repr(kv[0])))
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    if isinstance(value, (set, frozenset)):
        return frozenset(freeze(v) for v in value)
    return value


def _missing(field: str, record: Any) -> RecordKeyError:
    return RecordKeyError(
        f"key field {field!r} is missing or None in record {_preview(record)}; give every record "
        f"a key, or pass key=WHOLE_RECORD to use the whole record as its key",
        record,
    )


def _preview(record: Any) -> str:
    text = repr(record)
    return text if len(text) <= 200 else text[:197] + "..."


def _field_selector(field: str) -> KeySelector:
    def select(record: Any) -> Hashable:
        try:
            value = record[field]
        except (KeyError, IndexError, TypeError, ValueError):
            raise _missing(field, record) from None
        if value is None:
            raise _missing(field, record)
        return value if type(value) in _PLAIN else freeze(value)

    select.__name__ = f"key[{field!r}]"
    select.field = field  # type: ignore[attr-defined]
    return select


def keys_of_many(selector: KeySelector, records: list[Any]) -> list[Hashable]:
    """The keys of many records: one comprehension for a single field, else one call each."""
    field = getattr(selector, "field", None)
    if field is not None:
        try:
            keys = list(map(itemgetter(field), records))
        except (KeyError, IndexError, TypeError, ValueError):
            keys = None
        if keys is not None and None not in keys and _PLAIN.issuperset(set(map(type, keys))):
            return keys
    return [selector(record) for record in records]  # normalizes, or raises the precise error


def _fields_selector(fields: tuple[str, ...]) -> KeySelector:
    def select(record: Any) -> Hashable:
        values = []
        for field in fields:
            try:
                value = record[field]
            except (KeyError, IndexError, TypeError, ValueError):
                raise _missing(field, record) from None
            if value is None:
                raise _missing(field, record)
            values.append(value if type(value) in _PLAIN else freeze(value))
        return tuple(values)

    select.__name__ = f"key{list(fields)!r}"
    return select


def _callable_selector(fn: Callable[[Any], Any]) -> KeySelector:
    name = getattr(fn, "__name__", repr(fn))

    def select(record: Any) -> Hashable:
        value = fn(record)
        if value is None:
            raise RecordKeyError(f"key selector {name} returned None for record {_preview(record)}", record)
        return value if type(value) in _PLAIN else freeze(value)

    select.__name__ = name
    return select


def make_key_selector(key: Any) -> KeySelector | None:
    """Turn ``key=`` into a function record -> hashable key (``None`` stays ``None``)."""
    if key is None:
        return None
    if key is WHOLE_RECORD:
        return freeze
    if isinstance(key, str):
        return _field_selector(key)
    if callable(key):
        return _callable_selector(key)
    if isinstance(key, Iterable):
        fields = tuple(key)
        if fields and all(isinstance(f, str) for f in fields):
            return _field_selector(fields[0]) if len(fields) == 1 else _fields_selector(fields)
    raise ConfigError(
        "key", key, "a field name, a list of field names, a callable record -> key, or WHOLE_RECORD"
    )


def _encode(value: Any, out: list[bytes]) -> None:
    # Values that compare equal must encode equally: True == 1 == 1.0 are one dict key.
    if value is None:
        out.append(b"N")
    elif isinstance(value, (bool, int)):
        out.append(b"i%d;" % int(value))
    elif isinstance(value, float):
        _encode_float(value, out)
    elif isinstance(value, str):
        data = value.encode("utf-8", "surrogatepass")
        out.append(b"s%d:" % len(data))
        out.append(data)
    elif isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        out.append(b"b%d:" % len(data))
        out.append(data)
    elif isinstance(value, (tuple, list)):
        out.append(b"(%d:" % len(value))
        for item in value:
            _encode(item, out)
    elif isinstance(value, frozenset):
        parts = []
        for item in value:
            sub: list[bytes] = []
            _encode(item, sub)
            parts.append(b"".join(sub))
        out.append(b"{%d:" % len(parts))
        out.extend(sorted(parts))
    elif isinstance(value, decimal.Decimal):
        _encode_decimal(value, out)
    elif isinstance(value, (_dt.date, _dt.time, _dt.timedelta, uuid.UUID)):
        if isinstance(value, _dt.datetime) and value.tzinfo is not None:
            value = value.astimezone(_dt.timezone.utc)  # equal instants in other zones are equal keys
        data = f"{type(value).__name__}:{value}".encode()
        out.append(b"o%d:" % len(data))
        out.append(data)
    else:
        raise RecordKeyError(
            f"key {_preview(value)} of type {type(value).__name__} has no stable hash; use keys "
            "made of str, int, float, bool, bytes, None, decimal, date/time, uuid, tuples of them "
            "or dicts of them",
            value,
        )


def _encode_float(value: float, out: list[bytes]) -> None:
    if value != value:
        out.append(b"fnan")  # every NaN payload alike
    elif value.is_integer():
        out.append(b"i%d;" % int(value))
    else:
        out.append(b"f" + struct.pack(">d", value))


def _encode_decimal(value: decimal.Decimal, out: list[bytes]) -> None:
    # Decimal('1.0') == 1 and Decimal('0.5') == 0.5: encode as the int or float it equals
    if value.is_nan():
        out.append(b"fnan")
    elif value == value.to_integral_value():
        out.append(b"i%d;" % int(value))
    elif float(value) == value:
        _encode_float(float(value), out)
    else:
        data = str(value.normalize()).encode()
        out.append(b"d%d:" % len(data))
        out.append(data)


def stable_hash(key: Any) -> int:
    """A 64-bit hash of a key, identical in every process, run and Python version."""
    parts: list[bytes] = []
    _encode(freeze(key), parts)
    return int.from_bytes(hashlib.blake2b(b"".join(parts), digest_size=8).digest(), "big")


def key_group_for(key: Any, max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> int:
    """The key group of a key: its stable hash modulo the max parallelism."""
    return stable_hash(key) % max_parallelism


def _check_parallelism(subtask_index: int, parallelism: int, max_parallelism: int) -> None:
    if max_parallelism < 1:
        raise ConfigError("max_parallelism", max_parallelism, "an integer >= 1")
    if not 1 <= parallelism <= max_parallelism:
        raise ConfigError("parallelism", parallelism, f"an integer from 1 to {max_parallelism}")
    if not 0 <= subtask_index < parallelism:
        raise ConfigError("subtask_index", subtask_index, f"an integer from 0 to {parallelism - 1}")


def key_group_range(
    subtask_index: int, parallelism: int, max_parallelism: int = DEFAULT_MAX_PARALLELISM
) -> range:
    """The contiguous key groups a subtask owns, as Flink assigns them."""
    _check_parallelism(subtask_index, parallelism, max_parallelism)
    start = (subtask_index * max_parallelism + parallelism - 1) // parallelism
    end = ((subtask_index + 1) * max_parallelism - 1) // parallelism
    return range(start, end + 1)


def subtask_for_key_group(
    key_group: int, parallelism: int, max_parallelism: int = DEFAULT_MAX_PARALLELISM
) -> int:
    """The subtask that owns a key group (the inverse of :func:`key_group_range`)."""
    return key_group * parallelism // max_parallelism


def subtask_for_key(key: Any, parallelism: int, max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> int:
    """The subtask (0 to ``parallelism - 1``) that owns ``key`` when an operator's snapshot is
    restored into ``parallelism`` subtasks: route a key's new input there, after its restored
    records. ``key`` is what the operator's key selects from a record (a field's value, a tuple
    of values for several fields); :meth:`KeyedAsyncWaitOperator.subtask_for` takes the record."""
    _check_parallelism(0, parallelism, max_parallelism)
    return subtask_for_key_group(key_group_for(key, max_parallelism), parallelism, max_parallelism)


def field_names(key: Any) -> Sequence[str] | None:
    """The field names of a name-based key, else None."""
    if isinstance(key, str):
        return (key,)
    if isinstance(key, (list, tuple)) and key and all(isinstance(f, str) for f in key):
        return tuple(key)
    return None

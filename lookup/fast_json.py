"""JSON decoding for answers: orjson when it is installed (the ``fast`` extra), else the
standard library; ``KAW_JSON=json`` forces the standard library.

The two must give the same values. orjson refuses what the standard library accepts beyond
strict JSON (NaN, Infinity): anything orjson refuses is decoded again by the standard library,
which also raises the error (a ``ValueError``) when it fails. And orjson turns an integer wider
than 64 bits into a float, silently: an answer with 19 digits in a row goes to the standard
library. The scan for bytes maps every digit to ``0`` and everything else to a space in one
``translate`` and looks for 19 zeros: measured, six times cheaper than a regular expression
(which is kept for text).

:func:`loads_many` decodes a batch of payloads (a Redis MGET's values): the same values as
:func:`loads` on each, with the scan made once over the batch and no Python call per value.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from typing import Any

__all__ = ["JSON_DECODER", "loads", "loads_many"]

Decoder = Callable[[Any], Any]
ManyDecoder = Callable[[list[Any]], list[Any]]


_WIDE = 19  # digits in a row from which an integer may not fit in 64 bits
_DIGITS_AS_ZEROS = bytes(48 if 48 <= b <= 57 else 32 for b in range(256))
_WIDE_RUN = b"0" * _WIDE
_wide_text = re.compile(rf"\d{{{_WIDE}}}").search


def _wide_bytes(payload: bytes | bytearray) -> bool:
    """True when ``payload`` has 19 ASCII digits in a row (perhaps an integer orjson would
    make a float)."""
    return _WIDE_RUN in payload.translate(_DIGITS_AS_ZEROS)


_BYTES_OR_NONE = frozenset((bytes, type(None)))  # what orjson reads as json.loads does
_scan = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # the stdlib scanner (C)


def _stdlib_many(payloads: list[Any]) -> list[Any]:
    """``json.loads`` of each payload (None stays None), without its per-call layers: each
    payload is decoded as UTF-8 and read by the standard library's own scanner, and the batch
    is kept only when every value spans its whole payload; else ``json.loads`` decides each.

    Why that is ``json.loads``'s value: it reads bytes as UTF-8 unless they start with a BOM or
    a NUL, and then the scan cannot span the payload (a BOM is no JSON, UTF-16 is no UTF-8, a
    NUL is no JSON outside a string and may not be in one); white space around a value or
    anything after it leaves the value short of the end.
    """
    present = [p for p in payloads if p is not None]
    try:
        texts = [p.decode("utf-8", "surrogatepass") for p in present]
        scanned = [_scan(text, 0) for text in texts]
    except (StopIteration, ValueError, AttributeError):  # not bytes, not UTF-8, not a value
        scanned = None
    if scanned is not None and [end for _, end in scanned] == list(map(len, texts)):
        values = [value for value, _ in scanned]
        if len(values) == len(payloads):
            return values
        found = iter(values)
        return [None if p is None else next(found) for p in payloads]
    decode = json.loads
    return [None if p is None else decode(p) for p in payloads]


def _pick() -> tuple[str, Decoder, ManyDecoder]:
    if os.environ.get("KAW_JSON", "auto") != "json":
        try:
            import orjson
        except ImportError:
            pass
        else:
            fast = orjson.loads

            def loads(payload: Any) -> Any:
                wide = _wide_bytes if isinstance(payload, (bytes, bytearray)) else _wide_text
                if wide(payload):  # perhaps an integer orjson would make a float
                    return json.loads(payload)
                try:
                    return fast(payload)
                except ValueError:  # orjson.JSONDecodeError: not strict JSON; the stdlib decides
                    return json.loads(payload)

            def loads_many(payloads: list[Any]) -> list[Any]:
                # a separator that is no digit: a run of 19 in the whole is a run in one
                if _BYTES_OR_NONE.issuperset(map(type, payloads)) and not _wide_bytes(
                    b" ".join(filter(None, payloads))
                ):
                    try:
                        return [None if p is None else fast(p) for p in payloads]
                    except ValueError:
                        pass  # one is not strict JSON: each decided on its own below
                return [None if p is None else loads(p) for p in payloads]

            return "orjson", loads, loads_many
    return "json", json.loads, _stdlib_many


JSON_DECODER, loads, loads_many = _pick()

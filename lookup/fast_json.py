"""JSON decoding for answers: orjson when it is installed (the ``fast`` extra), else the
standard library; ``KAW_JSON=json`` forces the standard library.

The two must give the same values. orjson refuses what the standard library accepts beyond
strict JSON (NaN, Infinity): anything orjson refuses is decoded again by the standard library,
which also raises the error (a ``ValueError``) when it fails. And orjson turns an integer wider
than 64 bits into a float, silently: an answer with 19 digits in a row goes to the standard
library (a scan in C, cheap next to the decoding).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from typing import Any

__all__ = ["JSON_DECODER", "loads"]


def _pick() -> tuple[str, Callable[[Any], Any]]:
    if os.environ.get("KAW_JSON", "auto") != "json":
        try:
            import orjson
        except ImportError:
            pass
        else:
            fast = orjson.loads
            wide_bytes, wide_text = re.compile(rb"\d{19}").search, re.compile(r"\d{19}").search

            def loads(payload: Any) -> Any:
                wide = wide_bytes if isinstance(payload, (bytes, bytearray)) else wide_text
                if wide(payload):  # perhaps an integer orjson would make a float
                    return json.loads(payload)
                try:
                    return fast(payload)
                except ValueError:  # orjson.JSONDecodeError: not strict JSON; the stdlib decides
                    return json.loads(payload)

            return "orjson", loads
    return "json", json.loads


JSON_DECODER, loads = _pick()

"""What a call gave, to compare a batch path with the one-by-one path it must equal."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    """("value", its repr: NaN equals NaN, an int is not a float) or ("error", type, message)."""
    try:
        return ("value", repr(call()))
    except Exception as exc:  # the error is what is compared
        return ("error", type(exc), str(exc))

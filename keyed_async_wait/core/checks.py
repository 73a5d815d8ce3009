"""The checks every option goes through, wherever it is given (pure): each returns the value in
its one form, or raises a :class:`~keyed_async_wait.core.exceptions.ConfigError` naming the
option, the value and what is allowed."""

from __future__ import annotations

import math
from typing import Any

from .exceptions import ConfigError

__all__ = ["check_bool", "check_choice", "check_instance", "check_positive_int", "check_seconds"]


def check_positive_int(name: str, value: Any, *, optional: bool = False) -> Any:
    """``value`` if it is an int >= 1 (or None when ``optional``); else a ConfigError."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(name, value, "an integer >= 1" + (", or None" if optional else ""))
    return value


def check_seconds(name: str, value: Any, *, allow_zero: bool = False, optional: bool = False) -> float | None:
    """``value`` as float seconds if it is a finite number > 0 (or 0 / None when allowed)."""
    if value is None and optional:
        return None
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        allowed = (
            "a number of seconds > 0" + (" or 0" if allow_zero else "") + (", or None" if optional else "")
        )
        raise ConfigError(name, value, allowed)
    return float(value)


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is True or False (not another truthy or falsy value); else a ConfigError."""
    if not isinstance(value, bool):
        raise ConfigError(name, value, "True or False")
    return value


def check_choice(name: str, value: Any, allowed: tuple[str, ...]) -> Any:
    if value not in allowed:
        raise ConfigError(name, value, ", ".join(repr(a) for a in allowed))
    return value


def check_instance(name: str, value: Any, kind: type | tuple[type, ...], allowed: str) -> Any:
    """``value`` if it is None or a ``kind``; else a ConfigError saying what is allowed."""
    if value is not None and not isinstance(value, kind):
        raise ConfigError(name, value, allowed)
    return value

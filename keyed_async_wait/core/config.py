"""Settings under ``spark.sql.exec.async-lookup.*`` (Flink's ``table.exec.async-lookup.*``), as
groups of keys, each group read by its owner (pure parsing; no pyspark).

The operator's keys are :data:`keyed_async_wait.core.spec.OPERATOR_SETTINGS`; the lookups'
(cache, rate, breaker) are ``lookup.settings.LOOKUP_SETTINGS``, found by the Spark edge through
the ``keyed_async_wait.settings`` entry point group, where any package may add its own. A key
under :data:`PREFIX` that no group knows is an error naming it and the closest known key.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .exceptions import ConfigError, UnknownSettingError

__all__ = [
    "PREFIX",
    "SettingsGroup",
    "check_known_keys",
    "parse_bool",
    "parse_choice",
    "parse_duration",
    "parse_int",
    "parse_multiplier",
    "parse_rate",
]

PREFIX = "spark.sql.exec.async-lookup."

Parser = Callable[[str, Any], Any]  # (the full key, its raw value) -> the value, or a ConfigError

_UNITS = {
    "ms": 0.001,
    "milli": 0.001,
    "millis": 0.001,
    "millisecond": 0.001,
    "milliseconds": 0.001,
    "s": 1.0,
    "sec": 1.0,
    "secs": 1.0,
    "second": 1.0,
    "seconds": 1.0,
    "min": 60.0,
    "mins": 60.0,
    "minute": 60.0,
    "minutes": 60.0,
    "m": 60.0,
    "h": 3600.0,
    "hour": 3600.0,
    "hours": 3600.0,
}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_duration(key: str, value: Any) -> float:
    """Seconds from ``180s``, ``3 min``, ``500 ms``, ``2.5`` (seconds) or a number."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        unit = match.group(2).lower() if match else ""
        if not match or (unit and unit not in _UNITS):
            raise ConfigError(key, value, "a duration such as 180s, 3 min, 500 ms (units: ms, s, min, h)")
        seconds = float(match.group(1)) * (_UNITS[unit] if unit else 1.0)
    if seconds <= 0:
        raise ConfigError(key, value, "a duration > 0")
    return seconds


def parse_bool(key: str, value: Any) -> bool:
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ConfigError(key, value, "true, false")


def parse_int(key: str, value: Any, minimum: int = 1) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ConfigError(key, value, f"an integer >= {minimum}") from None
    if number < minimum:
        raise ConfigError(key, value, f"an integer >= {minimum}")
    return number


def parse_multiplier(key: str, value: Any) -> float:
    """A float >= 1, as Flink takes it (``1.5``)."""
    try:
        number = float(str(value).strip())
    except ValueError:
        raise ConfigError(key, value, "a number >= 1, e.g. 1.5 or 2") from None
    if not math.isfinite(number) or number < 1:
        raise ConfigError(key, value, "a number >= 1, e.g. 1.5 or 2")
    return number


def parse_rate(key: str, value: Any) -> float:
    try:
        number = float(str(value).strip())
    except ValueError:
        raise ConfigError(key, value, "calls per second > 0, e.g. 200 or 12.5") from None
    if not math.isfinite(number) or number <= 0:
        raise ConfigError(key, value, "calls per second > 0, e.g. 200 or 12.5")
    return number


def parse_choice(key: str, value: Any, allowed: tuple[str, ...]) -> str:
    text = str(value).strip().upper().replace("-", "_")
    if text not in allowed:
        raise ConfigError(key, value, ", ".join(allowed))
    return text


@dataclass(frozen=True)
class SettingsGroup:
    """The keys one owner reads: suffix (after :data:`PREFIX`) -> (field name, parser)."""

    owner: str
    keys: Mapping[str, tuple[str, Parser]]

    def parse(self, get: Callable[[str], Any]) -> dict[str, Any]:
        """Every key of the group that is set, parsed: field name -> value (a ConfigError names
        the full key of a bad value)."""
        values: dict[str, Any] = {}
        for suffix, (name, parse) in self.keys.items():
            raw = get(PREFIX + suffix)
            if raw is not None and str(raw).strip() != "":
                values[name] = parse(PREFIX + suffix, raw)
        return values

    @property
    def full_keys(self) -> tuple[str, ...]:
        return tuple(PREFIX + suffix for suffix in self.keys)


def check_known_keys(
    keys: Iterable[str], groups: Iterable[SettingsGroup], get: Callable[[str], Any] = lambda key: None
) -> None:
    """Raise an UnknownSettingError for the first key under :data:`PREFIX` that no group knows,
    naming it, its value and the closest known key."""
    groups = tuple(groups)
    known = dict.fromkeys(suffix for group in groups for suffix in group.keys)  # in order
    for key in sorted(keys):
        if not key.startswith(PREFIX) or key[len(PREFIX) :] in known:
            continue
        every = tuple(PREFIX + suffix for suffix in known)
        close = difflib.get_close_matches(key, every, n=1, cutoff=0.6)
        listed = ", ".join(known)
        raise UnknownSettingError(key, get(key), close[0] if close else None, f"{PREFIX}{{{listed}}}")

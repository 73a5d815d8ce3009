"""Settings named after Flink's ``table.exec.async-lookup.*``, under ``spark.sql.exec.async-lookup.*``.

Pure parsing and validation (no pyspark): the Spark layer reads the raw strings from the session
conf (or a task's local properties) and hands them here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .exceptions import ConfigError
from .retry import RetryStrategy, lookup_miss

__all__ = ["PREFIX", "AsyncLookupConfig", "parse_bool", "parse_duration"]

PREFIX = "spark.sql.exec.async-lookup."

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


def _parse_int(key: str, value: Any, minimum: int = 1) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ConfigError(key, value, f"an integer >= {minimum}") from None
    if number < minimum:
        raise ConfigError(key, value, f"an integer >= {minimum}")
    return number


def _choice(key: str, value: Any, allowed: tuple[str, ...]) -> str:
    text = str(value).strip().upper().replace("-", "_")
    if text not in allowed:
        raise ConfigError(key, value, ", ".join(allowed))
    return text


@dataclass(frozen=True)
class AsyncLookupConfig:
    """The async-lookup settings, with Flink's defaults."""

    buffer_capacity: int = 100
    timeout: float = 180.0
    output_mode: str = "ORDERED"  # or ALLOW_UNORDERED
    key_ordered_enabled: bool = False
    retry_predicate: str | None = None  # lookup_miss
    retry_strategy: str | None = None  # fixed_delay | exponential_backoff
    fixed_delay: float = 1.0
    max_attempts: int = 3
    initial_delay: float = 1.0
    max_delay: float = 60.0
    multiplier: float = 2.0
    cache: str | None = None  # PARTIAL
    cache_max_rows: int | None = None
    cache_expire_after_write: float | None = None
    cache_expire_after_access: float | None = None
    cache_missing_key: bool = True

    @classmethod
    def from_conf(cls, get: Callable[[str], str | None]) -> AsyncLookupConfig:
        """Read every known key with ``get(full_key)`` (None when unset); validate each."""
        values: dict[str, Any] = {}
        for suffix, (name, parse) in _KEYS.items():
            raw = get(PREFIX + suffix)
            if raw is not None and str(raw).strip() != "":
                values[name] = parse(PREFIX + suffix, raw)
        return cls(**values)

    @classmethod
    def from_mapping(cls, conf: Mapping[str, Any]) -> AsyncLookupConfig:
        return cls.from_conf(lambda key: conf.get(key))

    def retry(self) -> RetryStrategy | None:
        """The retry strategy the settings describe (None: no retries)."""
        predicate = lookup_miss if self.retry_predicate == "LOOKUP_MISS" else None
        if self.retry_strategy is None:
            return None
        if self.retry_strategy == "FIXED_DELAY":
            return RetryStrategy.fixed_delay(self.max_attempts, self.fixed_delay, retry_on_result=predicate)
        return RetryStrategy.exponential_backoff(
            self.max_attempts, self.initial_delay, self.max_delay, self.multiplier, retry_on_result=predicate
        )


_KEYS: dict[str, tuple[str, Callable[[str, Any], Any]]] = {
    "buffer-capacity": ("buffer_capacity", _parse_int),
    "timeout": ("timeout", parse_duration),
    "output-mode": ("output_mode", lambda k, v: _choice(k, v, ("ORDERED", "ALLOW_UNORDERED"))),
    "key-ordered-enabled": ("key_ordered_enabled", parse_bool),
    "retry-predicate": ("retry_predicate", lambda k, v: _choice(k, v, ("LOOKUP_MISS",))),
    "retry-strategy": ("retry_strategy", lambda k, v: _choice(k, v, ("FIXED_DELAY", "EXPONENTIAL_BACKOFF"))),
    "fixed-delay": ("fixed_delay", parse_duration),
    "max-attempts": ("max_attempts", _parse_int),
    "initial-delay": ("initial_delay", parse_duration),
    "max-delay": ("max_delay", parse_duration),
    "backoff-multiplier": ("multiplier", lambda k, v: float(_parse_int(k, v))),
    "cache": ("cache", lambda k, v: _choice(k, v, ("NONE", "PARTIAL"))),
    "partial-cache.max-rows": ("cache_max_rows", _parse_int),
    "partial-cache.expire-after-write": ("cache_expire_after_write", parse_duration),
    "partial-cache.expire-after-access": ("cache_expire_after_access", parse_duration),
    "partial-cache.cache-missing-key": ("cache_missing_key", parse_bool),
}
ALL_KEYS = tuple(PREFIX + suffix for suffix in _KEYS)

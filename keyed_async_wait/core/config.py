"""Settings named after Flink's ``table.exec.async-lookup.*``, under ``spark.sql.exec.async-lookup.*``.

Pure parsing and validation (no pyspark): the Spark layer reads the raw strings from the session
conf (or a task's local properties) and hands them here.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .elements import OutputMode
from .exceptions import ConfigError, UnknownSettingError
from .retry import RetryStrategy, lookup_miss
from .settings import OperatorSettings

__all__ = ["ALL_KEYS", "PREFIX", "AsyncLookupConfig", "check_known_keys", "parse_bool", "parse_duration"]

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


def _parse_multiplier(key: str, value: Any) -> float:
    """A float >= 1, as Flink takes it (``1.5``)."""
    try:
        number = float(str(value).strip())
    except ValueError:
        raise ConfigError(key, value, "a number >= 1, e.g. 1.5 or 2") from None
    if not math.isfinite(number) or number < 1:
        raise ConfigError(key, value, "a number >= 1, e.g. 1.5 or 2")
    return number


def _parse_rate(key: str, value: Any) -> float:
    try:
        number = float(str(value).strip())
    except ValueError:
        raise ConfigError(key, value, "calls per second > 0, e.g. 200 or 12.5") from None
    if not math.isfinite(number) or number <= 0:
        raise ConfigError(key, value, "calls per second > 0, e.g. 200 or 12.5")
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
    rate_limit: float | None = None  # calls per second per worker process, for SQL sources
    adaptive_concurrency: bool = False
    breaker_failures: int | None = None
    breaker_cool_off: float = 5.0

    @classmethod
    def from_conf(
        cls, get: Callable[[str], str | None], present: Iterable[str] | None = None
    ) -> AsyncLookupConfig:
        """Read every known key with ``get(full_key)`` (None when unset); validate each.

        ``present``: every key that is set (or a superset); one under :data:`PREFIX` that is
        not a known key is an error naming it and the closest known key, never ignored.
        """
        if present is not None:
            check_known_keys(present, get)
        values: dict[str, Any] = {}
        for suffix, (name, parse) in _KEYS.items():
            raw = get(PREFIX + suffix)
            if raw is not None and str(raw).strip() != "":
                values[name] = parse(PREFIX + suffix, raw)
        return cls(**values)

    @classmethod
    def from_mapping(cls, conf: Mapping[str, Any]) -> AsyncLookupConfig:
        """From a mapping of full keys (unknown keys under :data:`PREFIX` are errors)."""
        return cls.from_conf(lambda key: conf.get(key), present=conf.keys())

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

    def operator_settings(
        self,
        mode: OutputMode,
        *,
        capacity: int | None = None,
        timeout: float | None = None,
        retry: RetryStrategy | None = None,
        **fixed: Any,
    ) -> OperatorSettings:
        """An operator's settings: capacity, timeout and retry from these settings unless given
        (not None), the rest (``fixed``) as given. The one place where the Python API and the
        SQL forms derive an operator's settings."""
        return OperatorSettings(
            mode=mode,
            capacity=self.buffer_capacity if capacity is None else capacity,
            timeout=self.timeout if timeout is None else timeout,
            retry=self.retry() if retry is None else retry,
            **fixed,
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
    "backoff-multiplier": ("multiplier", _parse_multiplier),
    "cache": ("cache", lambda k, v: _choice(k, v, ("NONE", "PARTIAL"))),
    "partial-cache.max-rows": ("cache_max_rows", _parse_int),
    "partial-cache.expire-after-write": ("cache_expire_after_write", parse_duration),
    "partial-cache.expire-after-access": ("cache_expire_after_access", parse_duration),
    "partial-cache.cache-missing-key": ("cache_missing_key", parse_bool),
    "rate-limit": ("rate_limit", _parse_rate),
    "adaptive-concurrency": ("adaptive_concurrency", parse_bool),
    "circuit-breaker.failures": ("breaker_failures", _parse_int),
    "circuit-breaker.cool-off": ("breaker_cool_off", parse_duration),
}
ALL_KEYS = tuple(PREFIX + suffix for suffix in _KEYS)


def check_known_keys(keys: Iterable[str], get: Callable[[str], Any] = lambda key: None) -> None:
    """Raise a ConfigError for the first key under :data:`PREFIX` that is not a known setting,
    naming it, its value and the closest known key."""
    for key in sorted(keys):
        if not key.startswith(PREFIX) or key[len(PREFIX) :] in _KEYS:
            continue
        close = difflib.get_close_matches(key, ALL_KEYS, n=1, cutoff=0.6)
        known = f"{PREFIX}{{{', '.join(_KEYS)}}}"
        raise UnknownSettingError(key, get(key), close[0] if close else None, known)

"""The lookups' session settings: a cache, a rate limit, an adaptive limit and a circuit breaker
for a SQL source that has none of its own, from ``spark.sql.exec.async-lookup.*`` (Flink's
``lookup.partial-cache.*`` names under that prefix).

:data:`LOOKUP_SETTINGS` is the group of keys; the Spark edge finds it through the
``keyed_async_wait.settings`` entry point (so a key of it is known, never an unknown setting),
and a lookup reads its values in :meth:`~lookup.Lookup.configured`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from keyed_async_wait.core.config import (
    SettingsGroup,
    parse_bool,
    parse_choice,
    parse_duration,
    parse_int,
    parse_rate,
)
from keyed_async_wait.core.spec import DEFAULT_CAPACITY, SessionSettings

from .cache import PartialCache
from .limits import Limits

__all__ = ["LOOKUP_SETTINGS", "LookupSettings"]


def _cache_kind(key: str, value: Any) -> str:
    return parse_choice(key, value, ("NONE", "PARTIAL"))


LOOKUP_SETTINGS: Final = SettingsGroup(
    "the lookups",
    {
        "cache": ("cache", _cache_kind),
        "partial-cache.max-rows": ("cache_max_rows", parse_int),
        "partial-cache.expire-after-write": ("cache_expire_after_write", parse_duration),
        "partial-cache.expire-after-access": ("cache_expire_after_access", parse_duration),
        "partial-cache.cache-missing-key": ("cache_missing_key", parse_bool),
        "rate-limit": ("rate_limit", parse_rate),
        "adaptive-concurrency": ("adaptive_concurrency", parse_bool),
        "circuit-breaker.failures": ("breaker_failures", parse_int),
        "circuit-breaker.cool-off": ("breaker_cool_off", parse_duration),
    },
)


@dataclass(frozen=True)
class LookupSettings:
    """What the session asks of a lookup without a cache or limits of its own."""

    cache: str | None = None  # PARTIAL
    cache_max_rows: int | None = None
    cache_expire_after_write: float | None = None
    cache_expire_after_access: float | None = None
    cache_missing_key: bool = True
    rate_limit: float | None = None  # calls per second per worker process
    adaptive_concurrency: bool = False
    breaker_failures: int | None = None
    breaker_cool_off: float = 5.0
    buffer_capacity: int = DEFAULT_CAPACITY  # the operator's capacity: the adaptive limit's ceiling

    @classmethod
    def from_conf(cls, get: Callable[[str], Any]) -> LookupSettings:
        """Every key of :data:`LOOKUP_SETTINGS` read with ``get(full_key)`` (None when unset),
        and the operator's capacity."""
        capacity = SessionSettings.from_conf(get).buffer_capacity
        return cls(**LOOKUP_SETTINGS.parse(get), buffer_capacity=capacity)

    @classmethod
    def from_mapping(cls, settings: Mapping[str, Any]) -> LookupSettings:
        return cls.from_conf(settings.get)

    @property
    def wants_cache(self) -> bool:
        return self.cache == "PARTIAL"

    @property
    def wants_limits(self) -> bool:
        return self.rate_limit is not None or self.adaptive_concurrency or self.breaker_failures is not None

    def policies(self, cache: PartialCache | None, limits: Limits | None) -> tuple[str, Any, Any]:
        """A lookup's cache and limits under these settings: its own where it has them, else
        those the settings describe; and an identity of what was added ("" when nothing)."""
        added = []
        if cache is None and self.wants_cache:
            cache = PartialCache(
                self.cache_max_rows or 10_000,
                expire_after_write=self.cache_expire_after_write,
                expire_after_access=self.cache_expire_after_access,
                cache_missing_key=self.cache_missing_key,
            )
            expiry = f"{self.cache_expire_after_write}/{self.cache_expire_after_access}"
            added.append(f"cache={cache.max_rows}/{expiry}/{self.cache_missing_key}")
        if limits is None and self.wants_limits:
            limits = Limits(
                rate=self.rate_limit,
                adaptive=self.adaptive_concurrency,
                max_concurrency=self.buffer_capacity,
                breaker_failures=self.breaker_failures,
                breaker_cool_off=self.breaker_cool_off,
            )
            added.append(f"limits={limits}")
        return " ".join(added), cache, limits

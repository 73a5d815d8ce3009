"""What the parts of a lookup share (:mod:`.base`, :mod:`.batched`, :mod:`.columnar`):
its counters and one loop turn."""

from __future__ import annotations

import types
from collections.abc import Generator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["LookupStats", "ReportsLookupStats", "suspend"]


@types.coroutine
def suspend() -> Generator[None, None, None]:
    """Give the loop one turn, so that an eagerly started call continues inside its task."""
    yield


@dataclass
class LookupStats:
    """Counters of one lookup instance in one process (read-only for callers)."""

    records: int = 0  # records asked for
    requests: int = 0  # calls to the service (one per GET, one per MGET or batch POST)
    keys_fetched: int = 0  # lookup keys asked of the service
    cache_hits: int = 0
    shared_cache_hits: int = 0  # answers found in the shared cache (L2, in Redis)
    shared_flight_waits: int = 0  # answers another worker's call in flight brought (single flight)
    deduplicated: int = 0  # records served by a request another record had made
    misses: int = 0  # answers that found nothing
    errors: int = 0


@runtime_checkable
class ReportsLookupStats(Protocol):
    """A lookup, or a function of the user's made of lookups (as ``kaw-enrich``'s), whose
    ``stats`` is a :class:`LookupStats`."""

    @property
    def stats(self) -> LookupStats: ...

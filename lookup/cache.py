"""A partial cache in the worker process, named after Flink's ``lookup.partial-cache.*``."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Final

from .exceptions import LookupOptionError

__all__ = ["MISS", "PartialCache"]


class _Miss:
    def __repr__(self) -> str:
        return "MISS"


MISS: Final = _Miss()  # what get() returns when the key is not cached


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0


class PartialCache:
    """LRU with ``max_rows``, ``expire_after_write`` and ``expire_after_access`` (seconds), and
    whether to cache a miss (``cache_missing_key``, Flink's default True).

    Values are stored as given; a lookup miss is stored as None when ``cache_missing_key``.
    Pure apart from the clock, which tests may replace.
    """

    def __init__(
        self,
        max_rows: int = 10_000,
        *,
        expire_after_write: float | None = None,
        expire_after_access: float | None = None,
        cache_missing_key: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_rows < 1:
            raise LookupOptionError(
                "lookup.partial-cache.max-rows",
                f"lookup.partial-cache.max-rows={max_rows}; allowed: an integer >= 1",
            )
        for name, value in (
            ("expire-after-write", expire_after_write),
            ("expire-after-access", expire_after_access),
        ):
            if value is not None and value <= 0:
                raise LookupOptionError(
                    f"lookup.partial-cache.{name}",
                    f"lookup.partial-cache.{name}={value}; allowed: seconds > 0, or unset",
                )
        self.max_rows = max_rows
        self.expire_after_write = expire_after_write
        self.expire_after_access = expire_after_access
        self.cache_missing_key = cache_missing_key
        self.clock = clock
        self.stats = CacheStats()
        # key -> [value, written_at, accessed_at]
        self._rows: OrderedDict[Hashable, list[Any]] = OrderedDict()
        self._timed = expire_after_write is not None or expire_after_access is not None

    def get(self, key: Hashable) -> Any:
        row = self._rows.get(key)
        if row is None:
            self.stats.misses += 1
            return MISS
        if self._timed:
            now = self.clock()
            if (self.expire_after_write is not None and now - row[1] >= self.expire_after_write) or (
                self.expire_after_access is not None and now - row[2] >= self.expire_after_access
            ):
                del self._rows[key]
                self.stats.misses += 1
                return MISS
            row[2] = now
        self._rows.move_to_end(key)
        self.stats.hits += 1
        return row[0]

    def get_many(self, keys: list[Hashable]) -> list[Any]:
        """:meth:`get` for many keys (``MISS`` where absent)."""
        if self._timed:
            return [self.get(key) for key in keys]
        rows, move, miss = self._rows, self._rows.move_to_end, MISS
        out: list[Any] = []
        append = out.append
        hits = 0
        for key in keys:
            row = rows.get(key)
            if row is None:
                append(miss)
            else:
                move(key)
                append(row[0])
                hits += 1
        self.stats.hits += hits
        self.stats.misses += len(keys) - hits
        return out

    def put(self, key: Hashable, value: Any) -> None:
        if value is None and not self.cache_missing_key:
            return
        now = self.clock() if self._timed else 0.0
        rows = self._rows
        rows[key] = [value, now, now]
        rows.move_to_end(key)
        if len(rows) > self.max_rows:
            rows.popitem(last=False)
            self.stats.evictions += 1

    def __len__(self) -> int:
        return len(self._rows)

    def clear(self) -> None:
        self._rows.clear()

    def __getstate__(self) -> dict[str, Any]:
        # a cache travels to executors empty: its rows belong to the process that filled them
        state = self.__dict__.copy()
        state["_rows"] = OrderedDict()
        state["stats"] = CacheStats()
        return state

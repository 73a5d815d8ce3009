"""A lookup's batch calls: many records, their distinct keys, one call to the service."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from .cache import MISS
from .exceptions import LookupServiceError
from .parts import LookupParts, suspend

__all__ = ["BatchedLookups"]


class BatchedLookups(LookupParts):
    """``invoke_batch`` of a lookup that batches: cache, deduplication and one call per batch."""

    def request_keys(self, records: list[Any]) -> list[Hashable | LookupServiceError]:
        """:meth:`request_key` for many records; a record without one gets its error."""
        return self._request_keys_checked(records)[0]

    def _request_keys_checked(self, records: list[Any]) -> tuple[list[Hashable | LookupServiceError], bool]:
        """(:meth:`request_keys`, whether every record has a key): the common case in one pass."""
        try:
            return self._request_keys_fast(records), True  # raises rather than give an error
        except LookupServiceError:
            pass
        keys: list[Hashable | LookupServiceError] = []
        for record in records:
            try:
                keys.append(self.request_key(record))
            except LookupServiceError as exc:
                keys.append(exc)
        return keys, not any(isinstance(key, LookupServiceError) for key in keys)

    async def _invoke_batch(self, records: list[Any]) -> list[Any]:
        stats, cache = self.stats, self.cache
        stats.records += len(records)
        keys, every_key = self._request_keys_checked(records)
        if cache is None and every_key and len(dict.fromkeys(keys)) == len(keys):
            return await self._fetch_distinct(keys)
        out: list[Any] = [None] * len(records)
        cached = cache.get_many(keys) if cache is not None else None
        wanted: dict[Hashable, Any] = {}  # key -> index, or a list of indexes when repeated
        repeated = False
        plain = self.mapper.fields is None and self.mapper.result_path is None
        hits = 0
        value: Any
        for i, key in enumerate(keys):
            if cached is not None:
                value = cached[i]
                if value is not MISS:
                    hits += 1
                    out[i] = ([] if value is None else [value]) if plain else self._mapped(value, key)
                    continue
            if isinstance(key, LookupServiceError):
                out[i] = key
                continue
            slot = wanted.setdefault(key, i)
            if slot != i:
                repeated = True
                stats.deduplicated += 1
                wanted[key] = [*slot, i] if isinstance(slot, list) else [slot, i]
        stats.cache_hits += hits
        if not wanted:
            return out
        await suspend()
        unique = list(wanted)
        answers = await self._fetch_counted(unique)
        if isinstance(answers, LookupServiceError):
            for slot in wanted.values():
                for i in slot if isinstance(slot, list) else (slot,):
                    out[i] = answers
            return out
        for key, answer in zip(unique, answers, strict=True):
            if isinstance(answer, BaseException):
                stats.errors += 1
                value = answer
            else:
                if cache is not None:
                    cache.put(key, answer)
                if answer is None:
                    stats.misses += 1
                    value = []
                elif plain:
                    value = [answer]
                else:
                    value = self._mapped(answer, key)
            slot = wanted[key]
            if repeated and isinstance(slot, list):
                for i in slot:
                    out[i] = value
            else:
                out[slot] = value
        return out

    def _mapped_all(self, keys: list[Any], answers: list[Any]) -> list[Any]:
        """Each answer mapped (as :meth:`_mapped`), a miss or an error left as it is: in one
        comprehension while no answer fails to map, else one by one so each gets its error."""
        try:
            return self.mapper.map_all(answers, keys, self.service)
        except LookupServiceError:
            return [
                a if a is None or isinstance(a, BaseException) else self._mapped(a, k)
                for k, a in zip(keys, answers, strict=True)
            ]

    async def _fetch_distinct(self, keys: list[Any]) -> list[Any]:
        """Distinct keys (none an error), no cache: one request, answers mapped straight onto
        the records."""
        await suspend()
        stats = self.stats
        answers = await self._fetch_counted(keys)
        if isinstance(answers, LookupServiceError):
            return [answers] * len(keys)
        if self.mapper.fields is None and self.mapper.result_path is None:
            out = [[a] if a is not None and not isinstance(a, BaseException) else a for a in answers]
        else:
            out = self._mapped_all(keys, answers)
        if list(map(type, out)).count(list) == len(out):
            return out  # every key found (the common case, counted in C)
        misses = 0
        for i, value in enumerate(out):
            if value is None:
                out[i] = []
                misses += 1
            elif isinstance(value, BaseException):
                stats.errors += 1
        stats.misses += misses
        return out

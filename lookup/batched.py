"""A lookup's batch calls: many records, their distinct keys, one call to the service.

:func:`invoke_batch` is what a batching lookup's ``invoke_batch`` runs (the cache, in-flight
deduplication within the batch, one ``fetch_many`` for the keys left); it answers per record a
result list or that record's error, never raises for one record's problem.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from .cache import MISS
from .exceptions import LookupServiceError
from .parts import suspend

Lookup = Any  # a lookup.Lookup (not imported: the lookup imports this module)

__all__ = ["invoke_batch", "request_keys_checked"]


def request_keys_checked(
    lookup: Lookup, records: list[Any]
) -> tuple[list[Hashable | LookupServiceError], bool]:
    """Per record its key, or its error when it has none; and whether every record has one
    (the common case, in one pass)."""
    try:
        return lookup.request_keys(records), True  # raises rather than give an error
    except LookupServiceError:
        pass
    keys: list[Hashable | LookupServiceError] = []
    for record in records:
        try:
            keys.append(lookup.request_key(record))
        except LookupServiceError as exc:
            keys.append(exc)
    return keys, not any(isinstance(key, LookupServiceError) for key in keys)


async def invoke_batch(lookup: Lookup, records: list[Any]) -> list[Any]:
    stats, cache = lookup.stats, lookup.cache
    stats.records += len(records)
    keys, every_key = request_keys_checked(lookup, records)
    if cache is None and every_key and len(dict.fromkeys(keys)) == len(keys):
        return await _fetch_distinct(lookup, keys, lookup._units(records, len(keys)))
    out: list[Any] = [None] * len(records)
    cached = cache.get_many(keys) if cache is not None else None
    wanted: dict[Hashable, Any] = {}  # key -> index, or a list of indexes when repeated
    repeated = False
    plain = lookup.mapper.fields is None and lookup.mapper.result_path is None
    hits = 0
    value: Any
    for i, key in enumerate(keys):
        if cached is not None:
            value = cached[i]
            if value is not MISS:
                hits += 1
                out[i] = ([] if value is None else [value]) if plain else lookup._mapped(value, key)
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
    firsts = [records[slot[0] if isinstance(slot, list) else slot] for slot in wanted.values()]
    answers = await lookup._fetch_counted(unique, lookup._units(firsts, len(unique)))
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
                value = lookup._mapped(answer, key)
        slot = wanted[key]
        if repeated and isinstance(slot, list):
            for i in slot:
                out[i] = value
        else:
            out[slot] = value
    return out


def _mapped_all(lookup: Lookup, keys: list[Any], answers: list[Any]) -> list[Any]:
    """Each answer mapped (as :meth:`Lookup._mapped`), a miss or an error left as it is: in one
    comprehension while no answer fails to map, else one by one so each gets its error."""
    try:
        return lookup.mapper.map_all(answers, keys, lookup.service_name)
    except LookupServiceError:
        return [
            a if a is None or isinstance(a, BaseException) else lookup._mapped(a, k)
            for k, a in zip(keys, answers, strict=True)
        ]


async def _fetch_distinct(lookup: Lookup, keys: list[Any], units: float | None) -> list[Any]:
    """Distinct keys (none an error), no cache: one request, answers mapped straight onto the
    records."""
    await suspend()
    stats = lookup.stats
    answers = await lookup._fetch_counted(keys, units)
    if isinstance(answers, LookupServiceError):
        return [answers] * len(keys)
    if lookup.mapper.fields is None and lookup.mapper.result_path is None:
        out = [[a] if a is not None and not isinstance(a, BaseException) else a for a in answers]
    else:
        out = _mapped_all(lookup, keys, answers)
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

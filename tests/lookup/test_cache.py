"""The partial cache (pure, with a fake clock)."""

from __future__ import annotations

import pickle

import pytest

from lookup import PartialCache
from lookup.cache import MISS


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_lru_evicts_the_least_recently_used() -> None:
    cache = PartialCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1
    cache.put("c", 3)
    assert cache.get("b") is MISS and cache.get("a") == 1 and cache.get("c") == 3
    assert cache.stats.evictions == 1


def test_expire_after_write_and_after_access() -> None:
    clock = Clock()
    cache = PartialCache(10, expire_after_write=10, expire_after_access=3, clock=clock)
    cache.put("a", 1)
    for t in (2, 4, 6, 8):
        clock.now = t
        assert cache.get("a") == 1  # kept alive by access
    clock.now = 10
    assert cache.get("a") is MISS  # written 10 s ago
    cache.put("b", 2)
    clock.now = 13.5
    assert cache.get("b") is MISS  # not accessed for 3.5 s


def test_misses_are_cached_unless_told_not_to() -> None:
    assert PartialCache(5).put("x", None) is None
    yes = PartialCache(5)
    yes.put("x", None)
    assert yes.get("x") is None
    no = PartialCache(5, cache_missing_key=False)
    no.put("x", None)
    assert no.get("x") is MISS


def test_bad_options_name_flinks_keys() -> None:
    with pytest.raises(ValueError, match=r"lookup\.partial-cache\.max-rows=0"):
        PartialCache(0)
    with pytest.raises(ValueError, match=r"lookup\.partial-cache\.expire-after-write=-1"):
        PartialCache(5, expire_after_write=-1)


def test_a_pickled_cache_arrives_empty() -> None:
    cache = PartialCache(5)
    cache.put("a", 1)
    assert len(pickle.loads(pickle.dumps(cache))) == 0

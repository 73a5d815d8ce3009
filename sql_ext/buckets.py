"""Bucket values that Spark's shuffle spreads evenly over its partitions.

An update stream is partitioned into ``buckets`` groups of keys. Spark places a group by a
Murmur3 hash of the group's value, modulo the shuffle partitions: with 4 groups named 0..3 over
2 partitions, one task got 3 of them (75% of the rows, measured). So each bucket ``b`` is named
by a value ``spread[b]`` chosen so that consecutive buckets land on consecutive partitions
(round robin): any bucket count is then spread as evenly as it can be over the partitions the
session had when the functions were installed. Correctness never depends on it: a key is in
one bucket whatever the values are.
"""

from __future__ import annotations

__all__ = ["DEFAULT_BUCKETS", "MAX_SPREAD", "bucket_expression", "bucketing", "murmur3_int", "spread_values"]

MAX_SPREAD = 1024  # more buckets than this: plain numbers (many groups spread well by chance)
DEFAULT_BUCKETS = 16  # without buckets => and without a numeric spark.sql.shuffle.partitions
_MASK = 0xFFFFFFFF


def _rotl(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (32 - bits))) & _MASK


def murmur3_int(value: int, seed: int = 42) -> int:
    """Spark's ``hash(CAST(value AS INT))``: Murmur3 x86_32 of one int, seed 42, signed."""
    k1 = (value & _MASK) * 0xCC9E2D51 & _MASK
    k1 = _rotl(k1, 15) * 0x1B873593 & _MASK
    h1 = (seed ^ k1) & _MASK
    h1 = (_rotl(h1, 13) * 5 + 0xE6546B64) & _MASK
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & _MASK
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & _MASK
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def spread_values(partitions: int, count: int = MAX_SPREAD) -> list[int]:
    """``count`` distinct ints; the ``i``-th lands on shuffle partition ``i % partitions``."""
    partitions = max(1, partitions)
    by_partition: list[list[int]] = [[] for _ in range(partitions)]
    wanted = -(-count // partitions)  # values per partition
    candidate = 0
    while any(len(values) < wanted for values in by_partition):
        slot = murmur3_int(candidate) % partitions
        if len(by_partition[slot]) < wanted:
            by_partition[slot].append(candidate)
        candidate += 1
    return [by_partition[i % partitions][i // partitions] for i in range(count)]


def bucket_expression(hashed: str, count: int, spread: list[int] | None) -> str:
    """The SQL value naming a row's bucket: ``spread[pmod(hash(key), count)]``."""
    bucket = f"pmod(hash({hashed}), {count})"
    if not spread or count > len(spread):
        return bucket
    values = ", ".join(str(v) for v in spread[:count])
    return f"element_at(array({values}), {bucket} + 1)"


def bucketing(partitions: str, slots: int) -> tuple[list[int] | None, int]:
    """For the session's ``spark.sql.shuffle.partitions`` (a number, or e.g. "auto" on some
    platforms) and the cluster's task slots: the bucket values, and the default bucket count,
    one per task slot (at most one per partition, and :data:`MAX_SPREAD`): the buckets land on
    partitions of their own, so each task that runs holds one group, as many keys as it can, all
    arriving interleaved. (One per shuffle partition, 200 by default, would give each running
    task a two-hundredth of the keys on a small cluster.)"""
    if not partitions.isdigit() or int(partitions) < 1:
        return None, max(1, min(slots, MAX_SPREAD)) if slots > 0 else DEFAULT_BUCKETS
    count = int(partitions)
    return spread_values(count), max(1, min(slots, count, MAX_SPREAD))

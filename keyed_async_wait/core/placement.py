"""Which partition each key of a key-ordered wait goes to, given its rows: decisions only.

A key-ordered job lasts as long as its fullest partition. Two ways to even the partitions out,
and the choice between them:

- :func:`lpt`: every key placed anew, heaviest first, each to the partition with the fewest
  rows so far (greedy LPT: the fullest partition is within 4/3 of the best split);
- :func:`rebalanced`: the keys stay where Spark's hash put them, and keys move from the fullest
  partition to the emptiest while a move narrows the gap (each time the largest key that fits
  in half of it), so only a few keys move: what moves has to be written into the plan;
- :func:`assignment`: the rebalanced placement unless the LPT one is more than 1% emptier at
  its fullest.

Invariants: every key gets exactly one partition in ``range(partitions)``; a key that may not
move (``movable`` false: a key Spark's equality cannot match, as a NULL one) keeps its start;
the fullest partition after :func:`rebalanced` never holds more rows than at the start.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right, insort
from collections.abc import Sequence

__all__ = ["assignment", "lpt", "rebalanced"]

SLACK = 0.01  # how much fuller (a share) the rebalanced placement may be than LPT's


def lpt(rows: Sequence[int], partitions: int, loads: Sequence[int] | None = None) -> list[int]:
    """The partition of each key, given its rows: heaviest first, each to the partition with
    the fewest rows so far (ties: the lowest partition); ``loads``: rows the partitions hold
    already (keys that do not move)."""
    heap = [(load, p) for p, load in enumerate(loads or [0] * partitions)]
    heapq.heapify(heap)
    placed = [0] * len(rows)
    for i in sorted(range(len(rows)), key=lambda i: -rows[i]):
        load, p = heapq.heappop(heap)
        placed[i] = p
        heapq.heappush(heap, (load + rows[i], p))
    return placed


def rebalanced(
    rows: Sequence[int], start: Sequence[int], partitions: int, movable: Sequence[bool] | None = None
) -> list[int]:
    """Each key's partition: its ``start``, unless moving it from the fullest partition to the
    emptiest narrows their gap (the largest key of the fullest partition with at most half the
    gap, else its smallest key if that is under the gap, while there is one). Every move lowers
    the sum of the squared loads, so it ends; at the end the fullest partition is at most the
    emptiest plus its smallest movable key."""
    placed = list(start)
    loads = [0] * partitions
    pools: list[list[tuple[int, int]]] = [[] for _ in range(partitions)]  # (rows, key), ascending
    for i, (count, p) in enumerate(zip(rows, start, strict=True)):
        loads[p] += count
        if movable is None or movable[i]:
            pools[p].append((count, i))
    for pool in pools:
        pool.sort()
    fullest = [(-load, p) for p, load in enumerate(loads)]
    emptiest = [(load, p) for p, load in enumerate(loads)]
    heapq.heapify(fullest)
    heapq.heapify(emptiest)
    while True:
        while -fullest[0][0] != loads[fullest[0][1]]:  # entries left by earlier moves
            heapq.heappop(fullest)
        while emptiest[0][0] != loads[emptiest[0][1]]:
            heapq.heappop(emptiest)
        heavy, light = fullest[0][1], emptiest[0][1]
        gap = loads[heavy] - loads[light]
        pool = pools[heavy]
        fits = bisect_right(pool, (gap // 2, len(rows))) - 1
        if fits < 0 and pool and pool[0][0] < gap:
            fits = 0  # none fits in half the gap: the smallest key still narrows it
        if fits < 0 or pool[fits][0] <= 0:
            return placed
        count, key = pool.pop(fits)
        placed[key] = light
        insort(pools[light], (count, key))
        loads[heavy] -= count
        loads[light] += count
        heapq.heappush(fullest, (-loads[heavy], heavy))
        heapq.heappush(fullest, (-loads[light], light))
        heapq.heappush(emptiest, (loads[heavy], heavy))
        heapq.heappush(emptiest, (loads[light], light))


def assignment(
    rows: Sequence[int], start: Sequence[int], partitions: int, movable: Sequence[bool] | None = None
) -> list[int]:
    """:func:`rebalanced`, unless :func:`lpt` (the keys that may not move kept at their start)
    leaves its fullest partition more than :data:`SLACK` emptier."""
    moved = rebalanced(rows, start, partitions, movable)
    free = [i for i in range(len(rows)) if movable is None or movable[i]]
    fixed = [0] * partitions
    for i in range(len(rows)):
        if movable is not None and not movable[i]:
            fixed[start[i]] += rows[i]
    anew = list(start)
    for i, p in zip(free, lpt([rows[i] for i in free], partitions, fixed), strict=True):
        anew[i] = p
    if _fullest(rows, anew, partitions) < _fullest(rows, moved, partitions) * (1 - SLACK):
        return anew
    return moved


def _fullest(rows: Sequence[int], placed: Sequence[int], partitions: int) -> int:
    loads = [0] * partitions
    for count, p in zip(rows, placed, strict=True):
        loads[p] += count
    return max(loads, default=0)

"""The service's call log, read per order id: did one key's calls overlap, or start out of order?"""

from __future__ import annotations

import itertools
from collections import defaultdict
from typing import Any


def per_key_calls(calls: list[Any]) -> dict[str, list[tuple[float, float, int]]]:
    """Per order id (the ``order`` query parameter), its calls as (start, end, seq), by start."""
    spans: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    for _, start, end, query in calls:
        spans[query["order"]].append((start, end, int(query["seq"])))
    for key in spans:
        spans[key].sort()
    return spans


def overlaps_and_disorder(calls: list[Any]) -> tuple[int, int]:
    """How often a key's call started before its previous one ended, or out of seq order."""
    overlapping = disordered = 0
    for spans in per_key_calls(calls).values():
        for a, b in itertools.pairwise(spans):
            overlapping += b[0] < a[1]
            disordered += b[2] < a[2]
    return overlapping, disordered


def peak_concurrency(calls: list[Any]) -> int:
    """The most calls the service had in flight at once."""
    edges = sorted([(start, 1) for _, start, _, _ in calls] + [(end, -1) for _, _, end, _ in calls])
    peak = now = 0
    for _, step in edges:  # an end sorts before a start at the same instant
        now += step
        peak = max(peak, now)
    return peak

"""Where a key-ordered wait's keys go by their rows (``core.placement``): every key somewhere,
the keys that may not move where they started, the fullest partition never fuller than the
hash left it, and within 1% of the greedy LPT placement."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from keyed_async_wait.core.placement import SLACK, assignment, lpt, rebalanced

KEYS = st.integers(1, 60).flatmap(
    lambda n: st.tuples(
        st.lists(st.integers(1, 1_000), min_size=n, max_size=n),  # each key's rows
        st.lists(st.integers(0, 7), min_size=n, max_size=n),  # where its hash puts it
        st.lists(st.booleans(), min_size=n, max_size=n),  # whether it may move
    )
)


def _loads(rows: list[int], placed: list[int], partitions: int) -> list[int]:
    loads = [0] * partitions
    for count, p in zip(rows, placed, strict=True):
        loads[p] += count
    return loads


@given(keys=KEYS, partitions=st.integers(1, 8))
def test_rebalanced_moves_only_what_may_move_and_never_fills_the_fullest_more(
    keys: tuple[list[int], list[int], list[bool]], partitions: int
) -> None:
    rows, start, movable = keys
    start = [p % partitions for p in start]
    placed = rebalanced(rows, start, partitions, movable)
    assert all(0 <= p < partitions for p in placed)
    assert all(p == s for p, s, free in zip(placed, start, movable, strict=True) if not free)
    loads = _loads(rows, placed, partitions)
    assert sum(loads) == sum(rows)
    assert max(loads) <= max(_loads(rows, start, partitions))
    # it stopped because no key of the fullest partition fits in half the gap to the emptiest
    fullest, emptiest = loads.index(max(loads)), loads.index(min(loads))
    gap = loads[fullest] - loads[emptiest]
    assert not any(
        2 * count <= gap
        for count, p, free in zip(rows, placed, movable, strict=True)
        if free and p == fullest and gap > 0
    )


@given(keys=KEYS, partitions=st.integers(1, 8))
def test_the_assignment_is_within_the_slack_of_lpt_and_no_fuller_than_the_hash(
    keys: tuple[list[int], list[int], list[bool]], partitions: int
) -> None:
    rows, start, movable = keys
    start = [p % partitions for p in start]
    placed = assignment(rows, start, partitions, movable)
    assert all(p == s for p, s, free in zip(placed, start, movable, strict=True) if not free)
    fullest = max(_loads(rows, placed, partitions))
    assert fullest <= max(_loads(rows, start, partitions))
    fixed = _loads(
        [r for r, f in zip(rows, movable, strict=True) if not f],
        [s for s, f in zip(start, movable, strict=True) if not f],
        partitions,
    )
    free_rows = [r for r, f in zip(rows, movable, strict=True) if f]
    anew = list(start)
    free = [i for i, f in enumerate(movable) if f]
    for i, p in zip(free, lpt(free_rows, partitions, fixed), strict=True):
        anew[i] = p
    assert fullest * (1 - SLACK) <= max(_loads(rows, anew, partitions))


@given(rows=st.lists(st.integers(1, 1_000), max_size=60), partitions=st.integers(1, 8))
def test_keys_that_all_start_in_one_partition_end_up_spread(rows: list[int], partitions: int) -> None:
    placed = rebalanced(rows, [0] * len(rows), partitions)
    assert max(_loads(rows, placed, partitions), default=0) <= sum(rows) / partitions + max(rows, default=0)

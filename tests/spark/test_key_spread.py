"""The merge of the tasks' key hashes that checks ``assume_partitioned`` (pure, no session)."""

from __future__ import annotations

from functools import reduce

from hypothesis import given
from hypothesis import strategies as st

from keyed_async_wait.spark.key_spread import KeySpread

tasks_keys = st.lists(st.frozensets(st.integers(0, 30), max_size=12), max_size=6)


@given(tasks_keys)
def test_the_merge_keeps_exactly_the_keys_more_than_one_task_ran(tasks: list[frozenset[int]]) -> None:
    param = KeySpread()
    merged = reduce(param.addInPlace, [(keys, frozenset()) for keys in tasks], param.zero(None))  # type: ignore[arg-type]
    in_tasks = {key: sum(key in keys for keys in tasks) for key in set().union(*tasks)}
    assert merged[0] == frozenset(in_tasks)
    assert merged[1] == frozenset(key for key, n in in_tasks.items() if n > 1)


@given(tasks_keys, st.randoms())
def test_the_merge_does_not_depend_on_the_order_tasks_finish(
    tasks: list[frozenset[int]], rnd: object
) -> None:
    param = KeySpread()
    updates = [(keys, frozenset()) for keys in tasks]
    shuffled = list(updates)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    fold = lambda items: reduce(param.addInPlace, items, param.zero(None))  # noqa: E731
    assert fold(updates) == fold(shuffled)

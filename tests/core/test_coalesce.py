"""Coalescing (a write fenced by version, ``coalesce=True``): while a key's record runs, the
records that queue behind it collapse to the newest; the older leave at once, superseded, and
the key's last record always runs (property-tested over keys, latencies, failures)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keyed_async_wait import RetryStrategy
from keyed_async_wait.operator import KeyedAsyncWaitOperator, OutputMode

from .helpers import TurnsAction, collect, run

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class FencedWrites(TurnsAction):
    """A store fenced by version: a write applies only when its version (the record id) is newer
    than the one held for the key. It coalesces: a skipped record gets ``superseded``."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(result_of=self._apply, **kw)
        self.store: dict[Any, int] = {}
        self.log: list[tuple[Any, int, bool]] = []

    def _apply(self, record: dict) -> list[dict[str, Any]]:
        key, version = record["k"], record["id"]
        applied = version > self.store.get(key, -1)
        if applied:
            self.store[key] = version
        self.log.append((key, version, applied))
        return [{"id": version, "k": key, "outcome": "applied" if applied else "stale"}]

    async def invoke(self, record: dict) -> Any:  # the backend protocol: invoke, and superseded
        return await self(record)

    def superseded(self, record: dict) -> list[dict[str, Any]]:
        return [{"id": record["id"], "k": record["k"], "outcome": "superseded"}]


@st.composite
def updates(draw: st.DrawFn) -> list[dict[str, Any]]:
    n = draw(st.integers(0, 80))
    keys = draw(st.lists(st.sampled_from([0, 0, 0, 1, 1, 2, 3]), min_size=n, max_size=n))
    lats = draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))
    return [{"id": i, "k": keys[i], "lat": lats[i]} for i in range(n)]


@SETTINGS
@given(
    rows=updates(),
    capacity=st.integers(1, 6),
    bound=st.sampled_from([0, 2, 10_000]),
    fail=st.sets(st.tuples(st.integers(0, 79), st.integers(1, 2)), max_size=6),
)
def test_coalesced_updates_end_at_the_newest_and_never_go_back_in_time(
    rows: list[dict[str, Any]], capacity: int, bound: int, fail: set
) -> None:
    action = FencedWrites(fail=fail)
    op = KeyedAsyncWaitOperator(
        action,
        mode=OutputMode.KEY_ORDERED,
        key="k",
        capacity=capacity,
        blocked_capacity=bound,
        retry=RetryStrategy.fixed_delay(3, 0),
    )
    out = run(collect(op, rows))
    newest = {r["k"]: r["id"] for r in rows}
    assert action.store == newest  # where it would have ended without coalescing
    assert sorted(o["id"] for o in out) == [r["id"] for r in rows]  # every record leaves once
    by_key: dict[Any, list[int]] = defaultdict(list)
    for o in out:
        by_key[o["k"]].append(o["id"])
    assert all(ids == sorted(ids) for ids in by_key.values())  # each key's, in arrival order
    applied = defaultdict(list)
    for key, version, ok in action.log:
        if ok:
            applied[key].append(version)
    assert all(versions == sorted(versions) for versions in applied.values())  # never back in time
    assert action.max_running_per_key <= 1
    skipped = {o["id"] for o in out if o["outcome"] == "superseded"}
    assert not skipped & set(newest.values())  # a key's last record always runs
    assert not skipped & {version for _, version, _ in action.log}  # a superseded one never ran


def test_a_hot_key_of_updates_collapses_to_a_few_writes() -> None:
    action = FencedWrites()
    op = KeyedAsyncWaitOperator(action, mode="key_ordered", key="k", capacity=8)
    rows = [{"id": i, "k": 0, "lat": 3} for i in range(2_000)]
    out = run(collect(op, rows))
    assert action.store == {0: 1_999} and len(out) == 2_000
    assert len(action.log) <= 3  # the first, then the newest of all that queued meanwhile

"""A run's timers: disarming a batch at once is disarming each of its entries."""

from __future__ import annotations

import types
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keyed_async_wait.core.entry import Entry
from keyed_async_wait.runtime.timers import Timers

from .helpers import FakeLoop

TIMEOUT = 1.0

# per batch: when it started, and per entry whether it is disarmed (None: never armed)
batches = st.lists(
    st.tuples(
        st.sampled_from([0.0, 0.004, 0.02, 0.5]), st.lists(st.sampled_from([True, False, None]), max_size=8)
    ),
    max_size=6,
)


def _never(entry: Entry) -> None:
    raise AssertionError(f"no timer fires here ({entry!r})")


def armed(plan: list[tuple[float, list[bool | None]]]) -> tuple[Timers, FakeLoop, list[Entry], list[Entry]]:
    """Timers with ``plan``'s batches armed; the entries, and those to disarm (shuffled across
    batches, so one call may span buckets, and include entries never armed)."""
    loop = FakeLoop()
    run: Any = types.SimpleNamespace(spec=types.SimpleNamespace(timeout=TIMEOUT), loop=loop, closing=False)
    timers = Timers(run, expired=_never, retry_now=_never)
    entries, gone = [], []
    for started, marks in plan:
        batch = [Entry(len(entries) + i, None, i) for i in range(len(marks))]
        entries += batch
        for entry in batch:
            entry.started = started
        timers.arm_many([e for e, mark in zip(batch, marks, strict=True) if mark is not None], started)
        gone += [e for e, mark in zip(batch, marks, strict=True) if mark is not False]
    gone.sort(key=lambda e: (e.seq * 7919) % 13)  # a fixed shuffle
    return timers, loop, entries, gone


def state(timers: Timers, loop: FakeLoop, entries: list[Entry]) -> Any:
    assert timers.deadlines is not None
    members = {b: sorted(e.seq for e in m) for b, m in timers.deadlines._buckets.items()}
    wakeups = sorted(bucket for _, _, bucket in loop.timers.values())
    return members, wakeups, [e.timer for e in entries]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=batches, one_batch=st.booleans())
def test_disarm_many_is_disarm_each(plan: list[tuple[float, list[bool | None]]], one_batch: bool) -> None:
    if one_batch:  # the common case: one batch, armed together, disarmed together
        plan = plan[:1]
    many, many_loop, many_entries, many_gone = armed(plan)
    each, each_loop, each_entries, each_gone = armed(plan)

    many.disarm_many(many_gone)
    for entry in each_gone:
        each.disarm(entry)

    assert state(many, many_loop, many_entries) == state(each, each_loop, each_entries)
    assert all(e.timer is None for e in many_gone)


def test_a_batch_armed_together_is_disarmed_with_its_wakeup() -> None:
    timers, loop, entries, gone = armed([(0.0, [True] * 5)])
    assert len(loop.timers) == 1
    timers.disarm_many(gone)
    assert loop.timers == {} and all(e.timer is None for e in entries)

"""The timer wheel behind per-record timeouts (pure, with a fake scheduler)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from keyed_async_wait.core.deadlines import Deadlines

from .helpers import FakeLoop


@given(
    items=st.lists(st.tuples(st.floats(0, 10), st.booleans()), max_size=60),
    resolution=st.sampled_from([0.01, 0.05, 0.5]),
    now=st.floats(0, 12),
)
def test_expires_exactly_the_armed_items_whose_bucket_has_passed(
    items: list[tuple[float, bool]], resolution: float, now: float
) -> None:
    loop = FakeLoop()
    expired: list[int] = []
    wheel = Deadlines(resolution, loop.call_at, expired.append)
    buckets = {}
    for i, (deadline, _) in enumerate(items):
        buckets[i] = wheel.arm(i, deadline)
    for i, (_, disarm) in enumerate(items):
        if disarm:
            wheel.disarm(i, buckets[i])
    loop.run_until(now)
    expected = {
        i
        for i, (deadline, disarm) in enumerate(items)
        if not disarm and wheel.bucket_of(deadline) * resolution <= now
    }
    assert set(expired) == expected and len(expired) == len(expected)
    for i in expired:  # never early, at most one resolution late
        assert (
            items[i][0] <= now + 1e-9
            and wheel.bucket_of(items[i][0]) * resolution - items[i][0] <= resolution + 1e-9
        )
    assert len(wheel) == sum(1 for i, (_, d) in enumerate(items) if not d) - len(expired)
    live_timers = len(loop.timers)
    assert live_timers == len(
        {wheel.bucket_of(items[i][0]) for i in range(len(items)) if not items[i][1] and i not in expected}
    )


@given(
    groups=st.lists(
        st.tuples(st.floats(0, 10), st.lists(st.booleans(), max_size=8)), max_size=12
    ),  # (deadline, disarm?) per item of a batch armed together
    resolution=st.sampled_from([0.01, 0.05, 0.5]),
    now=st.floats(0, 12),
)
def test_arming_and_disarming_many_is_arming_and_disarming_each(
    groups: list[tuple[float, list[bool]]], resolution: float, now: float
) -> None:
    """A batch armed with one call and disarmed with one call per bucket expires the same
    items, at the same times, with the same timers left, as one call per item."""
    outcomes = []
    for many in (False, True):
        loop = FakeLoop()
        expired: list[int] = []
        wheel = Deadlines(resolution, loop.call_at, expired.append)
        armed: dict[int, int] = {}
        item = 0
        for deadline, disarms in groups:
            ids = list(range(item, item + len(disarms)))
            item += len(disarms)
            if many:
                bucket = wheel.arm_many(ids, deadline)
                armed.update((i, bucket) for i in ids)
            else:
                armed.update((i, wheel.arm(i, deadline)) for i in ids)
            gone = [i for i, d in zip(ids, disarms, strict=True) if d]
            if many and gone:
                wheel.disarm_many(gone, armed[gone[0]])
            else:
                for i in gone:
                    wheel.disarm(i, armed[i])
        loop.run_until(now)
        outcomes.append((sorted(expired), len(wheel), sorted(when for when, _, _ in loop.timers.values())))
    assert outcomes[0] == outcomes[1]

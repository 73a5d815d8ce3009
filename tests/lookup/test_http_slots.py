"""The lean client's request slots (lookup.http_slots): never more holders than slots, the line
served first come first served, and no slot lost to a cancellation, over random interleavings."""

from __future__ import annotations

import asyncio

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lookup.http_slots import Slots

from ..core.helpers import run

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# an action of the script: a newcomer that waits in line, one that only takes a free slot, a
# holder that gives its slot back, or a cancellation of the i-th task started (waiting or holding)
ACTIONS = st.one_of(
    st.just(("wait",)),
    st.just(("try",)),
    st.tuples(st.just("give"), st.integers(0, 20)),
    st.tuples(st.just("cancel"), st.integers(0, 20)),
)


async def settle() -> None:
    """Loop turns enough for every woken task to run (a wake-up is one callback)."""
    for _ in range(4):
        await asyncio.sleep(0)


async def play(size: int, script: list[tuple]) -> None:
    slots = Slots(size)
    holding: set[int] = set()
    took: list[int] = []  # in the order the waiting ones got a slot
    lined: list[int] = []  # in the order they began to wait
    done: dict[int, asyncio.Event] = {}
    tasks: list[asyncio.Task[None]] = []

    async def waiter(i: int) -> None:
        async with slots:
            holding.add(i)
            took.append(i)
            try:
                await done[i].wait()
            finally:
                holding.discard(i)

    async def taker(i: int) -> None:
        if not slots.take_now():
            return
        holding.add(i)
        try:
            await done[i].wait()
        finally:
            holding.discard(i)
            slots.give()

    try:
        for action in script:
            i = len(tasks)
            if action[0] in ("wait", "try"):
                done[i] = asyncio.Event()
                if action[0] == "wait" and slots.free == 0:
                    lined.append(i)
                tasks.append(
                    asyncio.get_running_loop().create_task((waiter if action[0] == "wait" else taker)(i))
                )
            elif tasks:
                target = action[1] % len(tasks)
                if action[0] == "give":
                    done[target].set()
                else:
                    tasks[target].cancel()
                    if target in lined and target not in took:
                        lined.remove(target)  # cancelled while waiting: never takes a slot
            await settle()
            assert len(holding) <= size
            assert slots.free + len(holding) == size, (slots.free, holding)
            assert slots.free == 0 or not slots._waiters  # a free slot and a line: never
            assert [t for t in took if t in lined] == lined[: len([t for t in took if t in lined])]
        for event in done.values():
            event.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)  # the line empties
        assert slots.free == size and not holding and not slots._waiters
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@SETTINGS
@given(size=st.integers(1, 4), script=st.lists(ACTIONS, max_size=30))
def test_slots_hold_their_count_and_their_line_over_any_interleaving(size: int, script: list[tuple]) -> None:
    run(play(size, script))


def test_a_slot_handed_to_a_waiter_cancelled_before_it_ran_goes_to_the_next() -> None:
    async def scene() -> None:
        slots = Slots(1)
        assert slots.take_now()
        first = asyncio.ensure_future(slots.take())
        second = asyncio.ensure_future(slots.take())
        await settle()
        assert not first.done() and not second.done()
        slots.give()  # to the first in line...
        first.cancel()  # ...cancelled before it could run
        await settle()
        assert first.cancelled() and second.done() and slots.free == 0
        assert not slots.take_now()
        slots.give()
        assert slots.free == 1

    run(scene())

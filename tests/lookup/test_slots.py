"""The request slots of the lean HTTP client: never more holders than slots, none lost."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from lookup.slots import Slots

from ..core.helpers import run

WAIT = 5.0

# per client: how long it holds its slot (in loop turns), and whether it is cancelled at once
# (waiting for a slot or holding one), a turn later (perhaps just as its slot came), or never
clients = st.lists(
    st.tuples(st.integers(0, 3), st.sampled_from(["never", "at once", "a turn later"])),
    min_size=1,
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(count=st.integers(1, 4), plan=clients)
def test_holders_never_exceed_the_slots_and_cancellations_lose_none(count: int, plan: list) -> None:
    async def main() -> None:
        slots = Slots(count, asyncio.get_running_loop())
        holders = 0
        most = 0

        async def client(turns: int) -> None:
            nonlocal holders, most
            async with slots:
                holders += 1
                most = max(most, holders)
                try:
                    for _ in range(turns):
                        await asyncio.sleep(0)
                finally:
                    holders -= 1

        tasks = []
        for turns, cancel in plan:
            task = asyncio.ensure_future(client(turns))
            tasks.append(task)
            await asyncio.sleep(0)  # it takes a slot or starts waiting
            if cancel == "at once":
                task.cancel()
            elif cancel == "a turn later":
                asyncio.get_running_loop().call_soon(task.cancel)
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), WAIT)
        assert most <= count
        assert holders == 0 and slots.free == count  # every slot came back

    run(main())


def test_a_free_slot_is_not_taken_past_a_waiter() -> None:
    async def main() -> None:
        slots = Slots(1, asyncio.get_running_loop())
        assert slots.try_take()
        waiter = asyncio.ensure_future(slots.take())
        await asyncio.sleep(0)
        slots.give()  # handed to the waiter, not to free
        assert not slots.try_take() and slots.free == 0
        await asyncio.wait_for(waiter, WAIT)
        slots.give()
        assert slots.free == 1

    run(main())

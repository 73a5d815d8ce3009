"""The function instances a worker process keeps: one per token; the idle instances of finished
plans closed beyond KEEP, least recently used first; never one a task holds; never one no task
acquired (the SQL functions')."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keyed_async_wait.spark.instances import KEEP, Instances


class Service:
    """An AsyncFunction-like object that counts its opens and closes."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.opened = self.closed = 0

    async def open(self) -> None:
        self.opened += 1

    async def close(self) -> None:
        self.closed += 1

    async def invoke(self, record: Any) -> list[Any]:
        return [record]


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    try:
        yield loop
    finally:
        loop.close()


def test_one_instance_per_token_opened_once(loop: asyncio.AbstractEventLoop) -> None:
    instances, service = Instances(loop), Service("a")
    first = instances.acquire("a", service)
    instances.release("a")
    assert instances.acquire("a", service) is first and service.opened == 1


def test_finished_plans_beyond_keep_are_closed_least_recently_used_first(
    loop: asyncio.AbstractEventLoop,
) -> None:
    instances = Instances(loop)
    services = [Service(str(i)) for i in range(KEEP + 4)]
    for service in services:
        instances.acquire(service.name, service)
        instances.release(service.name)
    instances.acquire("next", Service("next"))  # the idle ones are counted when a task comes
    assert [s.closed for s in services] == [1] * 4 + [0] * KEEP
    assert services[0].opened == 1
    again = instances.acquire("0", services[0])  # a plan used again after its instance closed
    assert services[0].opened == 2 and again is not None


def test_sql_instances_no_task_acquired_are_kept(loop: asyncio.AbstractEventLoop) -> None:
    instances = Instances(loop)
    sql = Service("sql")
    instances.function("sql:abc", sql)
    for i in range(KEEP * 2):
        instances.acquire(str(i), Service(str(i)))
        instances.release(str(i))
    assert sql.closed == 0 and instances.function("sql:abc", sql) in instances.held()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.booleans(), st.integers(0, KEEP + 6)), max_size=60))
def test_an_instance_a_task_holds_is_never_closed(steps: list[tuple[bool, int]]) -> None:
    loop = asyncio.new_event_loop()
    try:
        instances = Instances(loop)
        services = {i: Service(str(i)) for i in range(KEEP + 7)}
        holding: list[int] = []  # one entry per task holding a token
        adapters: dict[int, Any] = {}
        for start, i in steps:
            acquired = start or not holding
            if acquired:
                adapters[i] = instances.acquire(str(i), services[i])
                holding.append(i)
            else:
                instances.release(str(holding.pop(i % len(holding))))
            for held in set(holding):  # held instances are open (as many opens as closes, plus one)
                assert services[held].opened == services[held].closed + 1
            if acquired:  # a task came: at most KEEP idle ones are left open
                busy = {id(adapters[h]) for h in holding}
                assert len([a for a in instances.held() if id(a) not in busy]) <= KEEP
    finally:
        loop.close()

"""Opening a connection to a name with several addresses: Happy Eyeballs (RFC 8305), and a
short-lived cache of what a name resolves to.

asyncio's ``create_connection(happy_eyeballs_delay=...)`` does the racing on the standard
loop, but uvloop (the workers' loop with the ``fast`` extra) takes no such argument; this works
on both. Invariant: at most one connection comes out of a race; every other attempt is
cancelled, and one that connected anyway is handed to ``discard`` (so it is closed and counted
nowhere).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from collections.abc import Callable
from functools import partial
from typing import Any

__all__ = ["Resolver", "race"]

Address = tuple[str, int]


class Resolver:
    """What names resolve to, kept for ``ttl`` seconds per (host, port); an IP literal is
    itself. Addresses come interleaved by family (RFC 8305 6), first family first."""

    def __init__(self, ttl: float = 30.0) -> None:
        self.ttl = ttl
        self._known: dict[Address, tuple[float, list[Address]]] = {}

    async def addresses(self, host: str, port: int) -> list[Address]:
        try:
            ipaddress.ip_address(host)
            return [(host, port)]
        except ValueError:
            pass
        now = time.monotonic()
        known = self._known.get((host, port))
        if known is not None and known[0] > now:
            return known[1]
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        found = _interleaved([(info[0], (str(info[4][0]), int(info[4][1]))) for info in infos])
        if not found:
            raise OSError(f"{host} resolves to no address")
        self._known[(host, port)] = (now + self.ttl, found)
        return found


def _interleaved(infos: list[tuple[Any, Address]]) -> list[Address]:
    by_family: dict[Any, list[Address]] = {}
    for family, address in infos:
        if address not in by_family.setdefault(family, []):
            by_family[family].append(address)
    queues = list(by_family.values())
    out: list[Address] = []
    while any(queues):
        for queue in queues:
            if queue:
                out.append(queue.pop(0))
    return out


async def race(
    connect: Callable[[Address], Any],
    addresses: list[Address],
    delay: float,
    discard: Callable[[Any], None],
) -> Any:
    """The first of ``connect(address)`` to succeed, a new attempt started every ``delay``
    seconds (or as soon as the one before fails); OSError when every attempt failed."""
    if len(addresses) == 1:
        return await connect(addresses[0])
    loop = asyncio.get_running_loop()
    pending: set[asyncio.Task[Any]] = set()
    errors: list[BaseException] = []
    try:
        for address in addresses:  # the next one after the delay, or at once after a failure
            pending.add(loop.create_task(connect(address)))
            done, pending = await asyncio.wait(pending, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
            winner = _first_connected(done, errors, discard)
            if winner is not None:
                return winner
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            winner = _first_connected(done, errors, discard)
            if winner is not None:
                return winner
    finally:
        for task in pending:  # losers: cancelled; one that connected all the same is discarded
            task.cancel()
            task.add_done_callback(partial(_discard_if_connected, discard))
    raise OSError(f"no address of {len(addresses)} answered ({errors[-1] if errors else 'no attempt'})")


def _discard_if_connected(discard: Callable[[Any], None], task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is None:
        discard(task.result())


def _first_connected(
    done: set[asyncio.Task[Any]], errors: list[BaseException], discard: Callable[[Any], None]
) -> Any:
    winner = None
    for task in done:
        error = task.exception()
        if error is not None:
            errors.append(error)
        elif winner is None:
            winner = task.result()
        else:
            discard(task.result())  # two connected in the same turn: keep one
    return winner

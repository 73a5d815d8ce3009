"""Opening a connection to a name with several addresses: Happy Eyeballs (RFC 8305) by
``aiohappyeyeballs`` (the library aiohttp uses), and a short-lived cache of what a name
resolves to.

asyncio's ``create_connection(happy_eyeballs_delay=...)`` races addresses on the standard loop,
but uvloop (the workers' loop with the ``fast`` extra) takes no such argument; racing for a
connected socket and wrapping it with ``create_connection(sock=...)`` works on both.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time

import aiohappyeyeballs

__all__ = ["Resolver", "open_socket"]

AddrInfo = tuple[int, int, int, str, tuple[str, int]]


class Resolver:
    """What names resolve to, kept for ``ttl`` seconds per (host, port); an IP literal is
    itself, unresolved."""

    def __init__(self, ttl: float = 30.0) -> None:
        self.ttl = ttl
        self._known: dict[tuple[str, int], tuple[float, list[AddrInfo]]] = {}

    async def addresses(self, host: str, port: int) -> list[AddrInfo]:
        literal = _literal(host, port)
        if literal is not None:
            return literal
        now = time.monotonic()
        known = self._known.get((host, port))
        if known is not None and known[0] > now:
            return known[1]
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        found: list[AddrInfo] = [
            (int(family), int(kind), proto, name, (str(address[0]), int(address[1])))
            for family, kind, proto, name, address in infos
        ]
        if not found:
            raise OSError(f"{host} resolves to no address")
        self._known[(host, port)] = (now + self.ttl, found)
        return found


def _literal(host: str, port: int) -> list[AddrInfo] | None:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    return [(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (host, port))]


async def open_socket(infos: list[AddrInfo], delay: float) -> socket.socket:
    """A socket connected to the first of ``infos`` to answer, a new attempt started every
    ``delay`` seconds (or at once after a failure), families interleaved; OSError when every
    attempt failed. The losers are closed by aiohappyeyeballs."""
    return await aiohappyeyeballs.start_connection(infos, happy_eyeballs_delay=delay, interleave=1)

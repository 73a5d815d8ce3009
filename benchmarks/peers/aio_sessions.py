"""One aiohttp session per running event loop, for a peer's UDF that runs in loops it does not own.

A module of its own so that a pickled UDF refers to it by name (cloudpickle pickles a script's
globals by value: a live session in them cannot be pickled)."""

from __future__ import annotations

import asyncio
from typing import Any

_SESSIONS: dict[int, Any] = {}


def session(limit: int) -> Any:
    """The running loop's session, made in that loop on first use."""
    import aiohttp

    loop = asyncio.get_running_loop()
    found = _SESSIONS.get(id(loop))
    if found is None:
        found = _SESSIONS[id(loop)] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit))
    return found


def drop_all() -> None:
    """Drop every session's connections (their loops are the engine's, not ours to run)."""
    for client in _SESSIONS.values():
        client.connector._close()
        client._connector = None  # closed: nothing left for its finaliser to warn about
    _SESSIONS.clear()

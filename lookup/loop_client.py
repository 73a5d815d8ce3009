"""A service client made lazily inside the event loop that uses it, never pickled: what the
lookups and the writes share. A client made under one loop fails under another ("Event loop
is closed"), and a worker may run several loops over its life, so a new loop gets a new one."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

__all__ = ["LoopClient"]


class LoopClient:
    """Subclasses give :meth:`_make_client` and :meth:`_close_client`. Put first among the
    bases: its ``aclose`` and ``__getstate__`` run the others' and then drop the client."""

    _client: Any = None
    _client_loop: asyncio.AbstractEventLoop | None = None
    _client_thread: int | None = None

    def _make_client(self) -> Any:
        raise NotImplementedError

    async def _close_client(self, client: Any) -> None:
        raise NotImplementedError

    def client(self) -> Any:
        """The client of the running event loop, made on first use in that loop."""
        loop = self._client_loop
        # the client's loop running in this thread is the running loop: asked without
        # asyncio.get_running_loop(), which costs a getpid() system call per call on 3.11
        if loop is not None and loop.is_running() and self._client_thread == threading.get_ident():
            return self._client
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            self._client = self._make_client()
            self._client_loop = loop
            self._client_thread = threading.get_ident()
        return self._client

    async def _drop_client(self) -> None:
        """Close the client, if one was made; the next call makes another."""
        client, self._client, self._client_loop = self._client, None, None
        if client is not None:
            await self._close_client(client)

    def _without_client(self, state: dict[str, Any]) -> dict[str, Any]:
        """``state`` (a copy of ``__dict__``) fit to pickle: no live client."""
        state["_client"] = None
        state["_client_loop"] = None
        return state

    def _forget_clients(self) -> None:
        """A copy of an object that had a client makes its own."""
        self._client = None
        self._client_loop = None

    def __getstate__(self) -> dict[str, Any]:
        parent = getattr(super(), "__getstate__", None)
        state = dict(parent()) if parent is not None else self.__dict__.copy()
        return self._without_client(state)

    async def aclose(self) -> None:
        parent = getattr(super(), "aclose", None)
        if parent is not None:
            await parent()
        await self._drop_client()

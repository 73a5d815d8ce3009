"""A service client made lazily inside the event loop that uses it, never pickled: what the
lookups and the writes share. A client made under one loop fails under another ("Event loop
is closed"), and a worker may run several loops over its life, so a new loop gets a new one."""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["LoopClient"]


class LoopClient:
    """Subclasses give :meth:`_make_client` and :meth:`_close_client`."""

    _client: Any = None
    _client_loop: asyncio.AbstractEventLoop | None = None

    def _make_client(self) -> Any:
        raise NotImplementedError

    async def _close_client(self, client: Any) -> None:
        raise NotImplementedError

    def client(self) -> Any:
        """The client of the running event loop, made on first use in that loop."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            self._client = self._make_client()
            self._client_loop = loop
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

"""The narrow interface between :class:`HttpLookup` and an HTTP client: one request, one
:class:`Answer`, and ``aclose()``. Two clients implement it: aiohttp (``http_client``) and
the lean HTTP/1.1 client on httptools (``http_lean``). A transport sends exactly one request
(redirects are the caller's) and raises ``TimeoutError``, ``ssl.SSLError``, ``OSError`` or
the client's own errors; the caller turns them into lookup errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol

import yarl

__all__ = ["Answer", "Transport"]


class Answer(NamedTuple):
    status: int
    headers: Mapping[str, str]  # case-insensitive
    body: bytes


class Transport(Protocol):
    """An HTTP client of one event loop. ``request`` may be started outside any task (a lookup
    started eagerly runs up to its first suspension in the engine's own step): whatever needs
    the caller's task (``asyncio.timeout``) comes after the transport's first suspension."""

    async def request(
        self,
        method: str,
        url: yarl.URL,
        params: list[tuple[str, str]] | None,
        headers: Mapping[str, str] | None,
        data: Any,
    ) -> Answer: ...

    async def aclose(self) -> None: ...

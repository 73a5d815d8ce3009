"""The narrow interface between :class:`HttpLookup` and an HTTP client: one request, one
:class:`Answer`, and ``aclose()``. Two clients implement it: aiohttp (``http_client``) and
the lean HTTP/1.1 client on httptools (``http_lean``). A transport sends exactly one request
(redirects are the caller's) and raises ``TimeoutError``, ``ssl.SSLError``, ``OSError`` or
the client's own errors; the caller turns them into lookup errors. A client that resends an
idempotent request itself (its kept-alive connection closed before any answer) says so in
:attr:`Answer.resent`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple, Protocol

import yarl
from multidict import CIMultiDict

__all__ = ["Answer", "RawHeaders", "Transport"]


class Answer(NamedTuple):
    status: int
    headers: Mapping[str, str]  # case-insensitive
    body: bytes
    # the client sent the request again itself (a kept-alive connection closed with no answer):
    # the first may have reached the service
    resent: bool = False


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


class RawHeaders(Mapping[str, str]):
    """An answer's headers, case-insensitive: kept as llhttp gave them and decoded (latin-1,
    a value's trailing whitespace dropped, as llhttp keeps it) into a ``CIMultiDict`` the first
    time they are read. Most answers are never read past their content coding, which is found
    without decoding the rest (a lookup of a JSON API reads the body alone)."""

    __slots__ = ("_decoded", "_pairs")

    def __init__(self, pairs: list[tuple[bytes, bytes]]) -> None:
        self._pairs = pairs
        self._decoded: CIMultiDict[str] | None = None

    def _all(self) -> CIMultiDict[str]:
        if self._decoded is None:
            self._decoded = CIMultiDict(
                (name.decode("latin-1"), value.decode("latin-1").rstrip(" \t")) for name, value in self._pairs
            )
        return self._decoded

    def coding(self) -> str | None:
        """The last ``Content-Encoding`` (the one applied last), or None."""
        found = None
        for name, value in self._pairs:
            if len(name) == 16 and name.lower() == b"content-encoding":
                found = value
        return None if found is None else found.decode("latin-1").rstrip(" \t")

    def __getitem__(self, name: str) -> str:
        return self._all()[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self._all().get(name, default)

    def getall(self, name: str, default: Any = None) -> Any:
        return self._all().getall(name, default)

    def __contains__(self, name: object) -> bool:
        return name in self._all()

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._pairs)

    def __repr__(self) -> str:
        return f"<RawHeaders({list(self._all().items())!r})>"

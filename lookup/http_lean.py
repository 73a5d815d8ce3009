"""The lookups' lean HTTP/1.1 client, on asyncio's transports.

Why: with a hundred requests in flight a worker is CPU-bound, and the client's CPU per
request sets the ceiling. aiohttp's client spends about 140 us of Python on a keep-alive GET;
writing the request in one piece and parsing the answer with llhttp (through httptools, a
dependency: one parser, so one behaviour) spends about 45 us. It does
only what a lookup needs: one request at a time per keep-alive connection, answers framed by
Content-Length, chunks or the connection's close, TLS through the loop (the system's CAs
plus ``ca_file``, a client certificate for mTLS), every address of a name tried (Happy
Eyeballs, 250 ms apart), idle connections dropped after :data:`IDLE_SECONDS`. HEAD, proxies and
cookies are not part of it (``make_transport`` hands a HEAD or proxied lookup to aiohttp). No
``Accept-Encoding`` is sent; an answer compressed anyway with gzip (every member) or deflate is
decompressed whole or is an error; one in another encoding is passed on as it came (and fails
as JSON), as aiohttp does. A ``Host`` header given by the caller is sent instead of the URL's.

Invariants:

- A connection carries one request at a time and goes back to the pool only after its whole
  answer was read and both sides keep it alive; a timeout, a cancellation, an error or bytes
  nobody asked for close it. So no request can ever read another request's answer.
- At most ``max_connections`` connections are open, and at most that many requests are under
  way (a request waits for a slot, inside its timeout, as aiohttp's ``limit``).
- An answer is complete or an error: a body cut short by a closed or reset connection, a
  parser error, headers over :data:`MAX_HEADER_BYTES`, a body over :data:`MAX_BODY_BYTES` or a
  connection lost before the answer is a :class:`WireError` (retryable upstream).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import sys
import zlib
from collections.abc import Mapping
from typing import Any

import httptools
import yarl

from keyed_async_wait.core.deadlines import Deadlines

from .http_connect import Resolver, open_socket
from .http_options import ClientOptions, tls_context
from .http_slots import Slots
from .http_wire import Answer, RawHeaders
from .parts import suspend

if sys.version_info >= (3, 11):
    _deadline = asyncio.timeout
else:  # pragma: no cover - Python 3.10 (aiohttp brings async-timeout there)
    from async_timeout import timeout as _deadline

__all__ = ["IDLE_SECONDS", "MAX_BODY_BYTES", "MAX_HEADER_BYTES", "LeanTransport", "WireError"]

#: an idle kept-alive connection older than this is closed, not used: servers commonly drop
#: theirs after 5 s, and a POST must not meet a connection the server just closed
IDLE_SECONDS = 4.0
MAX_HEADER_BYTES = 64 * 1024  # an answer's header block, as aiohttp bounds it
MAX_BODY_BYTES = 256 * 1024 * 1024  # an answer's body (decoded too)
_HAPPY_EYEBALLS_DELAY = 0.25  # RFC 8305's recommended value, aiohttp's too
# an upgrade (101) we never asked for is an error too; HttpParserUpgrade is no HttpParserError
_PARSE_ERRORS = (httptools.HttpParserError, httptools.HttpParserUpgrade)

_USER_AGENT = "keyed-async-wait"
# framing is ours: a header the caller gives with one of these names is not sent
_FRAMING = frozenset({"content-length", "transfer-encoding", "connection"})
# what a request sends unless the caller gives its own
_DEFAULT_HEADERS = f"User-Agent: {_USER_AGENT}\r\nAccept: */*\r\n"
# methods whose request has no Content-Length unless they carry a body
_WITHOUT_BODY = frozenset({"GET", "DELETE", "OPTIONS", "HEAD"})
# methods a request may be sent again for when a kept-alive connection turned out closed
_IDEMPOTENT = frozenset({"GET", "PUT", "DELETE", "OPTIONS"})


class WireError(ConnectionError):
    """The connection failed or the answer could not be read (cut short, malformed)."""


class _Stale(WireError):
    """A kept-alive connection was closed before any byte of the answer came."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection: writes a request, parses its answer."""

    def __init__(self, on_lost: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._on_lost = on_lost
        self._loop = loop
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[Answer] | None = None
        self._headers: list[tuple[bytes, bytes]] = []  # as they came: decoded when asked (RawHeaders)
        self._body: list[bytes] = []
        self._header_bytes = 0
        self._body_bytes = 0
        self._in_body = False  # the answer's headers are complete, its body under way
        self._got_bytes = False
        self._eof = False  # the peer ended with a FIN (not a reset)
        self.reusable = False
        self.lost = False

    # --------------------------------------------------------------- asyncio.Protocol

    def connection_made(self, transport: Any) -> None:
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._got_bytes = True
        if self._waiter is None:  # an answer nobody asked for: this connection is not in step
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except _PARSE_ERRORS as exc:
            self._fail(WireError(f"malformed answer: {exc}"))

    def eof_received(self) -> None:
        # a FIN (asyncio's TLS calls this for a TCP close without close_notify too: that case
        # cannot be told from a clean close here)
        self._eof = True

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._on_lost()
        if self._waiter is None or self._waiter.done():
            return
        if self._in_body and self._framed_by_close() and exc is None and self._eof:
            self._complete(reusable=False)
        elif self._got_bytes and (exc is not None or not self._eof):  # a reset
            why = exc or "no FIN"
            self._fail(WireError(f"the connection ended uncleanly before the whole answer came ({why})"))
        elif not self._got_bytes:
            self._fail(_Stale("the connection was closed before the answer"))
        else:
            self._fail(WireError("the connection was closed before the whole answer came"))

    # --------------------------------------------------------------- parser callbacks

    def on_message_begin(self) -> None:
        if self._waiter is None:  # a second answer in the bytes of the first: out of step
            self.close()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value)
        if self._header_bytes > MAX_HEADER_BYTES:
            self._fail(WireError(f"the answer's headers are over {MAX_HEADER_BYTES} bytes"))
            return
        if self._in_body:  # a trailer: never the answer's framing or coding (RFC 9110 6.5.1)
            return
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._in_body = True

    def _framed_by_close(self) -> bool:
        """RFC 9112 6.3: an answer with a body, neither a length nor chunks, ends with the close
        (worked out only when the connection closes mid-answer)."""
        status = self._parser.get_status_code()
        if status < 200 or status in (204, 304):
            return False
        framing = {name.lower(): value for name, value in RawHeaders(self._headers).items()}
        codings = framing.get("transfer-encoding", "").lower().split(",")
        return "content-length" not in framing and codings[-1].strip() != "chunked"

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._body_bytes > MAX_BODY_BYTES:
            self._fail(WireError(f"the answer's body is over {MAX_BODY_BYTES} bytes"))
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        if self._parser.get_status_code() < 200:  # an interim answer (103): the real one follows
            self._headers, self._body, self._in_body = [], [], False
            self._header_bytes = self._body_bytes = 0
            return
        self._complete(reusable=self._parser.should_keep_alive())

    # --------------------------------------------------------------- the exchange

    def send(self, request: bytes) -> asyncio.Future[Answer]:
        """Write ``request``; the future of its answer."""
        assert self._transport is not None
        self._waiter = waiter = self._loop.create_future()
        self._got_bytes = False
        self._transport.write(request)
        return waiter

    def close(self) -> None:
        self.reusable = False
        if self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        self.reusable = False
        if self._transport is not None:
            self._transport.abort()

    def _complete(self, *, reusable: bool) -> None:
        waiter, self._waiter = self._waiter, None
        pairs, parts = self._headers, self._body
        self._headers, self._body, self._in_body = [], [], False
        self._header_bytes = self._body_bytes = 0
        if waiter is None or waiter.done():  # an answer nobody asked for
            self.close()
            return
        headers, body = RawHeaders(pairs), b"".join(parts)
        encoding = headers.coding()
        if encoding is not None:
            try:
                body = _decoded(body, encoding.strip().lower())
            except (zlib.error, ValueError) as exc:
                self._fail(WireError(f"answer not decodable as {encoding}: {exc}"), waiter)
                return
        answer = Answer(self._parser.get_status_code(), headers, body)
        self.reusable = reusable and not self.lost
        waiter.set_result(answer)

    def expire(self) -> None:
        """The request's time ran out: its waiter gets ``TimeoutError``, the connection is dropped."""
        self._fail(TimeoutError())

    def _fail(self, error: Exception, waiter: asyncio.Future[Answer] | None = None) -> None:
        waiter, self._waiter = waiter or self._waiter, None
        self.abort()
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)


def _decoded(body: bytes, encoding: str) -> bytes:
    """The whole body decoded: every gzip member, nothing left over (trailing bytes, a stream
    cut short or a body decoding past :data:`MAX_BODY_BYTES` raise)."""
    if encoding in ("gzip", "x-gzip"):
        parts, rest = [], body
        while True:
            part, rest = _inflate(rest, 16 + zlib.MAX_WBITS)
            parts.append(part)
            if not rest:
                return b"".join(parts)
            if not rest.startswith(b"\x1f\x8b"):
                raise ValueError(f"{len(rest)} bytes after the gzip data")
    if encoding == "deflate":  # zlib-wrapped as the RFC says, or raw as some servers send it
        try:
            data, rest = _inflate(body, zlib.MAX_WBITS)
        except zlib.error:
            data, rest = _inflate(body, -zlib.MAX_WBITS)
        if rest:
            raise ValueError(f"{len(rest)} bytes after the deflate data")
        return data
    return body


def _inflate(data: bytes, wbits: int) -> tuple[bytes, bytes]:
    """One compressed stream of ``data``: what it decodes to, and the bytes after it."""
    stream = zlib.decompressobj(wbits)
    out = stream.decompress(data, MAX_BODY_BYTES + 1)
    if len(out) > MAX_BODY_BYTES:
        raise ValueError(f"decodes to over {MAX_BODY_BYTES} bytes")
    if not stream.eof:
        raise ValueError("the compressed data is cut short")
    return out, stream.unused_data


def request_bytes(method: str, url: yarl.URL, headers: Mapping[str, str] | None, body: bytes | None) -> bytes:
    """The request as it goes on the wire; a header name or value that would break the framing
    (a line break or NUL) is refused, as aiohttp refuses it."""
    if not headers and body is None and method in _WITHOUT_BODY:  # a plain GET: one piece
        host = url.host_port_subcomponent
        if host:
            return f"{method} {url.raw_path_qs} HTTP/1.1\r\nHost: {host}\r\n{_DEFAULT_HEADERS}\r\n".encode()
    given = {name.lower() for name in headers} if headers else set()
    host = url.host_port_subcomponent if "host" not in given else None  # the caller's Host wins
    lines = [f"{method} {url.raw_path_qs} HTTP/1.1\r\n" + (f"Host: {host}\r\n" if host else "")]
    if "user-agent" not in given:
        lines.append(f"User-Agent: {_USER_AGENT}\r\n")
    if "accept" not in given:
        lines.append("Accept: */*\r\n")
    if headers:
        for name, value in headers.items():
            if name.lower() in _FRAMING:
                continue
            if any(c in name for c in "\r\n\0: ") or any(c in value for c in "\r\n\0"):
                raise ValueError(f"header {name!r}: a line break or NUL (or a colon in the name); refused")
            lines.append(f"{name}: {value}\r\n")
    if body is not None or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body or b'')}\r\n")
    lines.append("\r\n")
    head = "".join(lines).encode("utf-8")
    return head + body if body else head


class LeanTransport:
    """Keep-alive connections per origin, at most ``max_connections`` open; see the module.

    Made in the event loop it serves. A request may be started outside any task (a lookup
    started eagerly): with a free slot and an idle connection it writes at once and its
    deadline is an entry in a timer wheel that fails the answer's future; anything that may
    wait (a slot, a new connection) first yields once, so it runs inside the caller's task,
    under ``asyncio.timeout``.
    """

    def __init__(
        self,
        max_connections: int,
        request_timeout: float,
        options: ClientOptions | None = None,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._max = max_connections
        self._resolver = Resolver()
        self._timeout = request_timeout
        self._options = options or ClientOptions()
        self._slots = Slots(max_connections)
        # idle connections per origin, each with the loop time it became idle
        self._idle: dict[tuple[str, str, int], list[tuple[float, _Connection]]] = {}
        self._open = 0
        self._tls: ssl.SSLContext | None = None
        self._closed = False
        self._all_closed: asyncio.Event | None = None  # made by aclose, set when none is open
        # a request on an idle connection: one wheel entry, not a timer of its own (1% of the
        # timeout late at most, as the operator's own record timeouts)
        self._deadlines = Deadlines(min(0.05, request_timeout / 100), self._loop.call_at, _Connection.expire)

    @property
    def open_connections(self) -> int:
        return self._open

    async def request(
        self,
        method: str,
        url: yarl.URL,
        params: list[tuple[str, str]] | None,
        headers: Mapping[str, str] | None,
        data: Any,
    ) -> Answer:
        if params:
            url = url.extend_query(params)
        body = data.encode("utf-8") if isinstance(data, str) else data
        request = request_bytes(method, url, headers, body)
        if url.scheme not in ("http", "https") or not url.raw_host:
            raise WireError(f"cannot send to a {url.scheme or 'relative'} URL")
        origin = (url.scheme, url.raw_host, url.port or (443 if url.scheme == "https" else 80))
        timeout = self._timeout
        conn = self._idle_connection(origin) if self._slots.free else None
        resent = False  # a first sending's kept-alive connection closed before any answer
        if conn is not None:  # the common case: nothing to wait for but the answer
            started = self._loop.time()
            self._slots.take_now()  # a free slot: nobody waits for it
            try:
                return await self._use(conn, origin, request, started + timeout)
            except _Stale:
                if method not in _IDEMPOTENT:
                    raise
                resent = True
            finally:
                self._slots.give()
            timeout -= self._loop.time() - started
        await suspend()  # what follows may wait: inside the caller's task, as asyncio's timeout needs
        async with _deadline(timeout), self._slots:
            conn = self._idle_connection(origin)
            if conn is not None:
                try:
                    answer = await self._use(conn, origin, request)
                    return answer._replace(resent=True) if resent else answer
                except _Stale:
                    if method not in _IDEMPOTENT:
                        raise
                    resent = True
            answer = await self._use(await self._connect(origin), origin, request)
            return answer._replace(resent=True) if resent else answer

    async def aclose(self) -> None:
        """Close the idle connections and wait (up to a second) until every connection is gone,
        so none outlives the loop (a request still running closes its own when it ends)."""
        self._closed = True
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for _, conn in conns:
                conn.close()
        if self._open > 0:
            self._all_closed = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._all_closed.wait(), 1.0)
        if self._open == 0:
            self._deadlines.close()

    async def _use(
        self, conn: _Connection, origin: tuple[str, str, int], request: bytes, deadline: float | None = None
    ) -> Answer:
        """The answer ``conn`` gets to ``request``; by ``deadline`` (a loop time) when given."""
        bucket = self._deadlines.arm(conn, deadline) if deadline is not None else None
        try:
            answer = await conn.send(request)
        except BaseException:
            conn.abort()  # an answer may still come: nobody may read it
            raise
        finally:
            if bucket is not None:
                self._deadlines.disarm(conn, bucket)
        if conn.reusable and not self._closed:
            self._idle.setdefault(origin, []).append((self._loop.time(), conn))
        else:
            conn.close()
        return answer

    def _idle_connection(self, origin: tuple[str, str, int]) -> _Connection | None:
        idle = self._idle.get(origin)
        if not idle:
            return None
        expired = self._loop.time() - IDLE_SECONDS
        while idle and idle[0][0] < expired:  # oldest first: the server may have closed them
            idle.pop(0)[1].close()
        while idle:
            _, conn = idle.pop()
            if not conn.lost:
                return conn
        return None

    async def _connect(self, origin: tuple[str, str, int]) -> _Connection:
        if self._open >= self._max:  # a slot is ours, so some open connection is idle
            self._close_one_idle()
        scheme, host, port = origin
        tls = self._context() if scheme == "https" else None
        self._open += 1
        try:
            infos = await self._resolver.addresses(host, port)
            sock = await open_socket(infos, _HAPPY_EYEBALLS_DELAY)
            try:
                _, conn = await self._loop.create_connection(
                    lambda: _Connection(self._lost, self._loop),
                    sock=sock,
                    ssl=tls,
                    server_hostname=host if tls else None,
                )
            except BaseException:
                sock.close()
                raise
        except BaseException:
            self._open -= 1
            raise
        return conn

    def _lost(self) -> None:
        self._open -= 1
        if self._open == 0 and self._all_closed is not None:
            self._all_closed.set()

    def _close_one_idle(self) -> None:
        for conns in self._idle.values():
            if conns:
                conns.pop(0)[1].close()
                return

    def _context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = tls_context(self._options)
        return self._tls

"""The lean HTTP/1.1 client on httptools: every framing gives the whole body, a connection never
carries a late answer to another request, and a cut-short answer is an error, never a value.

Against a loopback server whose answers the tests write byte by byte, once per parser."""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from lookup import Field, HttpLookup, LookupTimeoutError, ServiceUnavailableError
from lookup.http_client import wire_url
from lookup.http_lean import LeanTransport, request_bytes

from ..core.helpers import run

Script = Callable[[str, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[bool]]
WAIT = 5.0  # the bound on every wait in these tests


@pytest.fixture(autouse=True)
def lean(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lean client, whatever the environment says."""
    monkeypatch.setenv("KAW_HTTP", "httptools")


def ok(body: bytes, *extra: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in extra)
    return f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n{head}\r\n".encode() + body


def chunked(body: bytes, size: int) -> bytes:
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts)
    return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"


def profile(user: str) -> bytes:
    return json.dumps({"name": f"user-{user}", "pad": "x" * (int(user) * 97 % 3000)}).encode()


class Server:
    """A loopback HTTP/1.1 server: ``script(path, reader, writer)`` answers each request and
    returns whether the connection stays open. Records the paths asked and connections made."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.paths: list[str] = []
        self.heads: list[bytes] = []
        self.connections = 0
        self.url = ""

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                if length:
                    await reader.readexactly(length)
                self.heads.append(head)
                path = head.split(b" ")[1].decode()
                self.paths.append(path)
                if not await self.script(path, reader, writer):
                    return
                await writer.drain()
        finally:
            writer.close()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[str]:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            server.close()
            await asyncio.wait_for(server.wait_closed(), WAIT)


async def names(fn: HttpLookup, users: list[str]) -> list[Any]:
    try:
        return await asyncio.wait_for(
            asyncio.gather(*(fn.invoke({"id": u}) for u in users), return_exceptions=True), WAIT
        )
    finally:
        await fn.aclose()


def test_every_framing_gives_the_whole_body() -> None:
    async def script(path: str, reader: Any, writer: asyncio.StreamWriter) -> bool:
        kind, user = path.split("/")[1:3]
        body = profile(user)
        if kind == "length":
            writer.write(ok(body))
        elif kind == "chunked":
            writer.write(chunked(body, 1 + int(user) % 50))
        elif kind == "interim":  # 103 Early Hints, then the answer
            writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n" + ok(body))
        elif kind == "gzip":
            writer.write(ok(gzip.compress(body), "Content-Encoding: gzip"))
        elif kind == "deflate":
            writer.write(ok(zlib.compress(body), "Content-Encoding: deflate"))
        else:  # no length: the body ends with the connection
            writer.write(b"HTTP/1.1 200 OK\r\n\r\n" + body)
            return False
        return True

    async def main() -> None:
        server = Server(script)
        async with server.running() as url:
            for kind in ("length", "chunked", "interim", "gzip", "deflate", "close"):
                fn = HttpLookup(f"{url}/{kind}/{{id}}", fields=[Field("name")], max_connections=4)
                users = [str(i) for i in range(1, 41)]
                assert await names(fn, users) == [[{"name": f"user-{u}"}] for u in users], kind
        # keep-alive: 40 requests per kind over at most 4 connections, but one per request
        # when the body is framed by the close
        assert server.connections <= 5 * 4 + 40

    run(main())


def test_an_answers_headers_read_as_they_came_whenever_they_are_read() -> None:
    """Headers are decoded only when read: then case-insensitive, each repeated value kept in
    order, a value's trailing whitespace dropped, a trailer not among them, and the last of
    two content codings is the one undone."""
    body = gzip.compress(b'{"name": "ann"}')
    answer = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Quota: 5 \t\r\nSet-Thing: a\r\n"
        b"set-thing: b\r\nContent-Encoding: identity\r\ncontent-encoding: gzip\r\nTrailer: X-Late\r\n\r\n"
        + b"%x\r\n%s\r\n0\r\nX-Late: 1\r\n\r\n"
        % (len(body), body)
    )

    async def script(path: str, reader: Any, writer: asyncio.StreamWriter) -> bool:
        writer.write(answer)
        return True

    async def main() -> None:
        async with Server(script).running() as url:
            transport = LeanTransport(4, WAIT)
            try:
                got = await transport.request("GET", wire_url(f"{url}/u/1"), None, None, None)
            finally:
                await transport.aclose()
        assert got.body == b'{"name": "ann"}'
        headers = got.headers
        assert headers.get("x-quota") == "5" and headers["X-QUOTA"] == "5"
        assert headers.getall("Set-Thing") == ["a", "b"]  # type: ignore[attr-defined]
        assert "x-late" not in headers and "Trailer" in headers
        assert len(headers) == 7 and next(iter(headers)) == "Transfer-Encoding"
        assert headers.get("absent", "none") == "none"

    run(main())


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        # a body cut short: an error, never a value
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n" + profile("7")[:20],
            "closed before the whole answer",
        ),
        # an upgrade nobody asked for
        (
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n\0\1",
            "malformed answer",
        ),
    ],
    ids=["cut-short", "upgrade"],
)
def test_a_broken_answer_is_a_retryable_error(answer: bytes, says: str) -> None:
    async def script(path: str, reader: Any, writer: asyncio.StreamWriter) -> bool:
        writer.write(answer)
        return False

    async def main() -> None:
        async with Server(script).running() as url:
            [error] = await names(HttpLookup(f"{url}/u/{{id}}", fields=[Field("name")]), ["7"])
            assert isinstance(error, ServiceUnavailableError) and error.retryable
            assert says in str(error)

    run(main())


def second_request_unanswered(answer: Callable[[str], bytes]) -> Script:
    """A script answering the first request on each connection (one at a time, as a pool of
    one gives them) and closing the connection, unanswered, at the second."""
    seen: list[str] = []

    async def script(path: str, reader: Any, writer: asyncio.StreamWriter) -> bool:
        seen.append(path)
        if len(seen) % 2 == 0:
            return False
        writer.write(answer(path))
        return True

    return script


def test_a_kept_alive_connection_closed_by_the_server_is_reopened_for_a_get_only() -> None:
    script = second_request_unanswered(lambda path: ok(profile(path.rsplit("/", 1)[1])))

    async def main() -> None:
        server = Server(script)
        async with server.running() as url:
            fn = HttpLookup(f"{url}/u/{{id}}", fields=[Field("name")], max_connections=1)
            try:
                assert await fn.invoke({"id": "1"}) == [{"name": "user-1"}]
                # the idle connection is closed when the next request arrives: sent again on a
                # new connection, as a GET is idempotent
                assert await fn.invoke({"id": "2"}) == [{"name": "user-2"}]
            finally:
                await fn.aclose()
            assert server.paths == ["/u/1", "/u/2", "/u/2"] and server.connections == 2

    run(main())


def test_a_post_on_a_closed_kept_alive_connection_is_not_sent_again() -> None:
    script = second_request_unanswered(lambda path: ok(b'{"1": {"name": "one"}, "2": {"name": "two"}}'))

    async def main() -> None:
        server = Server(script)
        async with server.running() as url:
            fn = HttpLookup(f"{url}/u/{{id}}", batch_url=f"{url}/batch", fields=[Field("name")])
            try:
                assert await fn.invoke_batch([{"id": "1"}]) == [[{"name": "one"}]]
                [error] = await fn.invoke_batch([{"id": "2"}])
            finally:
                await fn.aclose()
            assert isinstance(error, ServiceUnavailableError) and error.retryable
            assert server.paths == ["/batch", "/batch"]  # not sent a second time

    run(main())


def user_1_waits_for_the_drop(*, answer_late: bool) -> tuple[Script, asyncio.Event]:
    """A script that answers every user at once but user 1, whose request it holds until the
    client drops the connection (then answers it anyway when ``answer_late``); and the event
    set at the drop."""
    dropped = asyncio.Event()

    async def script(path: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        user = path.rsplit("/", 1)[1]
        if user == "1":
            assert await asyncio.wait_for(reader.read(), WAIT) == b""
            dropped.set()
            if answer_late:
                writer.write(ok(profile("1")))
            return False
        writer.write(ok(profile(user)))
        return True

    return script, dropped


def test_an_answer_after_the_timeout_never_reaches_another_request() -> None:
    script, dropped = user_1_waits_for_the_drop(answer_late=True)

    async def main() -> None:
        server = Server(script)
        async with server.running() as url:
            fn = HttpLookup(f"{url}/u/{{id}}", fields=[Field("name")], max_connections=1, request_timeout=0.3)
            try:
                with pytest.raises(LookupTimeoutError):
                    await fn.invoke({"id": "1"})
                await asyncio.wait_for(dropped.wait(), WAIT)
                assert await fn.invoke({"id": "2"}) == [{"name": "user-2"}]
            finally:
                await fn.aclose()
            assert server.connections == 2

    run(main())


def test_a_request_on_a_kept_alive_connection_times_out_too() -> None:
    """The common case (a free slot, an idle connection) keeps its deadline without a timer of
    its own: it still ends at ``request_timeout`` and drops the connection."""
    script, dropped = user_1_waits_for_the_drop(answer_late=False)

    async def main() -> None:
        server = Server(script)
        async with server.running() as url:
            fn = HttpLookup(f"{url}/u/{{id}}", fields=[Field("name")], max_connections=1, request_timeout=0.3)
            loop = asyncio.get_running_loop()
            try:
                assert await fn.invoke({"id": "0"}) == [{"name": "user-0"}]
                started = loop.time()
                with pytest.raises(LookupTimeoutError, match=r"0\.3 s"):
                    await asyncio.wait_for(fn.invoke({"id": "1"}), WAIT)
                assert 0.3 <= loop.time() - started < 0.3 + 1.0
                await asyncio.wait_for(dropped.wait(), WAIT)
                assert await fn.invoke({"id": "2"}) == [{"name": "user-2"}]
            finally:
                await fn.aclose()
            assert server.paths == ["/u/0", "/u/1", "/u/2"] and server.connections == 2

    run(main())


def test_the_request_goes_out_as_rendered() -> None:
    url = HttpLookup("http://h:8080/a/{id}").url.render({"id": "x y"})
    head = request_bytes("POST", wire_url(url).extend_query([("q", "1")]), {"X-A": "b"}, b"{}")
    assert head == (
        b"POST /a/x%20y?q=1 HTTP/1.1\r\nHost: h:8080\r\nUser-Agent: keyed-async-wait\r\n"
        b"Accept: */*\r\nX-A: b\r\nContent-Length: 2\r\n\r\n{}"
    )
    with pytest.raises(ValueError, match="header 'X-A'"):
        request_bytes("GET", wire_url(url), {"X-A": "b\r\nX-Evil: 1"}, None)


def test_aclose_leaves_no_connection_open() -> None:
    async def script(path: str, reader: Any, writer: asyncio.StreamWriter) -> bool:
        writer.write(ok(profile(path.rsplit("/", 1)[1])))
        return True

    async def main() -> None:
        async with Server(script).running() as url:
            transport = LeanTransport(4, 5.0)
            try:
                answers = await asyncio.gather(
                    *(transport.request("GET", wire_url(f"{url}/u/{i}"), None, None, None) for i in range(10))
                )
                assert [json.loads(a.body)["name"] for a in answers] == [f"user-{i}" for i in range(10)]
                assert 1 <= transport.open_connections <= 4
            finally:
                await transport.aclose()
            assert transport.open_connections == 0

    run(main())

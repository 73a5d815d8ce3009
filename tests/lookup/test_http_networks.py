"""HTTP on users' networks (issue 27): a proxy from the environment or given, complete
decompression, a reset mid-body, the caller's Host, idle expiry, bounded headers, mTLS.

Each case against a loopback server written for it, on every client the library ships."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import ssl
import struct
from typing import Any

import pytest

from lookup import HttpLookup, ServiceUnavailableError, http_lean
from lookup.http_client import HTTP_CLIENTS

from ..core.helpers import run
from .test_http_lean import WAIT, Server, names, ok


@pytest.fixture(autouse=True, params=[c for c in HTTP_CLIENTS if c != "auto"])
def client(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test once per client (the lean one on each parser, and aiohttp)."""
    monkeypatch.setenv("KAW_HTTP", request.param)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    return str(request.param)


def answering(*parts: bytes, close: bool = False) -> Any:
    async def script(path: str, reader: Any, writer: asyncio.StreamWriter) -> bool:
        for part in parts:
            writer.write(part)
        return not close

    return script


def test_every_gzip_member_is_decoded_and_trailing_bytes_are_an_error() -> None:
    two = gzip.compress(b'{"name": "1') + gzip.compress(b'2"}')

    async def main() -> None:
        async with Server(answering(ok(two, "Content-Encoding: gzip"))).running() as url:
            assert await names(HttpLookup(f"{url}/u/{{id}}", fields=["name"]), ["1"]) == [[{"name": "12"}]]
        junk = gzip.compress(b'{"name": "1"}') + b"junk"
        async with Server(answering(ok(junk, "Content-Encoding: gzip"))).running() as url:
            [error] = await names(HttpLookup(f"{url}/u/{{id}}", fields=["name"]), ["1"])
            assert isinstance(error, Exception), error  # never the first member's value

    run(main())


def test_trailers_do_not_change_the_body() -> None:
    """A chunked answer with trailers (one naming ``Content-Encoding``, which a trailer may not
    carry): the body is the chunks, read the same on every client, and the next answer on the
    kept-alive connection is whole."""
    body = b'{"name": "trailed"}'
    framed = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum, Content-Encoding\r\n\r\n"
        + b"%x\r\n%s\r\n0\r\nX-Sum: 42\r\nContent-Encoding: gzip\r\n\r\n" % (len(body), body)
    )

    async def main() -> None:
        async with Server(answering(framed)).running() as url:
            fn = HttpLookup(f"{url}/u/{{id}}", fields=["name"], max_connections=1)
            assert await names(fn, ["1", "2"]) == [[{"name": "trailed"}], [{"name": "trailed"}]]

    run(main())


def test_a_body_cut_short_by_a_reset_is_an_error_never_a_value(client: str) -> None:
    if client == "aiohttp":
        pytest.skip("aiohttp returns what came before a reset of a close-framed body (known; lean default)")

    async def script(path: str, reader: Any, writer: asyncio.StreamWriter) -> bool:
        # framed by the close; the JSON parses, but a reset says more may have been on the way
        writer.write(b'HTTP/1.1 200 OK\r\n\r\n{"name": "user"}')
        await writer.drain()
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # with a zero linger: an RST, not a FIN
        return False

    async def main() -> None:
        async with Server(script).running() as url:
            [error] = await names(HttpLookup(f"{url}/u/{{id}}", fields=["name"]), ["1"])
            assert isinstance(error, ServiceUnavailableError) and error.retryable, error

    run(main())


def test_the_callers_host_header_is_sent() -> None:
    async def main() -> None:
        server = Server(answering(ok(b'{"name": "x"}')))
        async with server.running() as url:
            fn = HttpLookup(f"{url}/u/{{id}}", headers={"Host": "api.internal"}, fields=["name"])
            assert await names(fn, ["1"]) == [[{"name": "x"}]]
        hosts = [line for line in server.heads[0].split(b"\r\n") if line.lower().startswith(b"host:")]
        assert hosts == [b"Host: api.internal"]

    run(main())


def test_an_idle_connection_past_its_age_is_not_used(client: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if client == "aiohttp":
        pytest.skip("aiohttp's own keep-alive timeout (15 s) applies")
    monkeypatch.setattr(http_lean, "IDLE_SECONDS", 0.0)

    async def main() -> None:
        server = Server(answering(ok(b'{"name": "x"}')))
        async with server.running() as url:
            fn = HttpLookup(f"{url}/u/{{id}}", fields=["name"], max_connections=1)
            try:
                for user in ("1", "2", "3"):
                    assert await fn.invoke({"id": user}) == [{"name": "x"}]
            finally:
                await fn.aclose()
        assert server.connections == 3

    run(main())


def test_an_endless_header_block_is_an_error(client: str) -> None:
    header = b"X-Pad: " + b"p" * 8000 + b"\r\n"
    answer = b"HTTP/1.1 200 OK\r\n" + header * 400 + b"Content-Length: 2\r\n\r\n{}"

    async def main() -> None:
        async with Server(answering(answer, close=True)).running() as url:
            [error] = await names(HttpLookup(f"{url}/u/{{id}}", fields=["name"]), ["1"])
            assert isinstance(error, ServiceUnavailableError), error

    run(main())


class Proxy:
    """A forward proxy on loopback for plain http: records each request line (absolute-form)
    and answers it as the origin would."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
            self.lines.append(head.split(b"\r\n")[0].decode())
            writer.write(ok(json.dumps({"name": "via-proxy"}).encode(), "Connection: close"))
            await writer.drain()
        finally:
            writer.close()


def test_the_environments_proxy_carries_the_lookup_and_no_proxy_bypasses_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def main() -> None:
        proxy = Proxy()
        server = await asyncio.start_server(proxy.serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{port}")
            origin = Server(answering(ok(b'{"name": "direct"}')))
            async with origin.running() as url:
                fn = HttpLookup(f"{url}/u/{{id}}", fields=["name"])
                assert await names(fn, ["1"]) == [[{"name": "via-proxy"}]]
                assert proxy.lines == [f"GET {url}/u/1 HTTP/1.1"] and origin.paths == []
                monkeypatch.setenv("NO_PROXY", "127.0.0.1")
                fn = HttpLookup(f"{url}/u/{{id}}", fields=["name"])
                assert await names(fn, ["2"]) == [[{"name": "direct"}]]
                assert len(proxy.lines) == 1 and origin.paths == ["/u/2"]
        finally:
            server.close()
            await asyncio.wait_for(server.wait_closed(), WAIT)

    run(main())


def test_an_explicit_proxy_with_credentials_is_used_and_kept_secret() -> None:
    async def main() -> None:
        proxy = Proxy()
        server = await asyncio.start_server(proxy.serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            fn = HttpLookup(
                "http://127.0.0.1:1/u/{id}", fields=["name"], proxy=f"http://user:s3cret@127.0.0.1:{port}"
            )
            assert "s3cret" not in repr(fn)
            assert await names(fn, ["1"]) == [[{"name": "via-proxy"}]]
            assert proxy.lines == ["GET http://127.0.0.1:1/u/1 HTTP/1.1"]
        finally:
            server.close()
            await asyncio.wait_for(server.wait_closed(), WAIT)

    run(main())


def mtls_context(authority: Any) -> ssl.SSLContext:
    """A server context for 127.0.0.1 that answers only a client with a certificate of ``authority``."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(context)
    authority.configure_trust(context)
    context.verify_mode = ssl.CERT_REQUIRED  # no certificate, no answer
    return context


def answering_once(body: bytes) -> Any:
    """A TLS server's handler: reads one request, answers ``body`` and closes (a refused
    handshake ends it quietly)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
            writer.write(ok(body, "Connection: close"))
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            writer.close()

    return serve


def test_mtls_with_a_client_certificate_and_an_added_ca(tmp_path: Any) -> None:
    authority = pytest.importorskip("trustme").CA()
    server_context = mtls_context(authority)
    client_cert = authority.issue_cert("client@example")
    serve = answering_once(b'{"name": "mutual"}')

    async def main() -> None:
        server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server_context)
        port = server.sockets[0].getsockname()[1]
        url = f"https://127.0.0.1:{port}/u/{{id}}"
        try:
            with (
                authority.cert_pem.tempfile() as ca,
                client_cert.private_key_and_cert_chain_pem.tempfile() as pem,
            ):
                fn = HttpLookup(url, fields=["name"], ca_file=ca, client_cert=pem)
                assert await names(fn, ["1"]) == [[{"name": "mutual"}]]
                [refused] = await names(HttpLookup(url, fields=["name"], ca_file=ca), ["1"])
                assert isinstance(refused, Exception)
        finally:
            server.close()
            await asyncio.wait_for(server.wait_closed(), WAIT)

    run(main())


class Tunnel:
    """A forward proxy on loopback that speaks CONNECT (as corporate proxies do for https):
    records each CONNECT target, then pipes bytes both ways until either side closes."""

    def __init__(self) -> None:
        self.targets: list[str] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
            method, target, _ = head.split(b"\r\n")[0].decode().split(" ")
            assert method == "CONNECT", method
            self.targets.append(target)
            host, port = target.rsplit(":", 1)
            up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), WAIT)
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await asyncio.wait_for(asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer)), WAIT)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    finally:
        writer.close()


def test_https_through_the_environments_proxy_with_mtls(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job behind a proxy, with mTLS: nothing beyond ``HTTPS_PROXY`` and ``client_cert=``.
    The proxy sees only the CONNECT target; TLS (and the client certificate) go end to end."""
    authority = pytest.importorskip("trustme").CA()
    server_context = mtls_context(authority)
    client_cert = authority.issue_cert("client@example")
    serve = answering_once(b'{"name": "tunnelled"}')

    async def main() -> None:
        tunnel = Tunnel()
        proxy = await asyncio.start_server(tunnel.serve, "127.0.0.1", 0)
        origin = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server_context)
        origin_port = origin.sockets[0].getsockname()[1]
        try:
            monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{proxy.sockets[0].getsockname()[1]}")
            with (
                authority.cert_pem.tempfile() as ca,
                client_cert.private_key_and_cert_chain_pem.tempfile() as pem,
            ):
                url = f"https://127.0.0.1:{origin_port}/u/{{id}}"
                fn = HttpLookup(url, fields=["name"], ca_file=ca, client_cert=pem)
                assert await names(fn, ["1"]) == [[{"name": "tunnelled"}]]
            assert tunnel.targets == [f"127.0.0.1:{origin_port}"]
        finally:
            for server in (proxy, origin):
                server.close()
                await asyncio.wait_for(server.wait_closed(), WAIT)

    run(main())


def test_ca_file_adds_to_the_system_store() -> None:
    from lookup.http_options import ClientOptions, tls_context

    trustme = pytest.importorskip("trustme")
    system = len(tls_context(ClientOptions()).get_ca_certs())
    with trustme.CA().cert_pem.tempfile() as ca:
        added = len(tls_context(ClientOptions(ca_file=ca)).get_ca_certs())
    assert added == system + 1


def test_bad_client_options_are_refused_when_the_lookup_is_made() -> None:
    with pytest.raises(ValueError, match="client_key= without client_cert="):
        HttpLookup("http://x/{id}", client_key="k.pem")
    with pytest.raises(ValueError, match="proxy="):
        HttpLookup("http://x/{id}", proxy="socks5://p:1080")


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_dead_first_address_falls_back_to_the_next_within_a_second(
    client: str, loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name with two addresses, the first never answering (a listener whose backlog is full:
    its SYNs are dropped): the request goes to the second, Happy Eyeballs style, on the
    standard loop and on uvloop (the workers' loop with the fast extra)."""
    if loop == "uvloop":
        if client == "aiohttp":
            pytest.skip("aiohttp races addresses itself (aiohappyeyeballs), whatever the loop")
        uvloop = pytest.importorskip("uvloop")
        monkeypatch.setattr(asyncio, "run", lambda coro: uvloop.run(coro))
    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)
    dead = full.getsockname()
    fillers = []
    for _ in range(4):  # fill the backlog; later SYNs are dropped, not refused
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(dead)
        fillers.append(filler)

    async def main() -> None:
        origin = Server(answering(ok(b'{"name": "second"}')))
        async with origin.running() as url:
            live = ("127.0.0.1", int(url.rsplit(":", 1)[1]))
            loop = asyncio.get_running_loop()

            resolve = loop.getaddrinfo

            async def two_addresses(host: str, port: Any, **kwargs: Any) -> list[Any]:
                if host != "two.test":  # uvloop's sock_connect resolves an IP literal again
                    return await resolve(host, port, **kwargs)
                return [
                    (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", dead),
                    (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", live),
                ]

            monkeypatch.setattr(loop, "getaddrinfo", two_addresses)
            fn = HttpLookup("http://two.test:80/u/{id}", fields=["name"], request_timeout=3.0)
            started = loop.time()
            assert await names(fn, ["1"]) == [[{"name": "second"}]]
            assert loop.time() - started < 1.5

    try:
        run(main())
    finally:
        for s in [*fillers, full]:
            s.close()


def test_an_internationalised_host_is_sent_as_idna(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        server = Server(answering(ok(b'{"name": "x"}')))
        async with server.running() as url:
            port = int(url.rsplit(":", 1)[1])
            loop = asyncio.get_running_loop()

            async def resolve(host: str, port_: Any, **_: Any) -> list[Any]:
                assert host == "xn--bcher-kva.test", host
                return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", port))]

            monkeypatch.setattr(loop, "getaddrinfo", resolve)
            fn = HttpLookup(f"http://bücher.test:{port}/ü/{{id}}", fields=["name"])
            assert await names(fn, ["1"]) == [[{"name": "x"}]]
        head = server.heads[0].decode("latin-1")
        assert f"Host: xn--bcher-kva.test:{port}\r\n" in head and head.startswith("GET /%C3%BC/1 ")

    run(main())

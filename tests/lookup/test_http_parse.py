"""The lean client's connection and its parsers: whatever the framing and however the bytes
arrive, an answer is exactly its body, or an error; the Python parser gives llhttp's answers."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lookup.http_lean import WireError, _Connection
from lookup.http_parse import HTTP_PARSERS, response_parser
from lookup.http_wire import Answer

from ..core.helpers import run
from .test_http_lean import chunked, ok

WAIT = 5.0

Exchange = tuple[Coroutine[Any, Any, Answer], "asyncio.Future[Answer]"]


def start(conn: _Connection) -> Exchange:
    """The exchange of one request, run up to where it waits for the answer (no loop turn),
    and the future it waits on."""
    exchange = conn.exchange(b"GET / HTTP/1.1\r\n\r\n")
    return exchange, exchange.send(None)


def finish(exchange: Exchange) -> Answer | None:
    """The answer (or its error), or None while it is not complete."""
    coroutine, waiting_on = exchange
    if not waiting_on.done():
        return None
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    raise AssertionError("the exchange waits again")


class _Wire:
    """What the protocol writes to and closes."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def close(self) -> None:
        self.closed = True

    abort = close


answers = st.tuples(
    st.binary(max_size=3000),
    st.sampled_from(["length", "chunked", "close"]),
    st.integers(1, 700),  # chunk size
    st.lists(st.integers(1, 400), min_size=1, max_size=40),  # how the bytes arrive
)


@settings(max_examples=300, deadline=None)
@given(parser=st.sampled_from(HTTP_PARSERS), answers=st.lists(answers, min_size=1, max_size=4))
def test_any_framing_split_anywhere_gives_exactly_the_body(parser: str, answers: list[Any]) -> None:
    """Over random bodies, framings and splits into reads: each answer is exactly its body, a
    connection is kept for the next request only when the framing allows, and bytes after a
    close-framed body never form a second answer."""

    async def main() -> None:
        lost: list[int] = []
        conn = _Connection(lambda: lost.append(1), *response_parser(parser))
        wire = _Wire()
        conn.connection_made(wire)
        for body, framing, size, cuts in answers:
            raw = {"length": ok(body), "chunked": chunked(body, size)}.get(
                framing, b"HTTP/1.1 200 OK\r\n\r\n" + body
            )
            exchange = start(conn)
            at = 0
            for cut in cuts * (len(raw) // max(1, sum(cuts)) + 1):
                if at >= len(raw):
                    break
                conn.data_received(raw[at : at + cut])
                at += cut
            if framing == "close":
                assert finish(exchange) is None  # nothing but the close ends such a body
                conn.connection_lost(None)
            answer = finish(exchange)
            assert answer is not None and answer.status == 200 and answer.body == body
            if framing == "close":
                assert not conn.reusable and lost == [1]
                return
            assert conn.reusable

    run(main())


@pytest.mark.parametrize("parser", HTTP_PARSERS)
def test_a_connection_lost_mid_answer_is_a_wire_error(parser: str) -> None:
    async def main() -> None:
        conn = _Connection(lambda: None, *response_parser(parser))
        conn.connection_made(_Wire())
        exchange = start(conn)
        conn.data_received(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab")
        conn.connection_lost(None)
        with pytest.raises(WireError, match="before the whole answer"):
            finish(exchange)

    run(main())


class Recorder:
    """What a parser reports, bodies joined: begin, headers, end of headers, body, end."""

    def __init__(self, parser: str) -> None:
        parser_class, self.errors = response_parser(parser)
        self.parser = parser_class(self)
        self.events: list[Any] = []

    def on_message_begin(self) -> None:
        self.events.append("begin")

    def on_header(self, name: bytes, value: bytes) -> None:
        # llhttp keeps a value's trailing whitespace, the Python parser drops it (RFC 9110
        # 5.5: not part of the value); the connection strips both
        self.events.append(("header", bytes(name), bytes(value).rstrip(b" \t")))

    def on_headers_complete(self) -> None:
        self.events.append(("status", self.parser.get_status_code()))

    def on_body(self, body: bytes) -> None:
        if self.events and isinstance(self.events[-1], bytearray):
            self.events[-1] += body
        else:
            self.events.append(bytearray(body))

    def on_message_complete(self) -> None:
        self.events.append(("end", self.parser.should_keep_alive()))

    def feed(self, raw: bytes, cuts: list[int]) -> list[Any] | str:
        """The events, or "error" when the parser refused the bytes."""
        at = 0
        try:
            while at < len(raw):
                step = cuts[at % len(cuts)]
                self.parser.feed_data(raw[at : at + step])
                at += step
        except self.errors:
            return "error"
        return [bytes(e) if isinstance(e, bytearray) else e for e in self.events]


token = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-ABCXYZ0123456789!#$%&'*+.^_`|~", min_size=1, max_size=12)
header_value = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=30)
extra_headers = st.lists(
    st.tuples(token.filter(lambda t: t.lower() not in FRAMING_NAMES), header_value), max_size=5
)
FRAMING_NAMES = {"content-length", "transfer-encoding", "connection"}


@st.composite
def message(draw: st.DrawFn) -> bytes:
    """One valid answer: an interim 103 perhaps, any status, headers, and a framing that ends."""
    status = draw(st.sampled_from([200, 201, 204, 301, 304, 404, 429, 500, 503]))
    version = draw(st.sampled_from(["1.1", "1.1", "1.0"]))
    headers = draw(extra_headers)
    connection = draw(st.sampled_from([None, "close", "keep-alive", "Keep-Alive, Upgrade-Insecure"]))
    if connection is not None:
        headers.append(("Connection", connection))
    body = draw(st.binary(max_size=300)) if status not in (204, 304) else b""
    framing = draw(st.sampled_from(["length", "chunked"]))
    interim = b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" if draw(st.booleans()) else b""
    if framing == "length" or status in (204, 304):
        headers.append(("Content-Length", str(len(body))))
        payload = body
    else:
        headers.append(("Transfer-Encoding", "chunked"))
        size = draw(st.integers(1, 64))
        parts = [body[i : i + size] for i in range(0, len(body), size)]
        payload = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
    head = "".join(f"{n}:{draw(st.sampled_from(['', ' ', '  ']))}{v}\r\n" for n, v in headers)
    return interim + f"HTTP/{version} {status} Reason\r\n{head}\r\n".encode() + payload


cuts = st.lists(st.integers(1, 200), min_size=1, max_size=20)


@settings(max_examples=400, deadline=None)
@given(messages=st.lists(message(), min_size=1, max_size=3), cuts=cuts)
def test_the_python_parser_gives_llhttps_answers(messages: list[bytes], cuts: list[int]) -> None:
    raw = b"".join(messages)
    python, llhttp = Recorder("python").feed(raw, cuts), Recorder("httptools").feed(raw, cuts)
    assert python == llhttp


@settings(max_examples=400, deadline=None)
@given(
    answer=message(),
    cuts=cuts,
    at=st.integers(0, 10_000),
    junk=st.binary(min_size=1, max_size=4) | st.sampled_from([b"\r\n", b":", b" ", b"\n", b"\r", b"0"]),
    replace=st.booleans(),
)
def test_bytes_the_python_parser_accepts_mean_what_they_mean_to_llhttp(
    answer: bytes, cuts: list[int], at: int, junk: bytes, replace: bool
) -> None:
    """A damaged answer: the Python parser refuses it, or reads what llhttp reads (it may be
    stricter, never different)."""
    at %= len(answer)
    raw = answer[:at] + junk + answer[at + (len(junk) if replace else 0) :]
    python = Recorder("python").feed(raw, cuts)
    if python != "error":
        llhttp = Recorder("httptools").feed(raw, cuts)
        # where llhttp refused, only what came before its error can be compared
        assert llhttp == "error" or python == llhttp


def test_a_second_answer_in_the_bytes_of_the_first_closes_the_connection() -> None:
    async def main() -> None:
        for parser in HTTP_PARSERS:
            conn = _Connection(lambda: None, *response_parser(parser))
            wire = _Wire()
            conn.connection_made(wire)
            exchange = start(conn)
            conn.data_received(ok(b"{}") + ok(b'{"late": 1}'))
            answer = finish(exchange)
            assert answer is not None and answer.body == b"{}"
            assert not conn.reusable and wire.closed  # nobody may read the second one

    run(main())

"""Parsing HTTP/1.1 answers for the lean client: llhttp through httptools when it is installed,
else :class:`PyResponseParser`, written here with the same callbacks.

The Python parser is strict where llhttp is strict by default: a malformed status line, a
header line without a colon or with a folded value, a name that is not a token, both
``Content-Length`` and ``Transfer-Encoding``, differing lengths, or a bad chunk are a
:class:`ParseError`, never a guess. A property test checks it gives llhttp's answers on
random answers split at random places.

Framing (RFC 9112, section 6.3, for answers to anything but HEAD): 1xx, 204 and 304 have no
body; a ``Transfer-Encoding`` ending in ``chunked`` is chunked; a ``Content-Length`` frames
the body; otherwise the body ends with the connection (the caller sees the close).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["HTTP_PARSERS", "ParseError", "PyResponseParser", "response_parser"]

HTTP_PARSERS = ("httptools", "python")
MAX_HEAD = 64 * 1024  # bytes of status line and headers
_MAX_SIZE_LINE = 1024
_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) ([0-9]{3})(?: [^\r\n]*)?")
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEX = re.compile(rb"[0-9A-Fa-f]{1,15}")
_OWS = b" \t"

# states
_HEAD, _LENGTH, _SIZE, _DATA, _DATA_END, _TRAILERS, _UNTIL_CLOSE = range(7)


class ParseError(ValueError):
    """The bytes are not an HTTP/1.1 answer."""


class PyResponseParser:
    """HTTP/1.1 answers, one after another on a connection; calls ``on_message_begin``,
    ``on_header(name, value)``, ``on_headers_complete``, ``on_body(bytes)`` and
    ``on_message_complete`` of ``protocol`` as httptools' ``HttpResponseParser`` does."""

    def __init__(self, protocol: Any) -> None:
        self._p = protocol
        self._buf = b""
        self._state = _HEAD
        self._status = 0
        self._keep_alive = False
        self._left = 0  # bytes of the body or of the chunk still to come
        self._closed = False  # the last answer ended the connection: no bytes may follow

    def get_status_code(self) -> int:
        return self._status

    def should_keep_alive(self) -> bool:
        return self._keep_alive

    def feed_data(self, data: bytes) -> None:
        data = data if isinstance(data, bytes) else bytes(data)
        buf = self._buf + data if self._buf else data
        at = 0
        while at < len(buf):
            state = self._state
            if state == _HEAD:
                if self._closed:
                    raise ParseError("bytes after an answer that closes the connection")
                end = buf.find(b"\r\n\r\n", at)
                if end < 0:
                    if len(buf) - at > MAX_HEAD:
                        raise ParseError(f"status line and headers longer than {MAX_HEAD} bytes")
                    break
                self._head(buf[at:end])
                at = end + 4
            elif state in (_LENGTH, _DATA):
                n = min(self._left, len(buf) - at)
                self._p.on_body(buf[at : at + n])
                at += n
                self._left -= n
                if self._left == 0:
                    if state == _LENGTH:
                        self._complete()
                    else:
                        self._state = _DATA_END
            elif state == _SIZE:
                end = buf.find(b"\r\n", at)
                if end < 0:
                    if len(buf) - at > _MAX_SIZE_LINE:
                        raise ParseError("chunk size line too long")
                    break
                self._chunk_size(buf[at:end])
                at = end + 2
            elif state == _DATA_END:
                if len(buf) - at < 2:
                    break
                if buf[at : at + 2] != b"\r\n":
                    raise ParseError("chunk data not followed by CRLF")
                at += 2
                self._state = _SIZE
            elif state == _TRAILERS:
                if buf.startswith(b"\r\n", at):
                    at += 2
                    self._complete()
                    continue
                end = buf.find(b"\r\n\r\n", at)
                if end < 0:
                    if len(buf) - at > MAX_HEAD:
                        raise ParseError("trailers too long")
                    break
                at = end + 4  # trailers are not part of the answer
                self._complete()
            else:  # _UNTIL_CLOSE
                self._p.on_body(buf[at:])
                at = len(buf)
        self._buf = buf[at:]

    # ------------------------------------------------------------------ parts

    def _head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        status = _STATUS_LINE.fullmatch(lines[0])
        if status is None:
            raise ParseError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        self._status = int(status.group(2))
        http_10 = status.group(1) == b"0"
        on_header = self._p.on_header
        self._p.on_message_begin()
        lengths: set[bytes] = set()
        codings = b""
        connection = b""
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or _TOKEN.fullmatch(name) is None:
                raise ParseError(f"malformed header line: {line[:80]!r}")
            value = value.strip(_OWS)
            if b"\n" in value or b"\r" in value or b"\0" in value:
                raise ParseError(f"header {name[:80]!r}: a line break or NUL in the value")
            lowered = name.lower()
            if lowered == b"content-length":
                lengths.update(v.strip(_OWS) for v in value.split(b","))
            elif lowered == b"transfer-encoding":
                codings += b"," + value.lower()
            elif lowered == b"connection":
                connection += b"," + value.lower()
            on_header(name, value)
        tokens = {t.strip(_OWS) for t in connection.split(b",")}
        self._keep_alive = (b"keep-alive" in tokens) if http_10 else (b"close" not in tokens)
        self._p.on_headers_complete()
        self._frame(lengths, codings)

    def _frame(self, lengths: set[bytes], codings: bytes) -> None:
        if self._status == 101:  # as llhttp (for httptools, HttpParserUpgrade)
            raise ParseError("101 Switching Protocols: an upgrade the client never asked for")
        if self._status < 200 or self._status in (204, 304):
            self._complete()
            return
        if codings:
            if lengths:
                raise ParseError("both Content-Length and Transfer-Encoding")
            last = codings.split(b",")[-1].strip(_OWS)
            if last == b"chunked":
                self._state = _SIZE
            else:
                self._until_close()
            return
        if lengths:
            if len(lengths) > 1 or not all(v.isdigit() for v in lengths):
                raise ParseError(f"bad Content-Length: {b','.join(sorted(lengths))[:80]!r}")
            self._left = int(next(iter(lengths)))
            if self._left == 0:
                self._complete()
            else:
                self._state = _LENGTH
            return
        self._until_close()

    def _until_close(self) -> None:
        self._keep_alive = False
        self._state = _UNTIL_CLOSE

    def _chunk_size(self, line: bytes) -> None:
        size = line.split(b";", 1)[0].strip(_OWS)
        if _HEX.fullmatch(size) is None:
            raise ParseError(f"bad chunk size: {line[:80]!r}")
        self._left = int(size, 16)
        self._state = _DATA if self._left else _TRAILERS

    def _complete(self) -> None:
        self._state = _HEAD
        self._closed = self._status >= 200 and not self._keep_alive
        self._p.on_message_complete()


def response_parser(name: str) -> tuple[type[Any], tuple[type[BaseException], ...]]:
    """The parser class for ``name`` (``httptools`` or ``python``) and the errors it raises;
    ImportError when httptools is asked for and not installed."""
    if name == "httptools":
        import httptools

        # an upgrade (101) we never asked for is an error too; HttpParserUpgrade is no HttpParserError
        return httptools.HttpResponseParser, (
            httptools.HttpParserError,
            httptools.HttpParserUpgrade,
            ParseError,
        )
    return PyResponseParser, (ParseError,)

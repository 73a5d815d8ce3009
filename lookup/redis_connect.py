"""Where a Redis is and how to reach it: one description, :class:`RedisConnection`, for every
Redis part (:class:`~lookup.RedisLookup`, :class:`~lookup.RedisWrite`, the job-wide budget of
:class:`~lookup.SharedRate`, the step journal :class:`~lookup.StepJournal`).

Each part takes a URL with its options, or a :class:`RedisConnection` made once and shared. The
options are checked when the part is made; the clients are made from them in the process (and
event loop) that uses them, never pickled: a blocking pool whose connections pack commands with
hiredis; TLS always verified (``ca_file`` adds a CA bundle; ``client_cert`` and ``client_key``
for mutual TLS); the password from an environment variable or the URL; an ACL user in the URL
(``redis://user:password@host``). The password never shows in a repr or an error.
"""

from __future__ import annotations

import os
import urllib.parse
from dataclasses import dataclass, field, fields
from typing import Any

import redis
import redis.asyncio as aioredis

from .exceptions import LookupOptionError
from .redis_packing import hiredis_packing
from .secrets import redact_url

__all__ = ["RedisConnection"]

SCHEMES = ("redis", "rediss", "unix")


@dataclass(frozen=True)
class RedisConnection:
    """How to reach one Redis.

    Parameters
    ----------
    url : str
        ``redis://[user:password@]host:port[/db]``, ``rediss://...`` (TLS) or
        ``unix:///path/to/socket``.
    db : int, optional
        The database, when the URL names none.
    password_env : str, optional
        An environment variable holding the password (read where the client is made).
    ca_file : str, optional
        A CA bundle to trust besides the system's (``rediss://`` only).
    client_cert, client_key : str, optional
        A client certificate and its key, for a server that asks for one (``rediss://`` only).
    max_connections : int
        Connections per process at most; more calls wait for one.
    socket_timeout : float
        Seconds to connect and to wait for an answer.
    """

    url: str = field(repr=False)
    db: int | None = None
    password_env: str | None = None
    ca_file: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    max_connections: int = 100
    socket_timeout: float = 5.0

    def __post_init__(self) -> None:
        if not isinstance(self.url, str):
            raise LookupOptionError("url", f"url={type(self.url).__name__}; allowed: a redis:// URL")
        scheme = urllib.parse.urlsplit(self.url).scheme.lower()
        if scheme not in SCHEMES:
            allowed = ", ".join(f"{s}://" for s in SCHEMES)
            raise LookupOptionError("url", f"url={redact_url(self.url)!r}; allowed: a URL of {allowed}")
        tls = scheme == "rediss"
        for name in ("ca_file", "client_cert", "client_key"):
            if getattr(self, name) is not None and not tls:
                raise LookupOptionError(name, f"{name}= is for TLS: give a rediss:// URL")
        if (self.client_cert is None) != (self.client_key is None):
            raise LookupOptionError("client_cert", "client_cert= and client_key= go together (mutual TLS)")
        if isinstance(self.max_connections, bool) or not isinstance(self.max_connections, int):
            raise LookupOptionError(
                "max_connections", f"max_connections={self.max_connections!r}; allowed: >= 1"
            )
        if self.max_connections < 1:
            raise LookupOptionError(
                "max_connections", f"max_connections={self.max_connections}; allowed: >= 1"
            )
        if not isinstance(self.socket_timeout, (int, float)) or not self.socket_timeout > 0:
            raise LookupOptionError("socket_timeout", f"socket_timeout={self.socket_timeout!r}; allowed: > 0")
        url_db = _url_db(self.url)
        if self.db is not None and url_db is not None and self.db != url_db:
            raise LookupOptionError(
                "db",
                f"db={self.db} conflicts with the database {url_db} the URL names; give the database "
                "once, in the URL (redis://host:port/N) or as db=",
            )

    @classmethod
    def of(cls, target: str | RedisConnection, **options: Any) -> RedisConnection:
        """``target`` as a connection: a URL with ``options``, or a connection made already
        (then the options are its own: giving them again is an error naming the first)."""
        if isinstance(target, RedisConnection):
            defaults = {f.name: f.default for f in fields(cls)}
            given = sorted(name for name, value in options.items() if value != defaults.get(name))
            if given:
                raise LookupOptionError(
                    given[0], f"{given[0]}= with a RedisConnection: give it to the RedisConnection instead"
                )
            return target
        return cls(target, **options)

    def __repr__(self) -> str:
        return f"RedisConnection({redact_url(self.url)!r})"

    @property
    def shown(self) -> str:
        """The URL as it may be shown (a password replaced by ``***``)."""
        return redact_url(self.url)

    def _options(self) -> dict[str, Any]:
        password = os.environ.get(self.password_env) if self.password_env else None
        options: dict[str, Any] = {
            "max_connections": self.max_connections,
            "socket_timeout": self.socket_timeout,
            "socket_connect_timeout": self.socket_timeout,
            "decode_responses": False,
        }
        if self.db is not None:
            options["db"] = self.db
        if self.ca_file is not None:
            options["ssl_ca_certs"] = self.ca_file
        if self.client_cert is not None:
            options["ssl_certfile"], options["ssl_keyfile"] = self.client_cert, self.client_key
        if password is not None:
            options["password"] = password
        return options

    def client(self) -> aioredis.Redis:
        """A client of the running loop (made on first use inside it, never pickled)."""
        # a blocking pool: with more calls in flight than max_connections, a call waits for a
        # connection (the operator's timeout bounds it) instead of failing "Too many connections"
        pool = aioredis.BlockingConnectionPool.from_url(self.url, timeout=None, **self._options())
        pool.connection_class = hiredis_packing(pool.connection_class)  # the class the URL asks for
        return aioredis.Redis.from_pool(pool)

    def sync_client(self) -> redis.Redis:
        """A blocking client (the driver's and the intake's few calls)."""
        return redis.Redis.from_url(self.url, **self._options())


def _url_db(url: str) -> int | None:
    """The database a Redis URL names (its path or ``?db=``), None when it names none."""
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qs(parts.query).get("db")
    text = query[0] if query else parts.path.strip("/") if parts.scheme != "unix" else ""
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise LookupOptionError("url", f"the Redis URL's database {text!r} is not a number") from None

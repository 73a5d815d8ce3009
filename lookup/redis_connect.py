"""How a lookup or a write reaches Redis: the URL and its options, checked when the lookup or
write is made, and the client made from them (a blocking pool whose connections pack commands
with hiredis; TLS always verified, ``ca_file`` adding a CA bundle; the password from an
environment variable or the URL)."""

from __future__ import annotations

import os
import urllib.parse
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from .exceptions import LookupOptionError
from .redis_packing import hiredis_packing

__all__ = ["RedisConnection"]


@dataclass(frozen=True)
class RedisConnection:
    """``url`` (``redis://``, ``rediss://``, ``unix://``) and its options; errors name the option."""

    url: str
    db: int | None = None
    password_env: str | None = None
    max_connections: int = 100
    socket_timeout: float = 5.0
    ca_file: str | None = None

    def __post_init__(self) -> None:
        if self.ca_file is not None and not self.url.startswith("rediss://"):
            raise LookupOptionError("ca_file", "ca_file= is for TLS: give a rediss:// URL")
        url_db = _url_db(self.url)
        if self.db is not None and url_db is not None and self.db != url_db:
            raise LookupOptionError(
                "db",
                f"db={self.db} conflicts with the database {url_db} the URL names; give the database "
                "once, in the URL (redis://host:port/N) or as db=",
            )

    def client(self) -> aioredis.Redis:
        """A client of the running loop (made on first use inside it, never pickled)."""
        password = os.environ.get(self.password_env) if self.password_env else None
        kwargs: dict[str, Any] = {
            "max_connections": self.max_connections,
            "socket_timeout": self.socket_timeout,
            "socket_connect_timeout": self.socket_timeout,
            "decode_responses": False,
        }
        if self.db is not None:
            kwargs["db"] = self.db
        if self.ca_file is not None:
            kwargs["ssl_ca_certs"] = self.ca_file
        if password is not None:
            kwargs["password"] = password
        # a blocking pool: with more calls in flight than max_connections, a call waits for a
        # connection (the operator's timeout bounds it) instead of failing "Too many connections"
        pool = aioredis.BlockingConnectionPool.from_url(self.url, timeout=None, **kwargs)
        pool.connection_class = hiredis_packing(pool.connection_class)  # the class the URL asks for
        return aioredis.Redis.from_pool(pool)


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

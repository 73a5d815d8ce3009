"""The Redis client of a lookup or a write: a blocking pool whose connections pack commands
with hiredis; TLS always verified (``ca_file`` adds a CA bundle); the password from an
environment variable or the URL."""

from __future__ import annotations

import os
from typing import Any

import redis.asyncio as aioredis

from .redis_packing import hiredis_packing

__all__ = ["redis_client"]


def redis_client(
    url: str,
    *,
    db: int | None,
    password_env: str | None,
    max_connections: int,
    socket_timeout: float,
    ca_file: str | None,
) -> aioredis.Redis:
    """A client of the running loop (made on first use inside it, never pickled)."""
    password = os.environ.get(password_env) if password_env else None
    kwargs: dict[str, Any] = {
        "max_connections": max_connections,
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": socket_timeout,
        "decode_responses": False,
    }
    if db is not None:
        kwargs["db"] = db
    if ca_file is not None:
        kwargs["ssl_ca_certs"] = ca_file
    if password is not None:
        kwargs["password"] = password
    # a blocking pool: with more calls in flight than max_connections, a call waits for a
    # connection (the operator's timeout bounds it) instead of failing "Too many connections"
    pool = aioredis.BlockingConnectionPool.from_url(url, timeout=None, **kwargs)
    pool.connection_class = hiredis_packing(pool.connection_class)  # the class the URL asks for
    return aioredis.Redis.from_pool(pool)

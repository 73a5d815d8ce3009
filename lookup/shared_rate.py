"""A rate budget for the whole job, held in Redis: every worker process of every executor takes
its tokens from one bucket, so R calls/s hold however many tasks run, and executors that come
and go change nothing.

The bucket is one Redis hash (``kaw:rate:<name>``: tokens, last) and one Lua script that does
what :class:`lookup.throttle.TokenBucket` does, atomically, on the server's clock:
add what the time since the last reservation earned (up to ``burst``), take ``n``, and answer
how long the caller waits before its tokens are there. Reservations queue as in the local
bucket: each waits for the ones before it. The hash expires once it would be full again, so an
idle budget leaves nothing behind.

Invariant: over any ``T`` seconds, calls that reserved from one budget started at most
``burst + rate * T`` times (the server's clock orders every reservation).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from keyed_async_wait.core.exceptions import ConfigError

from .redis_connect import RedisConnection

__all__ = ["SharedRate"]

_RESERVE = """
local rate, burst, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local held = redis.call('HMGET', KEYS[1], 'tokens', 'last')
local tokens = tonumber(held[1]) or burst
local last = tonumber(held[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - last) * rate) - n
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'last', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) / rate * 1000) + 1000)
if tokens >= 0 then return '0' end
return tostring(-tokens / rate)
"""


@dataclass(frozen=True, init=False)
class SharedRate:
    """Where a job-wide budget lives: a Redis and the budget's name (the lookups that share
    one name share its calls/s). The URL's password never shows in a repr or an error.

    Parameters
    ----------
    redis : str or RedisConnection
        ``redis://[:password@]host:port/db``, or a :class:`~lookup.RedisConnection` (TLS, a
        password from the environment, ...) shared with the other Redis parts.
    name : str
        The budget's name; its key is ``kaw:rate:<name>`` (and ``kaw:keys:<name>`` for keys/s).
    **options
        The :class:`~lookup.RedisConnection` options, with a URL.
    """

    connection: RedisConnection = field(repr=False)
    name: str

    def __init__(self, redis: str | RedisConnection, name: str, **options: Any) -> None:
        object.__setattr__(self, "connection", RedisConnection.of(redis, **options))
        object.__setattr__(self, "name", name)
        if not isinstance(name, str) or not name or any(c.isspace() for c in name):
            raise ConfigError("shared name", name, "a non-empty name without spaces")

    def __repr__(self) -> str:
        return f"SharedRate(url={self.connection.shown!r}, name={self.name!r})"

    def connect(self) -> SharedBuckets:
        """The asyncio side, made inside the event loop that uses it."""
        return SharedBuckets(self)


class SharedBuckets:
    """The Redis client and script of one :class:`SharedRate` in one event loop."""

    def __init__(self, shared: SharedRate) -> None:
        self.shared = shared
        self._client = shared.connection.connect()
        self._script: Any = None

    async def reserve(
        self, kind: str, rate: float, burst: float, n: float, *, lookup_key: object, service: str
    ) -> float:
        """Take ``n`` tokens of the ``kind`` bucket ("rate" or "keys"): seconds to wait."""
        try:
            async with self._client.held() as client:
                if self._script is None:
                    self._script = client.register_script(_RESERVE)
                wait = await self._script(keys=[f"kaw:{kind}:{self.shared.name}"], args=[rate, burst, n])
        except Exception as exc:
            from .redis_errors import gate_error  # here: redis-py is imported only where it is used

            error = gate_error(
                exc,
                f"the shared rate budget {self.shared.name!r}",
                self.shared.connection.shown,
                lookup_key,
                service,
            )
            if error is exc:
                raise
            raise error from None
        return float(wait)

    async def aclose(self) -> None:
        await self._client.aclose()

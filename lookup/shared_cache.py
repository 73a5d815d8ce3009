"""A cache every executor shares: the answers of a lookup kept in Redis (an L2 behind each
worker's in-process :class:`~lookup.PartialCache`), so 200 executors ask the service once
per key, and a re-run of a job within the time to live asks nothing it asked before.

Semantics as ``lookup.partial-cache.*``: an entry lives ``expire_after_write`` seconds (Redis
expires it: the bound on what it holds, besides Redis's own ``maxmemory`` policy); a miss (the
service said the key does not exist) is kept too unless ``cache_missing_key=False``; an error
is never kept. Entries are the answers as the service decoded them, as JSON: an answer JSON
cannot hold is not kept (counted). Keys are ``kaw:cache:<namespace>:<digest of the lookup key>``:
the namespace is the lookup's identity (its class, service, key template and what selects the
answer) unless ``name=`` gives one, followed by a digest of the lookup's credentials (its
bearer token, secret headers and parameters, its Redis user and password) whatever the name,
so two tenants' answers never meet unless ``share_across_credentials=True`` says they may; a
lookup key's text never shows in Redis.

When Redis cannot be reached the lookup asks the service (a cache is never needed for a right
answer), counts it, and logs it once per process.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from keyed_async_wait.core.exceptions import ConfigError

from .redis_connect import RedisClient, RedisConnection

__all__ = ["SharedCache", "SharedCacheClient", "SharedCacheStats"]

log = logging.getLogger(__name__)
_MISS_TEXT = b"null"  # a kept miss; nil from Redis: not kept


@dataclass(frozen=True, init=False)
class SharedCache:
    """Where a lookup's shared cache lives (see the module).

    Parameters
    ----------
    redis : str or RedisConnection
        Any topology of :class:`~lookup.RedisConnection` (the password never shows).
    expire_after_write : float
        Seconds an answer is kept.
    cache_missing_key : bool
        Keep misses too (Flink's default, True).
    name : str, optional
        The namespace of its keys; by default the lookup's identity. Give one to share a cache
        between lookups of one service, or to start afresh (a new name). Lookups with other
        credentials still keep their answers apart.
    share_across_credentials : bool
        Let lookups whose credentials differ share answers (default False: each credential has
        answers of its own). Say so only when every credential sees the same answers.
    """

    connection: RedisConnection = field(repr=False)
    expire_after_write: float
    cache_missing_key: bool
    name: str | None
    share_across_credentials: bool

    def __init__(
        self,
        redis: str | RedisConnection,
        *,
        expire_after_write: float,
        cache_missing_key: bool = True,
        name: str | None = None,
        share_across_credentials: bool = False,
        **options: Any,
    ) -> None:
        ttl = expire_after_write
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0:
            raise ConfigError("expire_after_write", ttl, "seconds > 0")
        if name is not None and (not isinstance(name, str) or not name or any(c.isspace() for c in name)):
            raise ConfigError("shared cache name", name, "a non-empty name without spaces")
        object.__setattr__(self, "connection", RedisConnection.of(redis, **options))
        object.__setattr__(self, "expire_after_write", float(ttl))
        object.__setattr__(self, "cache_missing_key", bool(cache_missing_key))
        if not isinstance(share_across_credentials, bool):
            raise ConfigError("share_across_credentials", share_across_credentials, "True or False")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "share_across_credentials", share_across_credentials)

    def __repr__(self) -> str:
        return (
            f"SharedCache(url={self.connection.shown!r}, expire_after_write={self.expire_after_write}"
            f"{f', name={self.name!r}' if self.name else ''}"
            f"{', share_across_credentials=True' if self.share_across_credentials else ''})"
        )

    def namespace(self, identity: str, credentials: str = "") -> str:
        """The namespace of a lookup's keys: the name (else a digest of ``identity``), then a
        digest of ``credentials`` unless they may be shared (only digests reach Redis)."""
        namespace = self.name or _digest(identity, 10)
        if credentials and not self.share_across_credentials:
            namespace += "~" + _digest(credentials, 10)
        return namespace

    def connect(self, identity: str, credentials: str = "") -> SharedCacheClient:
        """The asyncio side for the lookup of ``identity`` with ``credentials`` (see
        :meth:`namespace`), made in the event loop that uses it."""
        return SharedCacheClient(self, self.namespace(identity, credentials))


def _digest(text: str, size: int) -> str:
    return hashlib.blake2b(text.encode(), digest_size=size).hexdigest()


@dataclass
class SharedCacheStats:
    hits: int = 0  # answers (and misses) found
    stored: int = 0
    unstorable: int = 0  # answers JSON cannot hold: not kept
    unreachable: int = 0  # asks and stores that failed: the service was asked instead


class SharedCacheClient:
    """One lookup's shared cache in one event loop: :meth:`get_many` and :meth:`put_many`."""

    def __init__(self, cache: SharedCache, namespace: str) -> None:
        self.cache = cache
        self.prefix = f"kaw:cache:{namespace}:"
        self.stats = SharedCacheStats()
        self._client: RedisClient = cache.connection.connect()
        self._warned = False

    def key_of(self, key: Hashable) -> str:
        return self.prefix + hashlib.blake2b(repr(key).encode(), digest_size=16).hexdigest()

    async def get_many(self, keys: Sequence[Hashable]) -> list[tuple[bool, Any]]:
        """Per key ``(found, answer)``: a kept answer (None for a kept miss), or not found."""
        names = [self.key_of(key) for key in keys]
        try:
            async with self._client.held() as client:
                texts = await (client.mget_nonatomic(names) if self._client.cluster else client.mget(names))
        except Exception as exc:  # noqa: BLE001 - a cache is never needed for a right answer
            self._unreachable(exc)
            return [(False, None)] * len(keys)
        out: list[tuple[bool, Any]] = []
        for text in texts:
            if text is None:
                out.append((False, None))
                continue
            try:
                out.append((True, json.loads(text)))
            except ValueError:
                out.append((False, None))  # not ours (a key reused by hand): ask the service
        self.stats.hits += sum(found for found, _ in out)
        return out

    async def put_many(self, pairs: Sequence[tuple[Hashable, Any]]) -> None:
        """Keep ``(key, answer)`` pairs (an answer of None is a miss: kept when allowed)."""
        ttl_ms = max(1, round(self.cache.expire_after_write * 1000))
        entries: list[tuple[str, bytes]] = []
        for key, answer in pairs:
            if answer is None:
                if self.cache.cache_missing_key:
                    entries.append((self.key_of(key), _MISS_TEXT))
                continue
            try:
                entries.append((self.key_of(key), json.dumps(answer, separators=(",", ":")).encode()))
            except (TypeError, ValueError):
                self.stats.unstorable += 1
        if not entries:
            return
        try:
            async with self._client.held() as client:
                pipe = client.pipeline(transaction=False)
                for name, text in entries:
                    pipe.set(name, text, px=ttl_ms)
                await pipe.execute()
        except Exception as exc:  # noqa: BLE001 - a cache is never needed for a right answer
            self._unreachable(exc)
            return
        self.stats.stored += len(entries)

    def _unreachable(self, exc: BaseException) -> None:
        self.stats.unreachable += 1
        if not self._warned:
            self._warned = True
            log.warning(
                "shared cache at %s not reachable (%s); asking the service instead",
                self.cache.connection.shown,
                type(exc).__name__,
            )

    async def aclose(self) -> None:
        await self._client.aclose()

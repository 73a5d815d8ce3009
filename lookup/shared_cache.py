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

One call per key for the whole job (``single_flight=S``): a worker that misses a key claims it
(``SET NX`` of ``kaw:flight:<namespace>:<digest>``, expiring after ``S`` seconds) before asking
the service; a worker that finds it claimed waits for the claimant's answer to reach the cache,
up to ``S`` seconds, and asks the service itself when the claim is given up (the claimant's
call failed: it deletes its claim), expires (the claimant died) or the bound passes. Nothing
in it is ever needed for a right answer: a Redis that cannot be reached, a claimant that never
answers, an answer the cache does not keep (an error; a miss with ``cache_missing_key=False``)
all end in the waiter asking the service itself. Invariant: a key is asked of the service by
at most one worker at a time while its claim lives, and no worker waits longer than ``S``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from keyed_async_wait.core.exceptions import ConfigError

from .redis_connect import RedisClient, RedisConnection
from .redis_nodes import Routed, mget_by_slot, pipelined, raising, usable

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
    single_flight : float, optional
        Seconds a worker waits for another worker's call of the same key (one call per key
        for the whole job, see the module); None (default): each worker asks on a miss.
    """

    connection: RedisConnection = field(repr=False)
    expire_after_write: float
    cache_missing_key: bool
    name: str | None
    share_across_credentials: bool
    single_flight: float | None

    def __init__(
        self,
        redis: str | RedisConnection,
        *,
        expire_after_write: float,
        cache_missing_key: bool = True,
        name: str | None = None,
        share_across_credentials: bool = False,
        single_flight: float | None = None,
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
        flight = single_flight
        if flight is not None and (
            isinstance(flight, bool) or not isinstance(flight, (int, float)) or not 0 < flight <= 3600
        ):
            raise ConfigError("single_flight", flight, "seconds from 0 to 3600 (exclusive of 0), or None")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "share_across_credentials", share_across_credentials)
        object.__setattr__(self, "single_flight", None if flight is None else float(flight))

    def __repr__(self) -> str:
        return (
            f"SharedCache(url={self.connection.shown!r}, expire_after_write={self.expire_after_write}"
            f"{f', name={self.name!r}' if self.name else ''}"
            f"{', share_across_credentials=True' if self.share_across_credentials else ''}"
            f"{f', single_flight={self.single_flight}' if self.single_flight else ''})"
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


_POLL_FIRST, _POLL_MOST = 0.002, 0.05  # seconds between looks while another worker asks


def _key_digest(key: Hashable) -> str:
    return hashlib.blake2b(repr(key).encode(), digest_size=16).hexdigest()


def _decoded(text: bytes | None) -> tuple[bool, Any]:
    """A kept entry as ``(found, answer)``: None from Redis is not found; neither is text that
    is not ours (a key reused by hand: ask the service)."""
    if text is None:
        return (False, None)
    try:
        return (True, json.loads(text))
    except ValueError:
        return (False, None)


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
        self.flight_prefix = f"kaw:flight:{namespace}:"
        self.stats = SharedCacheStats()
        self._client: RedisClient = cache.connection.connect()
        self._warned = False

    def key_of(self, key: Hashable) -> str:
        return self.prefix + _key_digest(key)

    async def _mget(self, names: list[str]) -> list[Any]:
        """MGET (on a cluster one per slot, each master's sent at once)."""
        connection = self.cache.connection
        async with self._client.held() as client:
            if not self._client.cluster:
                return list(await client.mget(names))
            if usable(client, connection.read_from_replicas):
                return raising(await mget_by_slot(client, names, timeout=connection.socket_timeout))
            return list(await client.mget_nonatomic(names))

    async def _pipelined(self, routed: Sequence[Routed], *, resend_lost: bool) -> list[Any]:
        connection = self.cache.connection
        async with self._client.held() as client:
            return await pipelined(
                client,
                routed,
                cluster=self._client.cluster,
                timeout=connection.socket_timeout,
                resend_lost=resend_lost,
                read_from_replicas=connection.read_from_replicas,
            )

    def _claim_of(self, key: Hashable) -> str:
        return self.flight_prefix + _key_digest(key)

    async def claim_many(self, keys: Sequence[Hashable]) -> list[bool]:
        """Per key, whether this worker now holds its claim (and so asks the service); False
        for one another worker holds. Redis unreachable: every key is this worker's."""
        bound = self.cache.single_flight
        if bound is None or not keys:
            return [True] * len(keys)
        ttl_ms = max(1, round(bound * 1000))
        try:
            names = [self._claim_of(key) for key in keys]
            claims = [(name, ("SET", name, b"1", "NX", "PX", ttl_ms)) for name in names]
            return [bool(done) for done in await self._pipelined(claims, resend_lost=False)]
        except Exception as exc:  # noqa: BLE001 - never needed for a right answer
            self._unreachable(exc)
            return [True] * len(keys)

    async def release_many(self, keys: Sequence[Hashable]) -> None:
        """This worker's claims of ``keys`` given up (its answers are kept, or its call failed)."""
        if self.cache.single_flight is None or not keys:
            return
        try:
            names = [self._claim_of(key) for key in keys]
            await self._pipelined([(name, ("DEL", name)) for name in names], resend_lost=True)
        except Exception as exc:  # noqa: BLE001 - the claims expire by themselves
            self._unreachable(exc)

    async def wait_many(self, keys: Sequence[Hashable]) -> list[tuple[bool, Any]]:
        """Per key ``(found, answer)`` once another worker's call of it reached the cache; not
        found when its claim is gone without an answer or ``single_flight`` seconds passed (then
        this worker asks the service itself)."""
        bound = self.cache.single_flight or 0.0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + bound
        out: list[tuple[bool, Any]] = [(False, None)] * len(keys)
        open_ = list(range(len(keys)))
        pause = _POLL_FIRST
        while open_ and loop.time() < deadline:
            await asyncio.sleep(min(pause, max(0.0, deadline - loop.time())))
            pause = min(pause * 2, _POLL_MOST)
            names = [self.key_of(keys[i]) for i in open_] + [self._claim_of(keys[i]) for i in open_]
            try:
                texts = await self._mget(names)
            except Exception as exc:  # noqa: BLE001 - ask the service instead
                self._unreachable(exc)
                break
            answers, claims = texts[: len(open_)], texts[len(open_) :]
            still = []
            for i, text, claim in zip(open_, answers, claims, strict=True):
                found = _decoded(text)
                if found[0]:
                    out[i] = found
                elif claim is not None:
                    still.append(i)  # still being asked; a claim gone without an answer: ask
            open_ = still
        return out

    async def get_many(self, keys: Sequence[Hashable]) -> list[tuple[bool, Any]]:
        """Per key ``(found, answer)``: a kept answer (None for a kept miss), or not found."""
        names = [self.key_of(key) for key in keys]
        try:
            texts = await self._mget(names)
        except Exception as exc:  # noqa: BLE001 - a cache is never needed for a right answer
            self._unreachable(exc)
            return [(False, None)] * len(keys)
        out = [_decoded(text) for text in texts]
        self.stats.hits += sum(found for found, _ in out)
        return out

    async def put_many(self, pairs: Sequence[tuple[Hashable, Any]], release: Sequence[Hashable] = ()) -> None:
        """Keep ``(key, answer)`` pairs (an answer of None is a miss: kept when allowed), and give
        up, in the same round trip, this worker's claims of the keys of ``release`` whose answers
        were not kept (a kept answer's claim is left to expire: a worker that missed the answer
        a moment before it was kept then finds the claim and waits for the answer it finds at
        once, instead of claiming afresh and asking again)."""
        ttl_ms = max(1, round(self.cache.expire_after_write * 1000))
        entries: list[tuple[str, bytes]] = []
        kept: set[str] = set()
        for key, answer in pairs:
            name = self.key_of(key)
            if answer is None:
                if self.cache.cache_missing_key:
                    entries.append((name, _MISS_TEXT))
                    kept.add(name)
                continue
            try:
                entries.append((name, json.dumps(answer, separators=(",", ":")).encode()))
                kept.add(name)
            except (TypeError, ValueError):
                self.stats.unstorable += 1
        claims = []
        if self.cache.single_flight:
            claims = [self._claim_of(key) for key in release if self.key_of(key) not in kept]
        if not entries and not claims:
            return
        try:
            # (the claims given up are of keys whose answers are not kept here: no order between
            # the two matters, and on a cluster the masters' shares run side by side)
            sets = [(name, ("SET", name, text, "PX", ttl_ms)) for name, text in entries]
            await self._pipelined(sets + [(name, ("DEL", name)) for name in claims], resend_lost=True)
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

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
(``SET NX`` of ``kaw:flight:<namespace>:<digest>`` to a token of its own, expiring after ``S``
seconds) before asking the service; a worker that finds it claimed waits for the claimant's
answer to reach the cache, and asks the service itself when the claim is given up (the
claimant's call failed: it deletes its claim). When the claim expires (the claimant died) or
outlives ``S`` seconds of waiting, the waiters take it over: each tries, once, to replace the
claim it waited on by one of its own (one Lua compare-and-set per key, its keys in a fixed
order, the first one deciding), so exactly one of them asks the service and the others wait
for that answer, up to ``S`` seconds more, then ask themselves. Nothing in it is ever needed
for a right answer: a Redis that cannot be reached, a claimant that never answers, an answer
the cache does not keep (an error; a miss with ``cache_missing_key=False``) all end in a
waiter asking the service itself. Invariant (see :class:`Waits`): a key's claim is held by
one worker at a time, a worker asks the service only as its claimant (first or by takeover)
unless the claim was given up, a second bound passed or Redis failed, and no worker waits
longer than ``2 S``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from keyed_async_wait.core.exceptions import ConfigError

from .claim_waits import Waits, decoded
from .redis_connect import RedisClient, RedisConnection

if TYPE_CHECKING:
    from .redis_nodes import Routed

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
        for the whole job, see the module; twice that when the claimant died and the worker
        that took its claim over dies too); None (default): each worker asks on a miss.
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

# A claim taken over: set to this waiter's token when it is gone or still the one waited on
# (KEYS[1] the claim; ARGV: the token waited on, this waiter's token, its life in ms). 1: taken.
_TAKE_OVER = """
local held = redis.call('GET', KEYS[1])
if held == false or held == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
"""


def _key_digest(key: Hashable) -> str:
    return hashlib.blake2b(repr(key).encode(), digest_size=16).hexdigest()


def _token() -> bytes:
    """A claim's value: this claim's own, so a takeover replaces only the claim it waited on."""
    return os.urandom(12).hex().encode()


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
        from .redis_nodes import mget_by_slot, raising, usable  # redis-py: imported where used

        connection = self.cache.connection
        async with self._client.held() as client:
            if not self._client.cluster:
                return list(await client.mget(names))
            if usable(client, connection.read_from_replicas):
                return raising(await mget_by_slot(client, names, timeout=connection.socket_timeout))
            return list(await client.mget_nonatomic(names))

    async def _pipelined(self, routed: Sequence[Routed], *, resend_lost: bool) -> list[Any]:
        from .redis_nodes import pipelined

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
            claims = [(name, ("SET", name, _token(), "NX", "PX", ttl_ms)) for name in names]
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

    async def wait_many(self, keys: Sequence[Hashable]) -> list[tuple[bool, Any, bool]]:
        """Per key ``(found, answer, claimed)`` once another worker's call of it reached the
        cache; not found when this worker is to ask the service itself: its claim was given up
        without an answer, this worker took it over (see :class:`Waits`; then ``claimed``: its
        to give up, as :meth:`claim_many`'s), or the wait ended."""
        bound = self.cache.single_flight or 0.0
        if not keys:
            return []
        loop = asyncio.get_running_loop()
        names = [self._claim_of(key) for key in keys]
        try:
            started = loop.time()
            answers = [self.key_of(key) for key in keys]
            routed = [(n, ("GET", n)) for n in answers] + [(n, ("GET", n)) for n in names]
            seen = await self._pipelined(routed + [(n, ("PTTL", n)) for n in names], resend_lost=True)
        except Exception as exc:  # noqa: BLE001 - ask the service instead
            self._unreachable(exc)
            return [(False, None, False)] * len(keys)
        n = len(keys)
        waits = Waits(bound, started, names, list(zip(seen[:n], seen[n : 2 * n], seen[2 * n :], strict=True)))
        pause = _POLL_FIRST
        while waits.waits and loop.time() < waits.end:
            now = loop.time()
            await asyncio.sleep(min(pause, max(0.0, waits.due(now) - now)))
            pause = min(pause * 2, _POLL_MOST)
            open_ = waits.open
            try:
                texts = await self._mget([self.key_of(keys[i]) for i in open_] + [names[i] for i in open_])
                tried = waits.looked(open_, texts[: len(open_)], texts[len(open_) :], loop.time())
                while tried:  # (at most twice: the leader, then the rest)
                    claims = [(names[i], waits.waits[i].token) for i in tried]
                    won = await self._take_over(claims, bound)
                    tried = waits.took(tried, won, loop.time())
            except Exception as exc:  # noqa: BLE001 - ask the service instead
                self._unreachable(exc)
                break
        return [(found, answer, i in waits.taken) for i, (found, answer) in enumerate(waits.out)]

    async def _take_over(self, claims: Sequence[tuple[str, bytes | None]], bound: float) -> list[bool]:
        """Per ``(claim name, token waited on)``, whether this worker now holds that claim: set
        to a token of its own for ``bound`` seconds, only if gone or still the one waited on."""
        ttl_ms = str(max(1, round(bound * 1000)))
        routed = [
            (name, ("EVAL", _TAKE_OVER, "1", name, token or b"", _token(), ttl_ms)) for name, token in claims
        ]
        return [bool(done) for done in await self._pipelined(routed, resend_lost=False)]

    async def get_many(self, keys: Sequence[Hashable]) -> list[tuple[bool, Any]]:
        """Per key ``(found, answer)``: a kept answer (None for a kept miss), or not found."""
        names = [self.key_of(key) for key in keys]
        try:
            texts = await self._mget(names)
        except Exception as exc:  # noqa: BLE001 - a cache is never needed for a right answer
            self._unreachable(exc)
            return [(False, None)] * len(keys)
        out = [decoded(text) for text in texts]
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

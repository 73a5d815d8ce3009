"""How a lookup reaches its service: one key or one batch at a time, through the shared cache
(L2), the limits and the job's budget (:class:`~.base.Lookup` is one). A key in flight is
fetched once; what the service answered is kept in the shared cache; a batch asks only what
the shared cache does not hold."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Sequence
from typing import Any

from .exceptions import LookupServiceError
from .gated import Gated
from .limits import Limits
from .parts import LookupStats
from .shared_cache import SharedCache, SharedCacheClient

__all__ = ["LookupCalls"]


class LookupCalls(Gated):
    """The calls of a lookup (its attributes are the lookup's)."""

    cache: Any
    limits: Limits | None
    shared_cache: SharedCache | None
    stats: LookupStats
    service_name: str
    _l2: SharedCacheClient | None
    _l2_loop: asyncio.AbstractEventLoop | None
    _inflight: dict[Hashable, asyncio.Future[Any] | None]
    dedup: bool

    @property
    def _service(self) -> Any:
        raise NotImplementedError

    def cache_identity(self) -> str:
        raise NotImplementedError

    def cache_credentials(self) -> str:
        raise NotImplementedError

    async def _fetch_one(self, key: Hashable, units: float | None = None) -> Any:
        # a key in _inflight is being fetched; its future exists only once somebody waits on it
        inflight = self._inflight if self.dedup else None
        if inflight is not None:
            inflight[key] = None
        try:
            answer = await self._fetched(key, units)
        except BaseException as exc:
            self.stats.errors += 1
            future = inflight.pop(key, None) if inflight is not None else None
            if future is not None:
                if isinstance(exc, asyncio.CancelledError):
                    future.cancel()
                else:
                    future.set_exception(exc)
                    future.exception()  # retrieved: the waiters may all be gone
            raise
        if self.cache is not None:
            self.cache.put(key, answer)
        future = inflight.pop(key, None) if inflight is not None else None
        if future is not None:
            future.set_result(answer)
        return answer

    async def _fetched(self, key: Hashable, units: float | None) -> Any:
        """One key's answer: from the shared cache, else from another worker's call of it in
        flight (single flight), else from the service (then kept there)."""
        l2 = self._shared()
        claimed = True
        if l2 is not None:
            [(found, kept)] = await l2.get_many([key])
            if found:
                self.stats.shared_cache_hits += 1
                return kept
            [claimed] = await l2.claim_many([key])
            if not claimed:
                [(found, kept, claimed)] = await l2.wait_many([key])
                if found:
                    self.stats.shared_flight_waits += 1
                    return kept
        self.stats.requests += 1
        self.stats.keys_fetched += 1
        try:
            answer = await self._gated(self._service.fetch, key, 1, key, units)
        except Exception:
            if l2 is not None and claimed:
                await l2.release_many([key])  # the others ask themselves now, not at its expiry
            raise
        if l2 is not None:
            await l2.put_many([(key, answer)], release=[key] if claimed else ())
        return answer

    async def _fetch_counted(
        self, keys: list[Any], units: float | None = None
    ) -> list[Any] | LookupServiceError:
        """One batch call, counted; the error instead of the answers when the call failed (the
        answers the shared cache holds are not asked again)."""
        l2 = self._shared()
        if l2 is None:
            return await self._batch_call(keys, units)
        kept = await l2.get_many(keys)
        missing = [key for key, (found, _) in zip(keys, kept, strict=True) if not found]
        self.stats.shared_cache_hits += len(keys) - len(missing)
        if not missing:
            return [answer for _, answer in kept]
        per_key = None if units is None else units / len(keys)
        fresh = await self._fetch_missing(l2, missing, per_key)
        if isinstance(fresh, LookupServiceError):
            return fresh
        answers = iter(fresh)
        return [answer if found else next(answers) for found, answer in kept]

    async def _fetch_missing(
        self, l2: SharedCacheClient, missing: list[Any], per_key: float | None
    ) -> list[Any] | LookupServiceError:
        """The answers of the keys the shared cache lacks: those this worker claims asked of
        the service (kept, their claims given up) while it waits for the others' calls of the
        rest; what no other call brought is asked too."""
        claims = await l2.claim_many(missing)
        mine = [key for key, claimed in zip(missing, claims, strict=True) if claimed]
        theirs = [key for key, claimed in zip(missing, claims, strict=True) if not claimed]
        asked, waited = await asyncio.gather(self._kept_call(l2, mine, per_key, mine), l2.wait_many(theirs))
        if isinstance(asked, LookupServiceError):
            return asked
        self.stats.shared_flight_waits += sum(found for found, _, _ in waited)
        left = [key for key, (found, _, _) in zip(theirs, waited, strict=True) if not found]
        taken = [
            key for key, (found, _, claimed) in zip(theirs, waited, strict=True) if claimed and not found
        ]
        late = await self._kept_call(l2, left, per_key, taken)
        if isinstance(late, LookupServiceError):
            return late
        answers = dict(zip(mine, asked, strict=True))
        answers.update((key, answer) for key, (found, answer, _) in zip(theirs, waited, strict=True) if found)
        answers.update(zip(left, late, strict=True))
        return [answers[key] for key in missing]

    async def _kept_call(
        self, l2: SharedCacheClient, keys: list[Any], per_key: float | None, claimed: Sequence[Any]
    ) -> list[Any] | LookupServiceError:
        """One batch call for ``keys`` (none: no call), its answers kept in the shared cache;
        the ``claimed`` ones' claims (this worker's) given up whether it answered or failed."""
        if not keys:
            return []
        fresh = await self._batch_call(keys, None if per_key is None else per_key * len(keys))
        if isinstance(fresh, LookupServiceError):
            await l2.release_many(claimed)
            return fresh
        kept = [(k, a) for k, a in zip(keys, fresh, strict=True) if not isinstance(a, BaseException)]
        await l2.put_many(kept, release=claimed)
        return fresh

    async def _batch_call(self, keys: list[Any], units: float | None) -> list[Any] | LookupServiceError:
        stats = self.stats
        stats.requests += 1
        stats.keys_fetched += len(keys)
        try:
            return await self._gated(
                self._service.fetch_many, keys, len(keys), keys[0] if len(keys) == 1 else keys, units
            )
        except LookupServiceError as exc:
            stats.errors += 1
            return exc

    def _shared(self) -> SharedCacheClient | None:
        """The shared cache's client of the running loop (None without one), made on first use."""
        if self.shared_cache is None:
            return None
        loop = asyncio.get_running_loop()
        if self._l2 is None or self._l2_loop is not loop:
            self._l2, self._l2_loop = (
                self.shared_cache.connect(self.cache_identity(), self.cache_credentials()),
                loop,
            )
        return self._l2

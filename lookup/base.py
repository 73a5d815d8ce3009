"""What every lookup shares: the cache, in-flight deduplication, batches, statistics, and a
client made lazily inside the event loop that uses it (never pickled)."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Sequence
from typing import Any

from keyed_async_wait.core.exceptions import ConfigError
from keyed_async_wait.runtime.function import AsyncFunction

from .batched import BatchedLookups
from .cache import MISS, PartialCache
from .columnar import ColumnarLookups
from .exceptions import BODY_LIMIT, LookupOptionError
from .fields import Field, FieldMapper
from .limits import Gate, Limits, ThrottleStats
from .loop_client import LoopClient
from .parts import LookupStats, suspend

__all__ = ["Lookup", "LookupStats"]


class Lookup(AsyncFunction[Any, dict[str, Any]], BatchedLookups, ColumnarLookups, LoopClient):
    """Base of the lookups. Subclasses implement :meth:`_fetch` (one key) and, when the service
    has one, :meth:`_fetch_many` (a batch call), plus :meth:`_make_client` / :meth:`_close_client`.

    ``invoke(record)`` returns ``[result]`` or ``[]`` for a miss; ``invoke_batch`` exists when
    the lookup batches (``self.batching``) and returns one such list, or an exception, per record.
    """

    @property
    def eager_start(self) -> bool:  # type: ignore[override]
        """Eager only with a cache: hits then finish without a task; misses yield once (below)
        before any I/O, so the request runs inside its task. Without a cache eagerness would
        only cost that extra loop turn."""
        return self.cache is not None

    def __init__(
        self,
        *,
        fields: Sequence[Field | str | tuple[str, str]] | None = None,
        result_path: str | None = None,
        cache: PartialCache | None = None,
        dedup: bool = True,
        error_body_chars: int = BODY_LIMIT,
        limits: Limits | None = None,
    ) -> None:
        if error_body_chars < 0:
            raise LookupOptionError(
                "error_body_chars", f"error_body_chars={error_body_chars}; allowed: an integer >= 0"
            )
        self.error_body_chars = error_body_chars  # how much of an answer an error may show
        self.mapper = FieldMapper(fields, result_path, error_body_chars)
        self.cache = cache
        self.dedup = dedup
        self.stats = LookupStats()
        if limits is not None and not isinstance(limits, Limits):
            raise ConfigError("limits", limits, "a Limits(...) or None")
        self.limits = limits
        self._gate: Gate | None = None
        self._gate_loop: asyncio.AbstractEventLoop | None = None
        self._inflight: dict[Hashable, asyncio.Future[Any] | None] = {}
        self._memo_results: dict[Hashable, Any] | None = None  # mapped results, in memoized()
        if self.batching:
            self.invoke_batch = self._invoke_batch

    # ------------------------------------------------------------------ subclass hooks

    async def _fetch(self, key: Hashable) -> Any:
        """The decoded answer for one key, or None for a miss."""
        raise NotImplementedError

    async def _fetch_many(self, keys: list[Hashable]) -> list[Any]:
        """Answers (or exceptions) for many keys, in order; by default one ``_fetch`` each."""
        return await asyncio.gather(*(self._fetch(k) for k in keys), return_exceptions=True)

    # ------------------------------------------------------------------ client lifecycle

    async def aclose(self) -> None:
        gate, self._gate, self._gate_loop = self._gate, None, None
        if gate is not None:
            await gate.aclose()
        await self._drop_client()

    async def close(self) -> None:
        await self.aclose()

    def __getstate__(self) -> dict[str, Any]:
        state = self._without_client(self.__dict__.copy())
        state["_inflight"] = {}
        state["_memo_results"] = None
        state["_gate"] = state["_gate_loop"] = None
        state.pop("invoke_batch", None)
        state["stats"] = LookupStats()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self.batching:
            self.invoke_batch = self._invoke_batch

    # ------------------------------------------------------------------ lookups

    async def invoke(self, record: Any) -> list[dict[str, Any]]:
        self.stats.records += 1
        key = self.request_key(record)
        cache = self.cache
        if cache is not None:
            cached = cache.get(key)
            if cached is not MISS:
                self.stats.cache_hits += 1
                return self._result(cached, key)
        await suspend()
        if cache is not None:  # filled while we yielded?
            cached = cache.get(key)
            if cached is not MISS:
                self.stats.cache_hits += 1
                return self._result(cached, key)
        if self.dedup and key in self._inflight:
            shared = self._inflight[key]
            if shared is None:
                shared = self._inflight[key] = asyncio.get_running_loop().create_future()
            self.stats.deduplicated += 1
            return self._result(await asyncio.shield(shared), key)
        return self._result(await self._fetch_one(key), key)

    async def _fetch_one(self, key: Hashable) -> Any:
        # a key in _inflight is being fetched; its future exists only once somebody waits on it
        inflight = self._inflight if self.dedup else None
        if inflight is not None:
            inflight[key] = None
        try:
            self.stats.requests += 1
            self.stats.keys_fetched += 1
            answer = await self._gated(self._fetch, key, 1, key)
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

    @property
    def throttle_stats(self) -> ThrottleStats | None:
        """What the limits did in this process (None without limits, or before the first call)."""
        return self._gate.stats if self._gate is not None else None

    def output_schema(self) -> str | None:
        """The declared result columns as a Spark DDL string, when fields were declared."""
        return self.mapper.schema_ddl()

"""What the parts of a lookup share: counters, one loop turn, and the attributes and hooks the
parts (:mod:`.batched`, :mod:`.columnar`) use; :class:`~lookup.base.Lookup` fills them in."""

from __future__ import annotations

import asyncio
import types
from collections.abc import Awaitable, Generator, Hashable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from .cache import PartialCache
from .exceptions import LookupServiceError
from .fields import FieldMapper
from .limits import Gate, Limits

__all__ = ["LookupParts", "LookupStats", "suspend"]


@types.coroutine
def suspend() -> Generator[None, None, None]:
    """Give the loop one turn, so that an eagerly started call continues inside its task."""
    yield


@dataclass
class LookupStats:
    """Counters of one lookup instance in one process (read-only for callers)."""

    records: int = 0  # records asked for
    requests: int = 0  # calls to the service (one per GET, one per MGET or batch POST)
    keys_fetched: int = 0  # lookup keys asked of the service
    cache_hits: int = 0
    deduplicated: int = 0  # records served by a request another record had made
    misses: int = 0  # answers that found nothing
    errors: int = 0


@runtime_checkable
class ReportsLookupStats(Protocol):
    """What the Spark layer counts per task: a lookup, or a function of the user's made of
    lookups (as ``kaw-enrich``'s), whose ``stats`` is a :class:`LookupStats`."""

    @property
    def stats(self) -> LookupStats: ...


class LookupParts:
    """The attributes and hooks of a lookup that its parts rely on."""

    service = "service"
    batching = False
    stats: LookupStats
    cache: PartialCache | None
    mapper: FieldMapper
    _memo_results: dict[Hashable, Any] | None
    limits: Limits | None
    _gate: Gate | None
    _gate_loop: asyncio.AbstractEventLoop | None

    def gate(self) -> Gate | None:
        """The gate of the running event loop (None without limits), made there on first use."""
        if self.limits is None:
            return None
        loop = asyncio.get_running_loop()
        if self._gate is None or self._gate_loop is not loop:
            self._gate, self._gate_loop = Gate(self.limits), loop
        return self._gate

    def _gated(self, call: Any, argument: Any, keys: int, lookup_key: Any) -> Awaitable[Any]:
        """``call(argument)`` to await, through the gate when the lookup has limits (without
        limits the call itself: no coroutine in between on the hot path)."""
        gate = self.gate()
        if gate is None:
            return call(argument)
        return self._through_gate(gate, call, argument, keys, lookup_key)

    async def _through_gate(self, gate: Gate, call: Any, argument: Any, keys: int, lookup_key: Any) -> Any:
        started = await gate.enter(keys, lookup_key, self.service)
        try:
            answer = await call(argument)
        except BaseException as exc:
            gate.leave(started, exc)
            raise
        gate.leave(started, None)
        return answer

    def request_key(self, record: Any) -> Hashable:
        """What identifies one lookup (for the cache, deduplication and batches)."""
        raise NotImplementedError

    async def _fetch_many(self, keys: list[Hashable]) -> list[Any]:
        raise NotImplementedError

    async def _fetch_one(self, key: Hashable) -> Any:
        raise NotImplementedError

    def input_fields(self) -> tuple[str, ...]:
        """The record fields the lookup's templates read, in order of first use."""
        return ()

    def _result(self, answer: Any, key: Hashable) -> list[dict[str, Any]]:
        if answer is None:
            self.stats.misses += 1
            return []
        return [self.mapper.map(answer, key, self.service)]

    def _mapped(self, answer: Any, key: Hashable) -> Any:
        try:
            return self._result(answer, key)
        except LookupServiceError as exc:
            return exc

    def _request_keys_fast(self, records: list[Any]) -> list[Any]:
        return [self.request_key(record) for record in records]

    async def _fetch_counted(self, keys: list[Any]) -> list[Any] | LookupServiceError:
        """One batch call, counted; the error instead of the answers when the call failed."""
        stats = self.stats
        stats.requests += 1
        stats.keys_fetched += len(keys)
        try:
            return await self._gated(self._fetch_many, keys, len(keys), keys[0] if len(keys) == 1 else keys)
        except LookupServiceError as exc:
            stats.errors += 1
            return exc

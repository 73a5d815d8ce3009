"""A lookup: a service asked for one key per record (or many keys per batch), with what every
lookup shares: the cache, in-flight deduplication, batches, limits, statistics and the backlog
gear's column-wise path.

``Lookup(service, key="user:{user_id}", fields=[...])`` asks any
:class:`~lookup.service.Service` (a class of your own, see ``docs/guide/backends.md``);
:class:`~lookup.HttpLookup` and :class:`~lookup.RedisLookup` are lookups that are their own
service. Either way the engine reads the lookup through its one backend protocol
(:mod:`keyed_async_wait.runtime.backend`): nothing in it knows this class.
"""

from __future__ import annotations

import asyncio
import copy
import types
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from keyed_async_wait.core.exceptions import ConfigError
from keyed_async_wait.runtime.function import AsyncFunction

from .batched import invoke_batch
from .cache import MISS, PartialCache
from .calls import LookupCalls
from .columnar import ColumnarPath
from .exceptions import BODY_LIMIT, LookupOptionError, LookupServiceError
from .fields import Field, FieldMapper
from .gated import checked_limits
from .limits import Gate, Limits
from .parts import LookupStats, ReportsLookupStats, suspend
from .settings import LookupSettings
from .shared_cache import SharedCache, SharedCacheClient
from .template import Template

__all__ = ["Lookup", "LookupStats", "ReportsLookupStats", "suspend"]


class Lookup(LookupCalls, AsyncFunction[Any, dict[str, Any]]):
    """Look records up in a service.

    Parameters
    ----------
    service : Service, optional
        What answers a key (``fetch(key)``; ``fetch_many(keys)`` for batches). None: the lookup
        is its own service (a subclass that defines ``fetch``).
    key : str or Template
        A template over the record's fields (``"user:{user_id}"``): what is looked up, cached
        and deduplicated, and the fields the lookup reads.
    fields : list of Field or str, optional
        The result columns (names, types, paths into the answer); without it the whole answer
        (or ``result_path`` into it) is the result.
    cache : PartialCache, optional
        Answers kept in this worker process.
    dedup : bool
        Records asking for a key already in flight wait for that call instead of making another.
    limits : Limits, optional
        A rate, an adaptive concurrency limit, a circuit breaker; a budget for the whole job.
    shared_cache : SharedCache, optional
        Answers kept in Redis for every worker and re-run (an L2 behind ``cache``).
    error_body_chars : int
        How much of an answer an error may show.
    """

    service_name = "service"  # the service's name in errors and limits

    def __init__(
        self,
        service: Any = None,
        *,
        key: str | Template | None = None,
        fields: Sequence[Field | str | tuple[str, str]] | None = None,
        result_path: str | None = None,
        cache: PartialCache | None = None,
        dedup: bool = True,
        error_body_chars: int = BODY_LIMIT,
        limits: Limits | None = None,
        shared_cache: SharedCache | None = None,
    ) -> None:
        if error_body_chars < 0:
            raise LookupOptionError(
                "error_body_chars", f"error_body_chars={error_body_chars}; allowed: an integer >= 0"
            )
        if service is not None:
            self.service_name = _service_name(service, key)
        self.service = service
        if key is not None:
            self.key = key if isinstance(key, Template) else Template(key)
        self.error_body_chars = error_body_chars  # how much of an answer an error may show
        self.mapper = FieldMapper(fields, result_path, error_body_chars)
        self.cache, self.limits = _checked_policies(cache, limits)
        if shared_cache is not None and not isinstance(shared_cache, SharedCache):
            raise ConfigError(
                "shared_cache", shared_cache, "a SharedCache(url, expire_after_write=...) or None"
            )
        self.shared_cache = shared_cache
        self.dedup = dedup
        self._fresh_state()

    def _fresh_state(self) -> None:
        """What a process fills as it runs: none of it travels, none of it is shared by copies."""
        self.stats = LookupStats()
        self._gate: Gate | None = None
        self._gate_loop: asyncio.AbstractEventLoop | None = None
        self._l2: SharedCacheClient | None = None
        self._l2_loop: asyncio.AbstractEventLoop | None = None
        self._inflight: dict[Hashable, asyncio.Future[Any] | None] = {}
        self._memo_results: dict[Hashable, Any] | None = None  # mapped results, in memoized()

    def __repr__(self) -> str:
        return f"Lookup({self.service_name} {self.key.text!r})"

    # ------------------------------------------------------------------ the service

    @property
    def batching(self) -> bool:
        """Whether the service answers many keys in one call (then the lookup batches records)."""
        return callable(getattr(self._service, "fetch_many", None))

    @property
    def _service(self) -> Any:
        return self if self.service is None else self.service

    async def fetch(self, key: Hashable) -> Any:
        """The decoded answer for one key, or None for a miss (a subclass's own service)."""
        raise NotImplementedError(f"{type(self).__name__} must define fetch(key) or be given a service")

    def request_key(self, record: Any) -> Hashable:
        """What identifies one lookup (for the cache, deduplication and batches)."""
        return self.key.render(record)

    def request_keys(self, records: list[Any]) -> list[Any]:
        """:meth:`request_key` for many records (raises the first record's error)."""
        return self.key.render_many(records)

    def input_fields(self) -> tuple[str, ...]:
        """The record fields the lookup reads, in order of first use."""
        return self.key.fields

    def _key_template(self) -> Template | None:
        """The template that alone makes the lookup key, when there is one (the columnar path
        renders a column of its one field at once)."""
        return self.key

    def cache_identity(self) -> str:
        """What tells this lookup's answers apart from another's in a shared cache: its class,
        service and key template (subclasses add what selects the answer)."""
        return f"{type(self).__qualname__}|{self.service_name}|{self.key.text}"

    def cache_credentials(self) -> str:
        """What this lookup shows the service to be let in (tokens, passwords; "" without any):
        only a digest of it reaches a shared cache, whose answers it keeps apart."""
        return ""

    def describe_call(self, record: Any) -> str:
        """What this lookup asks for ``record``, for its errors."""
        key = self.request_key(record)
        describe = getattr(self._service, "describe", None)
        return str(describe(key)) if callable(describe) else f"{self.service_name} {key!r}"

    def output_schema(self) -> str | None:
        """The declared result columns as a Spark DDL string, when fields were declared."""
        return self.mapper.schema_ddl()

    # ------------------------------------------------------------------ what the engine reads

    #: True when the service's ``fetch`` may be started outside any task (it yields before
    #: anything that needs one): a lookup without limits or a shared cache then sends its
    #: request in the engine's own step, without a loop turn first
    fetch_outside_task = False

    @property
    def eager_start(self) -> bool:  # type: ignore[override]
        """Eager with a cache (hits finish without a task) or when a call needs no task of its
        own before its first wait (see :meth:`_needs_own_task`). Otherwise a miss yields once
        before any I/O, and eagerness would only cost that extra loop turn."""
        return self.cache is not None or not self._needs_own_task()

    def _needs_own_task(self) -> bool:
        """Whether a call must yield once before its first I/O, to run inside its own task:
        the limits and the shared cache keep per-call state there (a context variable, their
        timeouts), and so may a service that does not say otherwise."""
        return (
            self.limits is not None
            or self.shared_cache is not None
            or not getattr(self._service, "fetch_outside_task", False)
        )

    null_key_is_miss = True  # SQL: a NULL key field is a miss without a call, as a NULL join key

    @property
    def invoke_batch(self) -> Any:
        """``invoke_batch(records)`` when the service batches, else None (one call per record)."""
        return types.MethodType(invoke_batch, self) if self.batching else None

    def columnar(self) -> ColumnarPath:
        """The backlog gear's column-wise form of this lookup."""
        return ColumnarPath(self)

    def counters(self) -> dict[str, int]:
        """Calls made, cache hits and what the limits did, in this process so far."""
        stats = self.stats
        counts = {
            "lookups": stats.requests,
            "cache_hits": stats.cache_hits,
            "shared_cache_hits": stats.shared_cache_hits,
            "deduplicated": stats.deduplicated,
        }
        if self.shared_cache is not None and self.shared_cache.single_flight:
            counts["shared_flight_waits"] = stats.shared_flight_waits
        counts.update(self.limit_counters())
        return counts

    def gauges(self) -> dict[str, Any]:
        throttle = self.throttle_stats
        out: dict[str, Any] = {"limit": throttle.limit or "-"} if throttle is not None else {}
        budget = self._gate.budget_stats if self._gate is not None else None
        if budget is not None:  # the limit in force and where it came from, job-wide
            out["budget"] = budget.followed or "-"
        return out

    def configured(self, settings: Mapping[str, Any]) -> tuple[str, Lookup]:
        """This lookup under a session's settings (``spark.sql.exec.async-lookup.*``, for SQL):
        a cache and limits where it has none of its own. An identity of what was added, and the
        lookup to run (this one when nothing applies; else a new one, nothing shared)."""
        identity, cache, limits = LookupSettings.from_mapping(settings).policies(self.cache, self.limits)
        if not identity:
            return "", self
        return identity, self.with_policies(cache=cache, limits=limits)

    def with_policies(self, *, cache: PartialCache | None, limits: Limits | None) -> Lookup:
        """A copy of this lookup with another cache and limits (checked as the constructor checks
        them), sharing no state with it."""
        other = copy.copy(self)
        other.cache, other.limits = _checked_policies(cache, limits)
        other._fresh_state()
        other._forget_clients()
        return other

    # ------------------------------------------------------------------ client lifecycle

    def _forget_clients(self) -> None:
        """Drop references to live clients (a copy or a pickle makes its own)."""

    async def aclose(self) -> None:
        await self._close_gate()
        l2, self._l2, self._l2_loop = self._l2, None, None
        if l2 is not None:
            await l2.aclose()
        close = getattr(self.service, "aclose", None)
        if callable(close):
            await close()

    async def close(self) -> None:
        await self.aclose()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(stats=LookupStats(), _gate=None, _gate_loop=None, _inflight={}, _memo_results=None)
        state.update(_l2=None, _l2_loop=None)
        return state

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
        if self._needs_own_task():
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
        return self._result(await self._fetch_one(key, self._units((record,), 1)), key)

    def try_one(self, record: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Call once for ``record`` outside Spark and close the clients: its results (``[]``
        for a key the service does not know), or the error a job would meet. For trying a
        lookup's URL, auth and fields before a job; no retries (those are the wait's).

        >>> users.try_one({"user_id": 7})  # doctest: +SKIP
        [{'name': 'user-7', 'score': 52.3}]
        """

        async def once() -> list[dict[str, Any]]:
            try:
                return await self.invoke(record)
            finally:
                await self.aclose()

        try:
            asyncio.get_running_loop()
        except RuntimeError:  # the usual case: no loop here, so one of its own
            return asyncio.run(once())
        # called from a running loop (a notebook): its own loop in a thread, as asyncio.run can't nest
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, once()).result()

    # ------------------------------------------------------------------ results

    def _result(self, answer: Any, key: Hashable) -> list[dict[str, Any]]:
        if answer is None:
            self.stats.misses += 1
            return []
        return [self.mapper.map(answer, key, self.service_name)]

    def _mapped(self, answer: Any, key: Hashable) -> Any:
        try:
            return self._result(answer, key)
        except LookupServiceError as exc:
            return exc


def _service_name(service: Any, key: Any) -> str:
    """The name of a service a lookup is given (checked: it must answer keys, and the lookup
    needs a key template)."""
    if not callable(getattr(service, "fetch", None)):
        raise LookupOptionError("service", f"service={service!r}; allowed: an object with async fetch(key)")
    if key is None:
        raise LookupOptionError(
            "key", "a lookup over a service needs key= (a template, e.g. 'user:{user_id}')"
        )
    return str(getattr(service, "name", type(service).__name__))


def _checked_policies(cache: Any, limits: Any) -> tuple[PartialCache | None, Limits | None]:
    if cache is not None and not isinstance(cache, PartialCache):
        raise ConfigError("cache", cache, "a PartialCache(...) or None")
    return cache, checked_limits(limits)

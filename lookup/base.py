"""What every lookup shares: the cache, in-flight deduplication, batches, statistics, and a
client made lazily inside the event loop that uses it (never pickled)."""

from __future__ import annotations

import asyncio
import contextlib
import types
from collections.abc import Generator, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from keyed_async_wait.runtime.function import AsyncFunction

from .cache import MISS, PartialCache
from .exceptions import BODY_LIMIT, LookupServiceError
from .fields import Field, FieldMapper

__all__ = ["Lookup", "LookupStats"]


@types.coroutine
def _suspend() -> Generator[None, None, None]:
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


class Lookup(AsyncFunction[Any, dict[str, Any]]):
    """Base of the lookups. Subclasses implement :meth:`_fetch` (one key) and, when the service
    has one, :meth:`_fetch_many` (a batch call), plus :meth:`_make_client` / :meth:`_close_client`.

    ``invoke(record)`` returns ``[result]`` or ``[]`` for a miss; ``invoke_batch`` exists when
    the lookup batches (``self.batching``) and returns one such list, or an exception, per record.
    """

    service = "service"
    batching = False

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
    ) -> None:
        if error_body_chars < 0:
            raise ValueError(f"error_body_chars={error_body_chars}; allowed: an integer >= 0")
        self.error_body_chars = error_body_chars  # how much of an answer an error may show
        self.mapper = FieldMapper(fields, result_path, error_body_chars)
        self.cache = cache
        self.dedup = dedup
        self.stats = LookupStats()
        self._client: Any = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._inflight: dict[Hashable, asyncio.Future[Any] | None] = {}
        self._memo_results: dict[Hashable, Any] | None = None  # mapped results, in memoized()
        if self.batching:
            self.invoke_batch = self._invoke_batch

    # ------------------------------------------------------------------ subclass hooks

    def request_key(self, record: Any) -> Hashable:
        """What identifies one lookup (for the cache, deduplication and batches)."""
        raise NotImplementedError

    async def _fetch(self, key: Hashable) -> Any:
        """The decoded answer for one key, or None for a miss."""
        raise NotImplementedError

    async def _fetch_many(self, keys: list[Hashable]) -> list[Any]:
        """Answers (or exceptions) for many keys, in order; by default one ``_fetch`` each."""
        return await asyncio.gather(*(self._fetch(k) for k in keys), return_exceptions=True)

    def _make_client(self) -> Any:
        raise NotImplementedError

    async def _close_client(self, client: Any) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ client lifecycle

    def client(self) -> Any:
        """The client of the running event loop, made on first use in that loop."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            # a client made under another loop fails under this one ("Event loop is closed")
            self._client = self._make_client()
            self._client_loop = loop
        return self._client

    async def aclose(self) -> None:
        client, self._client, self._client_loop = self._client, None, None
        if client is not None:
            await self._close_client(client)

    async def close(self) -> None:
        await self.aclose()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"] = None
        state["_client_loop"] = None
        state["_inflight"] = {}
        state["_memo_results"] = None
        state.pop("invoke_batch", None)
        state["stats"] = LookupStats()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self.batching:
            self.invoke_batch = self._invoke_batch

    # ------------------------------------------------------------------ lookups

    def _result(self, answer: Any, key: Hashable) -> list[dict[str, Any]]:
        if answer is None:
            self.stats.misses += 1
            return []
        return [self.mapper.map(answer, key, self.service)]

    async def invoke(self, record: Any) -> list[dict[str, Any]]:
        self.stats.records += 1
        key = self.request_key(record)
        cache = self.cache
        if cache is not None:
            cached = cache.get(key)
            if cached is not MISS:
                self.stats.cache_hits += 1
                return self._result(cached, key)
        await _suspend()
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
            answer = await self._fetch(key)
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

    def request_keys(self, records: list[Any]) -> list[Hashable | LookupServiceError]:
        """:meth:`request_key` for many records; a record without one gets its error."""
        try:
            return self._request_keys_fast(records)
        except LookupServiceError:
            pass
        keys: list[Hashable | LookupServiceError] = []
        for record in records:
            try:
                keys.append(self.request_key(record))
            except LookupServiceError as exc:
                keys.append(exc)
        return keys

    def _request_keys_fast(self, records: list[Any]) -> list[Any]:
        return [self.request_key(record) for record in records]

    async def _invoke_batch(self, records: list[Any]) -> list[Any]:
        stats, cache = self.stats, self.cache
        stats.records += len(records)
        keys = self.request_keys(records)
        if cache is None and len(dict.fromkeys(keys)) == len(keys):
            fast = await self._fetch_distinct(keys)
            if fast is not None:
                return fast
        out: list[Any] = [None] * len(records)
        cached = cache.get_many(keys) if cache is not None else None
        wanted: dict[Hashable, Any] = {}  # key -> index, or a list of indexes when repeated
        repeated = False
        plain = self.mapper.fields is None and self.mapper.result_path is None
        hits = 0
        value: Any
        for i, key in enumerate(keys):
            if cached is not None:
                value = cached[i]
                if value is not MISS:
                    hits += 1
                    out[i] = ([] if value is None else [value]) if plain else self._mapped(value, key)
                    continue
            if isinstance(key, LookupServiceError):
                out[i] = key
                continue
            slot = wanted.setdefault(key, i)
            if slot != i:
                repeated = True
                stats.deduplicated += 1
                wanted[key] = [*slot, i] if isinstance(slot, list) else [slot, i]
        stats.cache_hits += hits
        if not wanted:
            return out
        await _suspend()
        unique = list(wanted)
        answers = await self._fetch_counted(unique)
        if isinstance(answers, LookupServiceError):
            for slot in wanted.values():
                for i in slot if isinstance(slot, list) else (slot,):
                    out[i] = answers
            return out
        for key, answer in zip(unique, answers, strict=True):
            if isinstance(answer, BaseException):
                stats.errors += 1
                value = answer
            else:
                if cache is not None:
                    cache.put(key, answer)
                if answer is None:
                    stats.misses += 1
                    value = []
                elif plain:
                    value = [answer]
                else:
                    value = self._mapped(answer, key)
            slot = wanted[key]
            if repeated and isinstance(slot, list):
                for i in slot:
                    out[i] = value
            else:
                out[slot] = value
        return out

    async def _fetch_counted(self, keys: list[Any]) -> list[Any] | LookupServiceError:
        """One batch call, counted; the error instead of the answers when the call failed."""
        stats = self.stats
        stats.requests += 1
        stats.keys_fetched += len(keys)
        try:
            return await self._fetch_many(keys)
        except LookupServiceError as exc:
            stats.errors += 1
            return exc

    async def _fetch_distinct(self, keys: list[Any]) -> list[Any] | None:
        """Distinct keys, no cache: one request, answers mapped straight onto the records.

        None when a key is an error (the general path then names it per record).
        """
        if any(isinstance(key, LookupServiceError) for key in keys):
            return None
        await _suspend()
        stats = self.stats
        answers = await self._fetch_counted(keys)
        if isinstance(answers, LookupServiceError):
            return [answers] * len(keys)
        if self.mapper.fields is None and self.mapper.result_path is None:
            out = [[a] if a is not None and not isinstance(a, BaseException) else a for a in answers]
        else:
            out = [
                a if a is None or isinstance(a, BaseException) else self._mapped(a, k)
                for k, a in zip(keys, answers, strict=True)
            ]
        misses = 0
        for i, value in enumerate(out):
            if value is None:
                out[i] = []
                misses += 1
            elif isinstance(value, BaseException):
                stats.errors += 1
        stats.misses += misses
        return out

    def _mapped(self, answer: Any, key: Hashable) -> Any:
        try:
            return self._result(answer, key)
        except LookupServiceError as exc:
            return exc

    # ------------------------------------------------------------------ columnar (backlog)

    def column_keys(self, batch: Any) -> list[Hashable]:
        """The lookup key of every row of an Arrow record batch (reads only the input fields).
        Raises :class:`LookupServiceError` (a TemplateError) if a row lacks one."""
        template = self._key_template()
        if template is not None and template.fields[0] in batch.schema.names:
            keys = template.render_values(batch.column(template.fields[0]).to_pylist())
            if keys is not None:
                return list(keys)
        fields = [name for name in self.input_fields() if name in batch.schema.names]
        return self._request_keys_fast(batch.select(fields).to_pylist())

    def _key_template(self) -> Any:
        """The template that alone makes the lookup key, when there is one (a Template)."""
        return None

    async def results_for_keys(self, keys: list[Hashable], chunk: int, concurrency: int = 8) -> list[Any]:
        """For distinct lookup keys: each key's result list (``[]`` for a miss) or its error.

        The cache (or :meth:`memoized`'s) first; the rest in batch calls of up to ``chunk`` keys,
        ``concurrency`` at a time (or one call per key for a lookup that does not batch).
        """
        out: list[Any] = [None] * len(keys)
        cache, stats = self.cache, self.stats
        stats.records += len(keys)
        todo = list(range(len(keys)))
        mapped = self._memo_results
        if mapped is not None:  # a memoized run: results already mapped, by key
            todo = []
            for i, key in enumerate(keys):
                value = mapped.get(key)
                if value is None:
                    todo.append(i)
                else:
                    out[i] = value
            stats.cache_hits += len(keys) - len(todo)
        elif cache is not None:
            cached = cache.get_many(keys)
            todo = []
            for i, value in enumerate(cached):
                if value is MISS:
                    todo.append(i)
                else:
                    out[i] = [] if value is None else self._mapped(value, keys[i])
            stats.cache_hits += len(keys) - len(todo)
        if not todo:
            return out
        gate = asyncio.Semaphore(concurrency)

        plain = self.mapper.fields is None and self.mapper.result_path is None

        async def fetch(part: list[int]) -> None:
            async with gate:
                wanted = [keys[i] for i in part]
                if self.batching:
                    answers = await self._fetch_counted(wanted)
                else:
                    answers = await asyncio.gather(
                        *(self._fetch_one(k) for k in wanted), return_exceptions=True
                    )
            if not isinstance(answers, list):
                answers = [answers] * len(part)
            put = cache.put if cache is not None else None
            if plain and put is None and mapped is None:  # nothing to keep or map: one pass
                misses = 0
                for i, answer in zip(part, answers, strict=True):
                    if answer is None:
                        misses += 1
                        out[i] = []
                    else:
                        out[i] = answer if isinstance(answer, BaseException) else [answer]
                stats.misses += misses
                return
            for i, answer in zip(part, answers, strict=True):
                if isinstance(answer, BaseException):
                    out[i] = answer
                    continue
                key = keys[i]
                if put is not None:
                    put(key, answer)
                if answer is None:
                    stats.misses += 1
                    value: Any = []
                elif plain:
                    value = [answer]
                else:
                    value = self._mapped(answer, key)
                out[i] = value
                if mapped is not None and type(value) is list:
                    mapped[key] = value

        step = chunk if self.batching else max(1, chunk // concurrency)
        await asyncio.gather(*(fetch(todo[i : i + step]) for i in range(0, len(todo), step)))
        return out

    @contextlib.contextmanager
    def memoized(self) -> Iterator[None]:
        """Within the block each lookup key is fetched at most once: a cache scoped to one run
        (a backlog micro-batch, whose answers are taken as fixed while it runs). A lookup with
        a cache of its own keeps it."""
        own = self.cache is not None
        if not own:
            self.cache = PartialCache(max_rows=10_000_000)
        self._memo_results = {}
        try:
            yield
        finally:
            self._memo_results = None
            if not own:
                self.cache = None

    def input_fields(self) -> tuple[str, ...]:
        """The record fields the lookup's templates read, in order of first use."""
        return ()

    def output_schema(self) -> str | None:
        """The declared result columns as a Spark DDL string, when fields were declared."""
        return self.mapper.schema_ddl()

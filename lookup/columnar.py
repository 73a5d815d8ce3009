"""A lookup in the backlog gear: keys read column-wise from Arrow, each distinct key fetched
once (:meth:`ColumnarPath.memoized`), batch calls a few at a time.

:class:`ColumnarPath` is what a lookup's ``columnar()`` gives the engine (the backend
protocol's :class:`~keyed_async_wait.runtime.backend.Columnar`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Hashable, Iterator
from typing import Any

from .cache import MISS, PartialCache

__all__ = ["ColumnarPath"]


class ColumnarPath:
    """The columnar (backlog) side of one lookup (a :class:`~lookup.Lookup`)."""

    __slots__ = ("lookup",)

    def __init__(self, lookup: Any) -> None:
        self.lookup = lookup

    def column_keys(self, batch: Any) -> list[Hashable]:
        """The lookup key of every row of an Arrow record batch (reads only the input fields).
        Raises :class:`LookupServiceError` (a TemplateError) if a row lacks one."""
        lookup = self.lookup
        template = lookup._key_template()
        if template is not None and len(template.fields) == 1 and template.fields[0] in batch.schema.names:
            keys = template.render_values(batch.column(template.fields[0]).to_pylist())
            if keys is not None:
                return list(keys)
        fields = [name for name in lookup.input_fields() if name in batch.schema.names]
        return lookup.request_keys(batch.select(fields).to_pylist())

    async def results_for_keys(self, keys: list[Hashable], chunk: int, concurrency: int = 8) -> list[Any]:
        """For distinct lookup keys: each key's result list (``[]`` for a miss) or its error.

        The cache (or :meth:`memoized`'s) first; the rest in batch calls of up to ``chunk`` keys,
        ``concurrency`` at a time (or one call per key for a lookup that does not batch).
        """
        lookup = self.lookup
        out: list[Any] = [None] * len(keys)
        cache, stats = lookup.cache, lookup.stats
        stats.records += len(keys)
        todo = list(range(len(keys)))
        mapped = lookup._memo_results
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
                    out[i] = [] if value is None else lookup._mapped(value, keys[i])
            stats.cache_hits += len(keys) - len(todo)
        if not todo:
            return out
        gate = asyncio.Semaphore(concurrency)
        plain = lookup.mapper.fields is None and lookup.mapper.result_path is None
        batching = lookup.batching

        async def fetch(part: list[int]) -> None:
            async with gate:
                wanted = [keys[i] for i in part]
                if batching:
                    answers = await lookup._fetch_counted(wanted)
                else:
                    answers = await asyncio.gather(
                        *(lookup._fetch_one(k) for k in wanted), return_exceptions=True
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
                    value = lookup._mapped(answer, key)
                out[i] = value
                if mapped is not None and type(value) is list:
                    mapped[key] = value

        step = chunk if batching else max(1, chunk // concurrency)
        await asyncio.gather(*(fetch(todo[i : i + step]) for i in range(0, len(todo), step)))
        return out

    @contextlib.contextmanager
    def memoized(self) -> Iterator[None]:
        """Within the block each lookup key is fetched at most once: a cache scoped to one run
        (a backlog micro-batch, whose answers are taken as fixed while it runs). A lookup with
        a cache of its own keeps it."""
        lookup = self.lookup
        own = lookup.cache is not None
        if not own:
            lookup.cache = PartialCache(max_rows=10_000_000)
        lookup._memo_results = {}
        try:
            yield
        finally:
            lookup._memo_results = None
            if not own:
                lookup.cache = None

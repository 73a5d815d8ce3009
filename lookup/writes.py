"""What the ready write actions share (:class:`~lookup.RedisWrite`, :class:`~lookup.HttpWrite`):
the record's version, fencing counts, and a client made lazily inside the event loop that
uses it (never pickled).

A write is fenced by version: it carries its record's version (:mod:`.versions`) and the store
applies it only when that version is newer than the one it holds for the key; a write of an
older or the same version is refused as stale, counted, and is no error (a re-run of one
already applied is refused so: the effect is once per key and version, whatever re-runs).
Each write gives one result, ``{"applied": bool}`` (the column's name is ``result=``).

Unlike a lookup a write has no cache, no in-flight deduplication and no batch path that merges
records of one key: every record is one write. Like a lookup it takes :class:`~lookup.Limits`
(a rate, calls in flight, the breaker, and a job-wide :class:`~lookup.Budget` it may share with
the lookups of the same service, following the service's quota headers): a call of many writes
(a pipeline, a batch) is one call of as many keys.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import decimal
import json
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from keyed_async_wait.runtime.function import AsyncFunction

from .exceptions import LookupOptionError, LookupServiceError, VersionError
from .gated import Gated, checked_limits
from .limits import Limits
from .loop_client import LoopClient
from .versions import encode_version

__all__ = ["Write", "WriteStats", "to_json"]

NO_VERSION = (
    "version='column' (the record's version: its order_by column or a version column), so that a "
    "re-run never applies a write twice nor an older one over a newer; or at_least_once=True"
)


def to_json(values: Any) -> str:
    """A record's values as JSON: dates and times as ISO text, decimals as their exact text,
    binary as base64; anything else JSON cannot hold is an error, never its repr."""
    return json.dumps(values, default=_json_value, ensure_ascii=False, allow_nan=False)


def _json_value(value: Any) -> Any:
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode("ascii")
    raise TypeError(f"a value of type {type(value).__name__} cannot be written as JSON")


@dataclass
class WriteStats:
    """Counters of one write action in one process (read-only for callers)."""

    records: int = 0  # writes asked for
    requests: int = 0  # calls to the store (a pipeline of a batch is one)
    applied: int = 0  # writes the store applied
    stale: int = 0  # writes refused: the store held that version or a newer one
    superseded: int = 0  # writes not sent: a newer record of the key was waiting (coalesce)
    errors: int = 0


class Write(LoopClient, Gated, AsyncFunction[Any, dict[str, Any]]):
    """Base of the write actions. Subclasses give :meth:`target` (the store's key for a record),
    :meth:`_apply` (one write: True applied, False stale), optionally :meth:`_apply_many`, and
    :meth:`_make_client` / :meth:`_close_client` (:class:`~lookup.loop_client.LoopClient`)."""

    service_name = "store"
    batching = False
    writes = True  # it changes a store: SQL gets it only with allow_writes=True

    def __init__(
        self,
        *,
        version: str | None,
        at_least_once: bool,
        fields: tuple[str, ...],
        result: str = "applied",
        coalesce: bool = False,
        outcome: str = "outcome",
        limits: Limits | None = None,
    ) -> None:
        self.limits = checked_limits(limits)
        for name, value in (("result", result), ("outcome", outcome)):
            if not isinstance(value, str) or not value.isidentifier():
                raise LookupOptionError(name, f"{name}={value!r}; allowed: a column name")
        if coalesce and outcome == result:
            raise LookupOptionError("outcome", f"outcome={outcome!r}; allowed: a name other than result=")
        self.result, self.outcome, self.coalesce = result, outcome, bool(coalesce)
        if version is None and not at_least_once:
            raise LookupOptionError("version", f"a write needs {NO_VERSION}")
        if version is not None and not isinstance(version, str):
            raise LookupOptionError("version", f"version={version!r}; allowed: a column name")
        if coalesce and version is None:
            raise LookupOptionError(
                "coalesce",
                "coalesce=True needs version='column': only a store fenced by version ends at the "
                "newest version whatever writes it skips",
            )
        self.version = version
        self.at_least_once = at_least_once
        self.stats = WriteStats()
        self._fields = fields

    # ------------------------------------------------------------------ subclass hooks

    def target(self, record: Any) -> Hashable:
        raise NotImplementedError

    async def _apply(self, record: Any, target: Hashable, version: str | None) -> bool:
        raise NotImplementedError

    async def _apply_many(self, items: list[tuple[Any, Hashable, str | None]]) -> list[Any]:
        """Outcomes (True, False or an exception) for many writes, in order."""
        return await asyncio.gather(*(self._apply(*item) for item in items), return_exceptions=True)

    # ------------------------------------------------------------------ what a write is

    def output_schema(self) -> str:
        return f"{self.result} boolean" + (f", {self.outcome} string" if self.coalesce else "")

    def input_fields(self) -> tuple[str, ...]:
        extra = (self.version,) if self.version is not None and self.version not in self._fields else ()
        return (*self._fields, *extra)

    def version_of(self, record: Any, target: Hashable) -> str | None:
        """The record's version string, None only with ``at_least_once`` and no version column."""
        if self.version is None:
            return None
        try:
            return encode_version(record.get(self.version))
        except ValueError as exc:
            raise VersionError(
                f"column {self.version!r}: {exc}", lookup_key=target, service=self.service_name
            ) from None

    @property
    def invoke_batch(self) -> Any:
        """``invoke_batch(records)`` when the store takes many writes in one call, else None."""
        return self._invoke_batch if self.batching else None

    def counters(self) -> dict[str, int]:
        """Calls made, writes applied, refused as stale and superseded, in this process so far."""
        stats = self.stats
        counts = {"lookups": stats.requests, "writes_applied": stats.applied, "writes_stale": stats.stale}
        return {**counts, "writes_superseded": stats.superseded, **self.limit_counters()}

    @property
    def superseded(self) -> Any:
        """With ``coalesce``: the results of a record whose write is skipped because a newer
        record of its key waited behind the same write in flight (the engine runs the newest)."""
        return self._superseded if self.coalesce else None

    def _superseded(self, record: Any) -> list[dict[str, Any]]:
        self.stats.records += 1
        self.stats.superseded += 1
        return [{self.result: False, self.outcome: "superseded"}]

    def describe_call(self, record: Any) -> str:
        return f"{type(self).__name__} of {self.target(record)!r}"

    # ------------------------------------------------------------------ writes

    async def invoke(self, record: Any) -> list[dict[str, Any]]:
        self.stats.records += 1
        target = self.target(record)
        version = self.version_of(record, target)
        self.stats.requests += 1
        try:
            item = (record, target, version)
            applied = await self._gated(self._apply_item, item, 1, target, self._units((record,), 1))
        except BaseException:
            self.stats.errors += 1
            raise
        return [self._counted(applied)]

    async def _invoke_batch(self, records: list[Any]) -> list[Any]:
        self.stats.records += len(records)
        items: list[tuple[Any, Hashable, str | None]] = []
        out: list[Any] = [None] * len(records)
        where: list[int] = []
        for i, record in enumerate(records):
            try:
                target = self.target(record)
                items.append((record, target, self.version_of(record, target)))
                where.append(i)
            except LookupServiceError as exc:  # this record's own problem: the others go on
                self.stats.errors += 1
                out[i] = exc
        if items:
            self.stats.requests += 1
            units = self._units([item[0] for item in items], len(items))
            outcomes = await self._gated(self._apply_many, items, len(items), items[0][1], units)
            for i, outcome in zip(where, outcomes, strict=True):
                if isinstance(outcome, BaseException):
                    self.stats.errors += 1
                    out[i] = outcome
                else:
                    out[i] = [self._counted(bool(outcome))]
        return out

    async def _apply_item(self, item: tuple[Any, Hashable, str | None]) -> bool:
        return await self._apply(*item)

    def _counted(self, applied: bool) -> dict[str, Any]:
        if applied:
            self.stats.applied += 1
        else:
            self.stats.stale += 1
        if self.coalesce:
            return {self.result: applied, self.outcome: "applied" if applied else "stale"}
        return {self.result: applied}

    # ------------------------------------------------------------------ client lifecycle

    async def close(self) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._close_gate()
        await super().aclose()

    def __getstate__(self) -> dict[str, Any]:
        state = self._without_client(self.__dict__.copy())
        state.update(stats=WriteStats(), _gate=None, _gate_loop=None)
        return state

"""A step journal for chains in ``key_ordered_stream``, in Redis: each step a record finishes
is written before the next step starts, so a micro-batch re-run after a crash (SIGKILL of the
driver or an executor) resumes every record at the step it reached.

Parked state keeps a chain's progress across micro-batches; the journal covers the micro-batch
that dies: its records are read again from the source, and without a journal they would run
every step again. Entries live in one Redis hash per micro-batch
(``kaw:journal:<checkpoint>:<batch>``; a field per record: a hash of its input columns), which
expires after ``ttl`` seconds and is deleted once the next micro-batch starts (Spark starts
micro-batch ``n`` only after ``n - 1`` committed, and never re-runs a committed one).

Invariant: a step whose result is in the journal never runs again for that record in a re-run
of the micro-batch; at-least-once holds for the step that was in flight (and for a step whose
answer arrived but whose journal write had not finished).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from keyed_async_wait.core.chain import PROGRESS_FIELD, ChainProgress
from keyed_async_wait.core.exceptions import ConfigError

from .redis_connect import RedisConnection
from .redis_errors import converted_errors

__all__ = ["StepJournal", "TaskJournal", "record_id"]


@dataclass(frozen=True, init=False)
class StepJournal:
    """Where a chain's step journal lives (``key_ordered_stream(..., step_journal=...)``).

    Parameters
    ----------
    redis : str or RedisConnection
        ``redis://[:password@]host:port/db`` (the password never shows in a repr or an error), or
        a :class:`~lookup.RedisConnection` shared with the other Redis parts.
    ttl : float
        Seconds a micro-batch's journal is kept at most (it is deleted sooner, once the next
        micro-batch starts).
    **options
        The :class:`~lookup.RedisConnection` options, with a URL.
    """

    connection: RedisConnection = field(repr=False)
    ttl: float = 86_400.0

    def __init__(self, redis: str | RedisConnection, ttl: float = 86_400.0, **options: Any) -> None:
        object.__setattr__(self, "connection", RedisConnection.of(redis, **options))
        object.__setattr__(self, "ttl", ttl)
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0:
            raise ConfigError("step_journal ttl", ttl, "seconds > 0")

    def __repr__(self) -> str:
        return f"StepJournal(url={self.connection.shown!r}, ttl={self.ttl})"

    def for_task(self, name: str, columns: Sequence[str]) -> TaskJournal:
        """One task's side of the journal of one micro-batch (``name``: its hash)."""
        return TaskJournal(self, name, columns)

    def forget(self, prefix: str, batch_id: int) -> None:
        """Delete micro-batch ``batch_id``'s journal (driver side, once it has committed)."""
        client = self.connection.sync_client()
        try:
            client.delete(f"{prefix}:{batch_id}")
        finally:
            client.close()


def record_id(record: dict[str, Any], columns: Sequence[str]) -> str:
    """A record's name in the journal: a hash of its input columns (the same in a re-run)."""
    values = repr(tuple(record.get(c) for c in columns)).encode()
    return hashlib.blake2b(values, digest_size=12).hexdigest()


class TaskJournal:
    """One task's side: :meth:`load` gives read rows the progress journaled for them (a sync
    client, in the intake), :meth:`write` journals a finished step (async, in the task's loop)."""

    def __init__(self, journal: StepJournal, name: str, columns: Sequence[str]) -> None:
        self.journal, self.name, self.columns = journal, name, tuple(columns)
        self._sync: Any = None
        self._async: Any = None
        self._expiring = False
        self.resumed = 0  # rows that came with journaled progress

    def load(self, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        ids = [record_id(row, self.columns) for row in rows]
        with converted_errors(self.name):
            if self._sync is None:
                self._sync = self.journal.connection.sync_client()
            texts = self._sync.hmget(self.name, ids)
        for row, text in zip(rows, texts, strict=True):
            if text:
                row[PROGRESS_FIELD] = text.decode() if isinstance(text, bytes) else text
                self.resumed += 1

    async def write(self, record: Any, progress: ChainProgress) -> None:
        if not isinstance(record, dict):
            return
        if self._async is None:
            self._async = self.journal.connection.connect()
        with converted_errors(self.name, action="write"):
            async with self._async.held() as client:
                await client.hset(self.name, record_id(record, self.columns), progress.encode())
                if not self._expiring:
                    self._expiring = True
                    await client.expire(self.name, int(self.journal.ttl))

    def close_sync(self) -> None:
        client, self._sync = self._sync, None
        if client is not None:
            client.close()

    async def aclose(self) -> None:
        client, self._async = self._async, None
        if client is not None:
            await client.aclose()

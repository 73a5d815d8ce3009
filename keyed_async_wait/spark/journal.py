"""What ``key_ordered_stream`` asks of a chain's step journal (:class:`ProgressJournal`), and the
names it gives the journal of each micro-batch. The journal itself is a backend's
(``lookup.StepJournal`` keeps it in Redis); nothing here knows one."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from ..core.chain import ChainProgress

__all__ = ["ProgressJournal", "TaskProgress", "journal_prefix"]


class TaskProgress(Protocol):
    """One task's side of a micro-batch's journal."""

    resumed: int  # rows that came with journaled progress

    def load(self, rows: list[dict[str, Any]]) -> None:
        """Give read rows the progress journaled for them (a re-run resumes there)."""
        ...

    async def write(self, record: Any, progress: ChainProgress) -> None:
        """Journal a step the record finished (before its next step starts)."""
        ...

    def close_sync(self) -> None: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class ProgressJournal(Protocol):
    """Where a chain's finished steps are journaled, so that a micro-batch re-run after a crash
    resumes every record at the step it reached."""

    def for_task(self, name: str, columns: Sequence[str]) -> TaskProgress:
        """A task's side of the journal named ``name``, records named by ``columns``."""
        ...

    def forget(self, prefix: str, batch_id: int) -> None:
        """Delete micro-batch ``batch_id``'s journal (it has committed)."""
        ...


def journal_prefix(checkpoint: str) -> str:
    """The name of a query's journals: a hash of its checkpoint (``<prefix>:<batch_id>`` each)."""
    digest = hashlib.blake2b(checkpoint.rstrip("/").encode(), digest_size=8).hexdigest()
    return f"kaw:journal:{digest}"

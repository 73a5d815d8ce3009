"""What an operator keeps between runs: records held back or parked (:meth:`hold`,
:meth:`replay_parked`, :attr:`leftover`), snapshots (:meth:`snapshot`, :meth:`restore`) and
statistics; the part of :class:`~.operator.KeyedAsyncWaitOperator` that is not processing."""

from __future__ import annotations

from ..core.elements import OutputMode, Watermark
from ..core.entry import Entry
from ..core.exceptions import ConfigError, SnapshotError
from ..core.keys import freeze, subtask_for_key
from ..core.parking import ParkedItem
from ..core.snapshot import OperatorSnapshot, SnapshotRecord, snapshot_of
from ..core.spec import WaitSpec
from .runtime import Runtime
from .stats import EMPTY, OperatorStats, stats_of

__all__ = ["OperatorState"]


class OperatorState:
    """The operator's state between and around runs (its attributes are the operator's)."""

    spec: WaitSpec
    _runtime: Runtime | None
    _replay: list[SnapshotRecord | Watermark]
    _parked_replay: list[ParkedItem]
    _leftover: list[ParkedItem]
    _last_stats: OperatorStats | None

    @property
    def mode(self) -> OutputMode:
        return self.spec.mode

    # ------------------------------------------------------------------ parking

    def hold(self) -> None:
        """Stop starting work (a time cap was reached): running attempts finish, the rest of
        the input is read but not run, and the run ends when nothing runs any more. What did not
        finish is in :attr:`leftover` afterwards. Call it from the loop's thread (e.g. from
        ``loop.call_at``); a no-op when nothing runs."""
        if self._runtime is not None:
            self._runtime.hold()

    def replay_parked(self, items: list[ParkedItem]) -> None:
        """Records parked by an earlier run, replayed (in this order) before the next run's new
        input; records not due yet, and later records of their keys, stay parked."""
        if self._runtime is not None:
            raise SnapshotError("replay_parked() before process(), not while it runs")
        if items and self.mode is not OutputMode.KEY_ORDERED:
            raise ConfigError("replay_parked", len(items), "parked records only in KEY_ORDERED mode")
        self._parked_replay = list(items)

    @property
    def leftover(self) -> list[ParkedItem]:
        """After a run that was held or parked records: every record that did not finish, with
        what it carries (attempts, deferral), each key's in arrival order."""
        return list(self._leftover)

    # ------------------------------------------------------------------ state

    def snapshot(self) -> OperatorSnapshot:
        """Every record not yet handed out, and the pending watermarks, grouped by key group.

        Take it between two outputs (while the consumer holds the last one); restore it with
        :meth:`restore` and feed the source from the position it had reached.
        """
        runtime = self._runtime
        entries = runtime.unconsumed() if runtime is not None else []
        if runtime is not None:  # records set aside come after every record inside
            after = entries[-1].seq + 1 if entries else 0
            aside = runtime.run.overflow.peek()
            entries += [Entry(after + i, item.record, item.key) for i, item in enumerate(aside)]
            entries += runtime.pending_entries(after + len(aside))  # read, not admitted yet
        pending = list(self._replay) if runtime is None else []
        return snapshot_of(entries, pending, self.spec.max_parallelism)

    def restore(self, snapshot: OperatorSnapshot, subtask_index: int = 0, parallelism: int = 1) -> None:
        """Replay the key groups this subtask owns before any new input of the next ``process``."""
        if self._runtime is not None:
            raise SnapshotError("restore() before process(), not while it runs")
        if snapshot.max_parallelism != self.spec.max_parallelism:
            raise SnapshotError(
                f"snapshot has max_parallelism {snapshot.max_parallelism}, this operator "
                f"{self.spec.max_parallelism}: key groups would move; use the same max_parallelism"
            )
        self._replay = snapshot.replay_for(subtask_index, parallelism)

    def subtask_for(self, record: object, parallelism: int) -> int:
        """The subtask (0 to ``parallelism - 1``) that owns ``record``'s key once a snapshot is
        restored into ``parallelism`` subtasks (``restore(snapshot, index, parallelism)``): route
        new input there, so each key lives in one subtask and keeps its order. Without a
        ``key`` the whole record is the key, as in snapshots."""
        selector = self.spec.selector
        key = selector(record) if selector is not None else freeze(record)
        return subtask_for_key(key, parallelism, self.spec.max_parallelism)

    # ------------------------------------------------------------------ statistics

    @property
    def stats(self) -> OperatorStats:
        """Statistics of the running ``process()``, or of the last one after it ended."""
        if self._runtime is not None:
            return stats_of(self._runtime)
        return self._last_stats if self._last_stats is not None else EMPTY

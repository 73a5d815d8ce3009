"""Keyed snapshots of the records still inside an operator (FLIP-12, FLIP-519).

A snapshot holds, per key group, every record not yet handed out (running, retrying, waiting
behind its key, finished but not taken) in arrival order, and the watermarks not yet handed out.
Restoring keeps the key groups one subtask owns and replays them before new input, so after
any change of parallelism each key lives in exactly one subtask and keeps its order.

Watermarks: restored into one subtask from one snapshot, they keep their places. When a subtask
restores parts of several snapshots (a rescale), it cannot know how the parts interleaved, so it
replays the records first and then only the watermarks that every part had reached (emitting a
watermark late is always safe; early is not).
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .elements import Watermark
from .exceptions import SnapshotError
from .keys import DEFAULT_MAX_PARALLELISM, key_group_range

__all__ = ["OperatorSnapshot", "SnapshotRecord"]

FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class SnapshotRecord:
    """One unfinished record. ``results`` holds what is left to hand out of a record whose
    results were partly taken (it is not invoked again); otherwise the record runs again."""

    key_group: int
    seq: int
    key: Any
    record: Any
    attempts: int = 0
    results: tuple[Any, ...] | None = None
    part: int = 0


@dataclass(frozen=True)
class OperatorSnapshot:
    """Plain, picklable data: ``key_groups`` maps a key group to its records in arrival order."""

    max_parallelism: int = DEFAULT_MAX_PARALLELISM
    key_groups: Mapping[int, tuple[SnapshotRecord, ...]] = field(default_factory=dict)
    watermarks: tuple[tuple[int, int, Watermark], ...] = ()  # (part, seq, watermark)
    parts: int = 1
    format_version: int = FORMAT_VERSION

    def __len__(self) -> int:
        return sum(len(records) for records in self.key_groups.values())

    @classmethod
    def merge(cls, snapshots: Iterable[OperatorSnapshot]) -> OperatorSnapshot:
        """One snapshot from the snapshots of all subtasks (their key groups are disjoint)."""
        snapshots = list(snapshots)
        if not snapshots:
            return cls()
        max_parallelism = snapshots[0].max_parallelism
        key_groups: dict[int, tuple[SnapshotRecord, ...]] = {}
        watermarks: list[tuple[int, int, Watermark]] = []
        offset = 0
        for snap in snapshots:
            if snap.max_parallelism != max_parallelism:
                raise SnapshotError(
                    f"cannot merge snapshots with max_parallelism {max_parallelism} and "
                    f"{snap.max_parallelism}: the key groups differ"
                )
            for group, records in snap.key_groups.items():
                moved = tuple(replace(r, part=r.part + offset) for r in records)
                if group in key_groups:
                    raise SnapshotError(f"key group {group} appears in two snapshots")
                key_groups[group] = moved
            watermarks.extend((part + offset, seq, wm) for part, seq, wm in snap.watermarks)
            offset += snap.parts
        return cls(max_parallelism, key_groups, tuple(watermarks), parts=max(offset, 1))

    def replay_for(self, subtask_index: int = 0, parallelism: int = 1) -> list[SnapshotRecord | Watermark]:
        """What subtask ``subtask_index`` of ``parallelism`` replays, in replay order."""
        groups = key_group_range(subtask_index, parallelism, self.max_parallelism)
        records = [r for g in groups for r in self.key_groups.get(g, ())]
        records.sort(key=lambda r: (r.part, r.seq))
        if self.parts <= 1:
            marks = [(seq, wm) for _, seq, wm in self.watermarks]
            merged: list[tuple[int, SnapshotRecord | Watermark]] = [(r.seq, r) for r in records]
            merged.extend(marks)
            merged.sort(key=lambda pair: pair[0])
            return [element for _, element in merged]
        by_part: dict[int, list[Watermark]] = {}
        for part, _, wm in self.watermarks:
            by_part.setdefault(part, []).append(wm)
        reached = [max(by_part[p]) if p in by_part else None for p in range(self.parts)]
        out: list[SnapshotRecord | Watermark] = list(records)
        if reached and all(r is not None for r in reached):
            floor = min(r for r in reached if r is not None)
            for wm in sorted({wm for wms in by_part.values() for wm in wms if wm <= floor}):
                out.append(wm)
        return out

    def to_bytes(self) -> bytes:
        try:
            return pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            raise SnapshotError(f"snapshot cannot be serialised: {exc}") from exc

    @classmethod
    def from_bytes(cls, data: bytes) -> OperatorSnapshot:
        try:
            snap = pickle.loads(data)
        except Exception as exc:
            raise SnapshotError(f"not a readable snapshot: {exc}") from exc
        if not isinstance(snap, cls):
            raise SnapshotError(f"not an OperatorSnapshot: {type(snap).__name__}")
        if snap.format_version != FORMAT_VERSION:
            raise SnapshotError(
                f"snapshot format {snap.format_version} is not supported; supported: {FORMAT_VERSION}"
            )
        return snap


def check_picklable(key: Any, record: Any, results: Any) -> None:
    """Raise a SnapshotError naming the key when a record cannot go into a snapshot."""
    try:
        pickle.dumps((record, results), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise SnapshotError(
            f"record with key {key!r} cannot be snapshotted: records (and partly handed-out "
            f"results) must be picklable ({type(exc).__name__}: {exc})"
        ) from exc


def snapshot_of(entries: Iterable[Any], pending: Iterable[Any], max_parallelism: int) -> OperatorSnapshot:
    """The snapshot of a run: its live ``entries`` (records and watermarks not yet handed out,
    in arrival order), or, before a run, the ``pending`` replay (snapshot records and
    watermarks)."""
    from .keys import freeze, key_group_for

    groups: dict[int, list[SnapshotRecord]] = {}
    watermarks: list[tuple[int, int, Watermark]] = []
    for entry in entries:
        if entry.watermark:
            watermarks.append((0, entry.seq, entry.record))
            continue
        key = entry.key if entry.key is not None else freeze(entry.record)
        rest = None  # what is left of a finished record: it is not invoked again (a step that
        # writes must not run twice); a parked or failed record runs again
        if entry.results is not None and entry.failure is None:
            rest = tuple(entry.results[entry.emitted :])
        check_picklable(entry.key, entry.record, rest)
        group = key_group_for(key, max_parallelism)
        groups.setdefault(group, []).append(
            SnapshotRecord(group, entry.seq, key, entry.record, entry.attempts, rest)
        )
    for seq, element in enumerate(pending):
        if isinstance(element, Watermark):
            watermarks.append((0, seq, element))
        else:
            group = key_group_for(element.key, max_parallelism)
            groups.setdefault(group, []).append(
                SnapshotRecord(group, seq, element.key, element.record, element.attempts, element.results)
            )
    return OperatorSnapshot(
        max_parallelism, {g: tuple(records) for g, records in groups.items()}, tuple(watermarks)
    )

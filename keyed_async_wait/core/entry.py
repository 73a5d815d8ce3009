"""The per-record context the controller tracks (FLIP-425's record context)."""

from __future__ import annotations

from typing import Any

__all__ = ["Entry", "State"]


class State:
    """Where an entry is. Plain ints: compared on the hot path."""

    BLOCKED = 0  # waiting behind an earlier record of its key
    READY = 1  # may start; in the active buffer when the action batches
    RUNNING = 2  # an attempt is under way
    WAITING_RETRY = 3  # between attempts
    DONE = 4  # results (or a failure) known, not handed out yet

    NAMES = ("BLOCKED", "READY", "RUNNING", "WAITING_RETRY", "DONE")


class Entry:
    """One record (or one watermark) inside the operator.

    ``seq`` is the arrival number (it also places the entry in its watermark epoch); ``handle``
    what runs it now (a task, a batch, a retry timer) so that a timeout or close can stop it;
    ``preset`` holds results restored from a snapshot that need no new invocation.

    Slotted, with every field set in ``__init__``: measured, creating and then updating such an
    entry costs about half of what class-level defaults cost (CPython 3.11).
    """

    __slots__ = (
        "attempts",
        "emitted",
        "failure",
        "handle",
        "key",
        "meta",
        "preset",
        "record",
        "released",
        "results",
        "seq",
        "started",
        "state",
        "timer",
        "watermark",
    )

    def __init__(self, seq: int, record: Any, key: Any, state: int = State.BLOCKED) -> None:
        self.seq = seq
        self.record = record
        self.key = key
        self.state = state
        self.watermark = False
        self.attempts = 0
        self.started = 0.0
        self.results: list[Any] | None = None
        self.failure: Any = None
        self.handle: Any = None
        self.timer: Any = None
        self.preset: list[Any] | None = None
        self.emitted = 0
        self.meta: Any = None  # a ParkInfo for a record replayed from parked state
        self.released = False  # its function let the next record of its key start early

    @classmethod
    def for_watermark(cls, seq: int, watermark: Any) -> Entry:
        entry = cls(seq, watermark, None, State.DONE)
        entry.watermark = True
        return entry

    def __repr__(self) -> str:
        kind = "Watermark" if self.watermark else "Entry"
        return f"<{kind} #{self.seq} key={self.key!r} {State.NAMES[self.state]}>"

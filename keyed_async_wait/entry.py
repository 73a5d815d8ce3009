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

    ``seq`` is the arrival number; ``epoch`` the watermark epoch it belongs to; ``handle`` what
    runs it now (a task, a batch, a retry timer) so that a timeout or close can stop it;
    ``preset`` holds results restored from a snapshot that need no new invocation.

    The rarely changed fields are class-level defaults: creating an entry is on the hot path,
    and setting four attributes costs a third of setting fourteen.
    """

    watermark = False
    epoch: Any = None
    attempts = 0
    started = 0.0
    results: list[Any] | None = None
    failure: Any = None
    handle: Any = None
    timer: Any = None
    preset: list[Any] | None = None
    emitted = 0

    def __init__(self, seq: int, record: Any, key: Any, state: int = State.BLOCKED) -> None:
        self.seq = seq
        self.record = record
        self.key = key
        self.state = state

    @classmethod
    def for_watermark(cls, seq: int, watermark: Any) -> Entry:
        entry = cls(seq, watermark, None, State.DONE)
        entry.watermark = True
        return entry

    def __repr__(self) -> str:
        kind = "Watermark" if self.watermark else "Entry"
        return f"<{kind} #{self.seq} key={self.key!r} {State.NAMES[self.state]}>"

"""Two gears, after FLIP-327: throughput while catching up on a backlog, latency once caught up.

Pure decisions: :meth:`BacklogPolicy.decide` says which :class:`Gear` a run (a Spark task) uses,
and why. The gear only sets how records are gathered into batch calls (capacity, batch size,
buffer timeout): the ordering mode, and so per-key order and the output itself, do not change.

- ``backlog``: many records inside at once, large batches (MGET, batch POST) that leave only when
  full, when the intake must wait or when nothing else is in flight (no short timers);
  identical lookups in a batch or in flight are made once.
- ``caught-up``: few records inside, small batches that leave within milliseconds.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .exceptions import ConfigError

__all__ = ["BACKLOG", "CAUGHT_UP", "BacklogPolicy", "Gear", "GearKind"]


class GearKind(enum.Enum):
    BACKLOG = "backlog"
    CAUGHT_UP = "caught-up"


@dataclass(frozen=True)
class Gear:
    """A gear's settings. ``name``: which of the two it is (a :class:`GearKind`, or its value)."""

    name: GearKind | str
    capacity: int
    batch_size: int
    buffer_timeout: float | None  # None: no timer (see KeyedAsyncWaitOperator)

    def __post_init__(self) -> None:
        try:
            kind = GearKind(self.name)
        except ValueError:
            allowed = ", ".join(repr(k.value) for k in GearKind)
            raise ConfigError("Gear name", self.name, allowed) from None
        object.__setattr__(self, "name", kind.value)
        object.__setattr__(self, "_kind", kind)

    @property
    def kind(self) -> GearKind:
        kind: GearKind = self.__dict__["_kind"]
        return kind

    @property
    def is_backlog(self) -> bool:
        return self.kind is GearKind.BACKLOG


BACKLOG = Gear(GearKind.BACKLOG, capacity=10_000, batch_size=2_000, buffer_timeout=None)
CAUGHT_UP = Gear(GearKind.CAUGHT_UP, capacity=100, batch_size=50, buffer_timeout=0.002)


@dataclass(frozen=True)
class BacklogPolicy:
    """How the gear is chosen.

    ``is_backlog``: True or False forces a gear; None decides per run: a bounded (batch) query
    is backlog; otherwise a run whose input reaches ``threshold_rows`` is backlog (a
    micro-batch that large is catching up), and so is one whose event time lags the clock by
    more than ``max_lag`` seconds (when an event-time column is given); else caught up.
    """

    is_backlog: bool | None = None
    threshold_rows: int = 5_000
    max_lag: float | None = None
    backlog: Gear = BACKLOG
    caught_up: Gear = CAUGHT_UP

    def __post_init__(self) -> None:
        if self.threshold_rows < 1:
            raise ConfigError("backlog threshold_rows", self.threshold_rows, "an integer >= 1")
        if self.max_lag is not None and not self.max_lag > 0:
            raise ConfigError("backlog max_lag", self.max_lag, "seconds > 0, or None")

    def decide(
        self, *, bounded: bool, rows: int, input_ended: bool, lag: float | None = None
    ) -> tuple[Gear, str]:
        """The gear for a run that has seen ``rows`` input rows so far (``input_ended``: all of
        them), with the event-time ``lag`` in seconds when known; and the reason, for logs."""
        if self.is_backlog is not None:
            gear = self.backlog if self.is_backlog else self.caught_up
            return gear, f"is_backlog={self.is_backlog}"
        if bounded:
            return self.backlog, "a bounded (batch) query"
        if rows >= self.threshold_rows:
            return self.backlog, f"input reached {rows} rows (threshold {self.threshold_rows})"
        if lag is not None and self.max_lag is not None and lag > self.max_lag:
            return self.backlog, f"event time lags {lag:.0f} s (max_lag {self.max_lag:.0f} s)"
        ended = "in all" if input_ended else "so far"
        return self.caught_up, f"input {rows} rows {ended} (threshold {self.threshold_rows})"

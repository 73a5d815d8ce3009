"""Which ordering runs for a table-function call: FLIP-519's truth table, as a pure decision.

=================================  =======================  ==========================
output-mode                        key-ordered-enabled      runs
=================================  =======================  ==========================
ORDERED                            any                      ORDERED
ALLOW_UNORDERED, insert-only input any                      UNORDERED
ALLOW_UNORDERED, update stream     false                    ORDERED
ALLOW_UNORDERED, update stream     true                     KEY_ORDERED by upsert key
=================================  =======================  ==========================

An input is an update stream when the call declares an upsert key (``upsert_key =>``) or the
table carries a change-type column (``_change_type``, as Delta's change data feed and
Iceberg's changelog views have, or one named by ``change_column =>``). With no declared upsert
key, the whole row (without the change-type column) is the key, as in Flink.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from keyed_async_wait.core.config import PREFIX
from keyed_async_wait.core.elements import OutputMode
from keyed_async_wait.core.spec import SessionSettings

from .exceptions import TableArgumentError

__all__ = ["CHANGE_COLUMNS", "Decision", "InputShape", "decide", "describe_input"]

CHANGE_COLUMNS = ("_change_type",)
"""Change-type columns recognised without being named."""


@dataclass(frozen=True)
class InputShape:
    """What the table argument is: insert-only, or an update stream with its key columns."""

    update_stream: bool
    key: tuple[str, ...]  # the upsert key, or every column but the change-type column
    whole_row: bool  # no upsert key declared: the whole row is the key
    change_column: str | None
    why: str


@dataclass(frozen=True)
class Decision:
    mode: OutputMode
    key: tuple[str, ...] | None  # the columns records are keyed by (KEY_ORDERED only)
    reason: str

    def describe(self) -> str:
        key = f" by {', '.join(self.key)}" if self.key else ""
        return f"{self.mode.name}{key}: {self.reason}"


def _columns(value: str | Sequence[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(c.strip() for c in value.split(",") if c.strip())
    return tuple(str(c).strip() for c in value)


def describe_input(
    columns: Sequence[str],
    *,
    upsert_key: str | Sequence[str] | None = None,
    change_column: str | None = None,
) -> InputShape:
    """Classify a table argument; raise :class:`TableArgumentError` on columns it lacks."""
    available = ", ".join(columns)
    if change_column is not None and change_column not in columns:
        raise TableArgumentError("change_column", change_column, f"a column of the table ({available})")
    if change_column is None:
        change_column = next((c for c in CHANGE_COLUMNS if c in columns), None)
    key = _columns(upsert_key)
    if upsert_key is not None and not key:
        raise TableArgumentError("upsert_key", upsert_key, "one or more column names, comma-separated")
    missing = [c for c in key if c not in columns]
    if missing:
        raise TableArgumentError(
            "upsert_key", upsert_key, f"columns of the table ({available}); missing: {', '.join(missing)}"
        )
    if key:
        why = f"upsert key {', '.join(key)} declared"
        if change_column:
            why += f", change column {change_column}"
        return InputShape(True, key, False, change_column, why)
    if change_column is not None:
        whole = tuple(c for c in columns if c != change_column)
        return InputShape(True, whole, True, change_column, f"change column {change_column}, no upsert key")
    return InputShape(False, (), False, None, "insert-only (no upsert key declared, no change-type column)")


def decide(conf: SessionSettings, shape: InputShape) -> Decision:
    """The mode FLIP-519's truth table gives for these settings and this input."""
    mode_key, enabled_key = PREFIX + "output-mode", PREFIX + "key-ordered-enabled"
    settings = f"{mode_key}={conf.output_mode}, {enabled_key}={str(conf.key_ordered_enabled).lower()}"
    if conf.output_mode == "ORDERED":
        return Decision(OutputMode.ORDERED, None, f"{settings}; input {shape.why}")
    if not shape.update_stream:
        return Decision(OutputMode.UNORDERED, None, f"{settings}; input {shape.why}")
    if not conf.key_ordered_enabled:
        return Decision(
            OutputMode.ORDERED,
            None,
            f"{settings}; input is an update stream ({shape.why}), for which ALLOW_UNORDERED "
            "alone is not safe: set key-ordered-enabled=true for per-key order",
        )
    whole = " (the whole row is the key)" if shape.whole_row else ""
    reason = f"{settings}; input is an update stream ({shape.why}){whole}"
    return Decision(OutputMode.KEY_ORDERED, shape.key, reason)

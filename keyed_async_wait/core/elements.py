"""The public value types that flow through the operator."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

__all__ = ["FailedRecord", "OutputMode", "Watermark"]


class OutputMode(enum.Enum):
    """How results leave the operator.

    ``ORDERED``: in input order. ``UNORDERED``: as they complete, never across a watermark.
    ``KEY_ORDERED``: records of one key run one at a time in arrival order, different keys
    concurrently; results leave as they complete, never across a watermark.
    """

    ORDERED = "ORDERED"
    UNORDERED = "UNORDERED"
    KEY_ORDERED = "KEY_ORDERED"

    @classmethod
    def parse(cls, value: OutputMode | str) -> OutputMode:
        from .exceptions import ConfigError

        if isinstance(value, OutputMode):
            return value
        try:
            return cls[str(value).strip().upper().replace("-", "_")]
        except KeyError:
            raise ConfigError("mode", value, ", ".join(m.name for m in cls)) from None


@dataclass(frozen=True, order=True, slots=True)
class Watermark:
    """An event-time watermark: no record with a timestamp at or below it follows."""

    timestamp: int | float


@dataclass(frozen=True, slots=True)
class FailedRecord:
    """A record whose action failed for good, emitted when ``on_error="emit"``.

    Nothing is lost: the record itself travels with the cause.
    """

    record: Any
    key: Any
    error_type: str
    error_message: str
    attempts: int
    exception: BaseException | None = None

"""Every option of the operator, checked in one place (pure: no asyncio, no I/O).

The validators here are what the operator, the Spark API and the ``spark.sql.exec.async-lookup.*``
keys all call, so an option is allowed (or refused, with the same words) wherever it is given.
:class:`OperatorSettings` is the frozen, validated set of options one operator runs with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Final, Literal

from .elements import OutputMode
from .exceptions import ConfigError
from .keys import DEFAULT_MAX_PARALLELISM, KeySelector, make_key_selector
from .parking import DeferPolicy
from .retry import RetryStrategy

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_CAPACITY",
    "OperatorSettings",
    "check_choice",
    "check_instance",
    "check_positive_int",
    "check_seconds",
]

DEFAULT_CAPACITY: Final = 100  # Flink's AsyncDataStream default
DEFAULT_BATCH_SIZE: Final = 1000  # FLIP-425's execution.async-state.buffer-size

OnError = Literal["fail", "emit", "defer"]
OnClose = Literal["cancel", "wait"]
Output = Literal["results", "pairs"]


def check_positive_int(name: str, value: Any, *, optional: bool = False) -> Any:
    """``value`` if it is an int >= 1 (or None when ``optional``); else a ConfigError."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(name, value, "an integer >= 1" + (", or None" if optional else ""))
    return value


def check_seconds(name: str, value: Any, *, allow_zero: bool = False, optional: bool = False) -> float | None:
    """``value`` as float seconds if it is a finite number > 0 (or 0 / None when allowed)."""
    if value is None and optional:
        return None
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        allowed = (
            "a number of seconds > 0" + (" or 0" if allow_zero else "") + (", or None" if optional else "")
        )
        raise ConfigError(name, value, allowed)
    return float(value)


def check_choice(name: str, value: Any, allowed: tuple[str, ...]) -> Any:
    if value not in allowed:
        raise ConfigError(name, value, ", ".join(repr(a) for a in allowed))
    return value


def check_instance(name: str, value: Any, kind: type | tuple[type, ...], allowed: str) -> Any:
    """``value`` if it is None or a ``kind``; else a ConfigError saying what is allowed."""
    if value is not None and not isinstance(value, kind):
        raise ConfigError(name, value, allowed)
    return value


@dataclass(frozen=True)
class OperatorSettings:
    """The options of one :class:`KeyedAsyncWaitOperator`, checked when made.

    See the operator for what each means. Made on the Spark driver when a wait is called, so a
    bad option fails there, before any job; the workers build their operators from it.
    """

    mode: OutputMode
    key: Any = None
    capacity: int = DEFAULT_CAPACITY
    blocked_capacity: int = 0  # KEY_ORDERED: records waiting behind their key beyond capacity
    timeout: float | None = None
    retry: RetryStrategy | None = None
    on_error: OnError = "fail"
    defer: DeferPolicy | None = None
    batch_size: int | None = DEFAULT_BATCH_SIZE
    buffer_timeout: float | None = 0.0
    output: Output = "results"
    on_close: OnClose = "cancel"
    max_parallelism: int = DEFAULT_MAX_PARALLELISM
    eager_start: bool | None = None
    track_latency: bool = False
    emit_parked: bool = False

    def __post_init__(self) -> None:
        mode = OutputMode.parse(self.mode)
        if mode is OutputMode.KEY_ORDERED and make_key_selector(self.key) is None:
            raise ConfigError(
                "key",
                self.key,
                "KEY_ORDERED needs a key: a field name, a list of field names, a callable, or WHOLE_RECORD",
            )
        on_error = check_choice("on_error", self.on_error, ("fail", "emit", "defer"))
        if on_error == "defer" and mode is not OutputMode.KEY_ORDERED:
            raise ConfigError(
                "on_error", on_error, "'fail' or 'emit' ('defer' parks a key: KEY_ORDERED only)"
            )
        check_instance("retry", self.retry, RetryStrategy, "a RetryStrategy or None")
        check_instance("defer", self.defer, DeferPolicy, "a DeferPolicy or None")
        values = {
            "mode": mode,
            "capacity": check_positive_int("capacity", self.capacity),
            "blocked_capacity": _check_blocked(self.blocked_capacity, mode),
            "timeout": check_seconds("timeout", self.timeout, optional=True),
            "on_error": on_error,
            "defer": (self.defer or DeferPolicy()) if on_error == "defer" else None,
            "batch_size": check_positive_int("batch_size", self.batch_size, optional=True),
            "buffer_timeout": check_seconds(
                "buffer_timeout", self.buffer_timeout, allow_zero=True, optional=True
            ),
            "output": check_choice("output", self.output, ("results", "pairs")),
            "on_close": check_choice("on_close", self.on_close, ("cancel", "wait")),
            "max_parallelism": check_positive_int("max_parallelism", self.max_parallelism),
            "track_latency": bool(self.track_latency),
        }
        if self.eager_start is not None:
            values["eager_start"] = bool(self.eager_start)
        if self.emit_parked and (mode is not OutputMode.KEY_ORDERED or values["output"] != "pairs"):
            raise ConfigError(
                "emit_parked", self.emit_parked, "True only with KEY_ORDERED and output='pairs'"
            )
        values["emit_parked"] = bool(self.emit_parked)
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def key_selector(self) -> KeySelector | None:
        """The key as a function record -> hashable key (None without a key)."""
        return make_key_selector(self.key)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


def _check_blocked(value: Any, mode: OutputMode) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError("blocked_capacity", value, "an integer >= 0")
    if value and mode is not OutputMode.KEY_ORDERED:
        raise ConfigError(
            "blocked_capacity", value, "0 unless KEY_ORDERED (only there do records wait for a key)"
        )
    return value

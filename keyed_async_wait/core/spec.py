"""The spec of a wait: every option of the operator, with its one name, default and check (pure).

Every door turns into a :class:`WaitSpec`: the operator's keyword arguments, the Spark waits'
(:mod:`keyed_async_wait.spark.api`), the SQL functions, and the session's
``spark.sql.exec.async-lookup.*`` settings, whose operator keys are defined here too
(:data:`OPERATOR_SETTINGS`, read into :class:`SessionSettings`). :meth:`WaitSpec.of` checks and
normalises each option once; :meth:`WaitSpec.resolve` does the same for a wait made in a session,
an option given as None taking the session's setting.

A shared option (one every door takes) is a field of :class:`WaitSpec` with its check in
:meth:`WaitSpec.of`, a key in :data:`OPERATOR_SETTINGS` when a session may set it, a keyword of
the waits, and the code that uses it: nothing in between names it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Final, Literal

from .backlog import Gear
from .checks import check_choice, check_instance, check_positive_int, check_seconds
from .config import (
    SettingsGroup,
    check_known_keys,
    parse_bool,
    parse_choice,
    parse_duration,
    parse_int,
    parse_multiplier,
)
from .elements import OutputMode
from .exceptions import ConfigError
from .keys import DEFAULT_MAX_PARALLELISM, WHOLE_RECORD, KeySelector, make_key_selector
from .parking import DeferPolicy
from .retry import RetryStrategy, lookup_miss

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_BLOCKED",
    "DEFAULT_CAPACITY",
    "DEFAULT_TIMEOUT",
    "OPERATOR_SETTINGS",
    "SessionSettings",
    "WaitSpec",
]

DEFAULT_CAPACITY: Final = 100  # Flink's AsyncDataStream and table.exec.async-lookup.buffer-capacity
DEFAULT_TIMEOUT: Final = 180.0  # table.exec.async-lookup.timeout (a session's default)
DEFAULT_BATCH_SIZE: Final = 1000  # FLIP-425's execution.async-state.buffer-size
# KEY_ORDERED: records that may wait behind their keys in memory, per run (a Spark task); a
# Python row takes about 1 KB, so about 10 MB. Past it a busy key's further records are set aside
# (spilled to the task's local disk in a batch wait, parked in key_ordered_stream)
DEFAULT_BLOCKED: Final = 10_000

OnError = Literal["fail", "emit", "defer"]
OnClose = Literal["cancel", "wait"]
Output = Literal["results", "pairs"]
Key = Any  # None, a field name, field names, a callable record -> key, or WHOLE_RECORD


def _normal_key(key: Any) -> Any:
    """``key`` in its one form: None, a tuple of field names, a callable, or WHOLE_RECORD."""
    if key is None or key is WHOLE_RECORD:
        return key
    if isinstance(key, str):
        return (key,)
    if callable(key):
        return key
    if isinstance(key, Iterable):
        fields = tuple(key)
        if fields and all(isinstance(f, str) for f in fields):
            return fields
    raise ConfigError(
        "key", key, "a field name, a list of field names, a callable record -> key, or WHOLE_RECORD"
    )


@dataclass(frozen=True)
class WaitSpec:
    """One wait's options, checked. Made by :meth:`of` or :meth:`resolve` (the constructor
    takes checked values as they are); see :class:`~keyed_async_wait.operator.KeyedAsyncWaitOperator`
    for what each means. Made on the Spark driver when a wait is called, so a bad option fails
    there, before any job; the tasks build their operators from it."""

    mode: OutputMode
    key: Key = None  # None, a tuple of field names, a callable, or WHOLE_RECORD
    capacity: int = DEFAULT_CAPACITY
    # KEY_ORDERED: records that may wait behind their keys in memory, outside the capacity; past
    # it a busy key's further records are set aside; 0: they count against the capacity instead
    blocked_capacity: int = 0
    timeout: float | None = None  # None: no timeout (resolve() takes the session's instead)
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

    @classmethod
    def of(cls, mode: OutputMode | str, **options: Any) -> WaitSpec:
        """The spec of these options, each checked (a ConfigError names it and what is allowed)
        and in its one form; an option not given takes its default."""
        unknown = sorted(set(options) - set(cls.names()))
        if unknown:
            raise ConfigError(unknown[0], options[unknown[0]], ", ".join(cls.names()[1:]))
        kind = OutputMode.parse(mode)
        given = {f.name: options.get(f.name, f.default) for f in dataclasses.fields(cls)[1:]}
        eager = given["eager_start"]
        return cls(
            mode=kind,
            key=_check_key(given["key"], kind),
            capacity=check_positive_int("capacity", given["capacity"]),
            blocked_capacity=_check_blocked(options.get("blocked_capacity"), kind),
            timeout=check_seconds("timeout", given["timeout"], optional=True),
            retry=check_instance("retry", given["retry"], RetryStrategy, "a RetryStrategy or None"),
            **_error_policy(given["on_error"], given["defer"], kind),
            batch_size=check_positive_int("batch_size", given["batch_size"], optional=True),
            buffer_timeout=check_seconds(
                "buffer_timeout", given["buffer_timeout"], allow_zero=True, optional=True
            ),
            **_output_form(given["output"], given["emit_parked"], kind),
            on_close=check_choice("on_close", given["on_close"], ("cancel", "wait")),
            max_parallelism=check_positive_int("max_parallelism", given["max_parallelism"]),
            eager_start=None if eager is None else bool(eager),
            track_latency=bool(given["track_latency"]),
        )

    @classmethod
    def resolve(cls, session: SessionSettings, mode: OutputMode | str, **options: Any) -> WaitSpec:
        """:meth:`of` for a wait made in a session: ``capacity``, ``timeout``, ``retry`` and
        (KEY_ORDERED) ``blocked_capacity`` given as None (or not at all) take the session's setting."""
        defaults = session.defaults()
        if OutputMode.parse(mode) is not OutputMode.KEY_ORDERED:
            defaults.pop("blocked_capacity")
        for name, value in defaults.items():
            if options.get(name) is None:
                options[name] = value
        return cls.of(mode, **options)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @property
    def key_fields(self) -> tuple[str, ...] | None:
        """The key's field names, when the key is made of fields (else None)."""
        return self.key if isinstance(self.key, tuple) else None

    @cached_property
    def selector(self) -> KeySelector | None:
        """The key as a function record -> hashable key (None without a key); made once."""
        key = self.key
        return make_key_selector(key[0] if isinstance(key, tuple) and len(key) == 1 else key)

    def replaced(self, **changes: Any) -> WaitSpec:
        """This spec with ``changes`` (values already checked, as a gear or a task sets them)."""
        return dataclasses.replace(self, **changes)

    def in_gear(self, gear: Gear | None) -> WaitSpec:
        """This spec in a backlog gear: the backlog's many records inside and large batches that
        leave only when full; caught up, small batches that leave within milliseconds."""
        if gear is None:
            return self
        if gear.is_backlog:
            return self.replaced(
                capacity=max(self.capacity, gear.capacity), batch_size=gear.batch_size, buffer_timeout=None
            )
        return self.replaced(
            batch_size=min(self.batch_size or gear.batch_size, gear.batch_size),
            buffer_timeout=gear.buffer_timeout or 0.0,
        )

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("selector", None)  # made again where it is used (a closure does not pickle)
        return state


def _check_key(key: Any, mode: OutputMode) -> Any:
    key = _normal_key(key)
    if mode is OutputMode.KEY_ORDERED and key is None:
        allowed = "KEY_ORDERED needs a key: a field name, a list of field names, a callable, or WHOLE_RECORD"
        raise ConfigError("key", None, allowed)
    return key


def _check_blocked(value: Any, mode: OutputMode) -> int:
    if value is None:  # not given: the default where records wait for a key, else none
        return DEFAULT_BLOCKED if mode is OutputMode.KEY_ORDERED else 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError("blocked_capacity", value, "an integer >= 0")
    if value and mode is not OutputMode.KEY_ORDERED:
        allowed = "0 unless KEY_ORDERED (only there do records wait for a key)"
        raise ConfigError("blocked_capacity", value, allowed)
    return value


def _error_policy(on_error: Any, defer: Any, mode: OutputMode) -> dict[str, Any]:
    on_error = check_choice("on_error", on_error, ("fail", "emit", "defer"))
    if on_error == "defer" and mode is not OutputMode.KEY_ORDERED:
        raise ConfigError("on_error", on_error, "'fail' or 'emit' ('defer' parks a key: KEY_ORDERED only)")
    defer = check_instance("defer", defer, DeferPolicy, "a DeferPolicy or None")
    return {"on_error": on_error, "defer": (defer or DeferPolicy()) if on_error == "defer" else None}


def _output_form(output: Any, emit_parked: Any, mode: OutputMode) -> dict[str, Any]:
    output = check_choice("output", output, ("results", "pairs"))
    if emit_parked and (mode is not OutputMode.KEY_ORDERED or output != "pairs"):
        raise ConfigError("emit_parked", emit_parked, "True only with KEY_ORDERED and output='pairs'")
    return {"output": output, "emit_parked": bool(emit_parked)}


@dataclass(frozen=True)
class SessionSettings:
    """The operator's ``spark.sql.exec.async-lookup.*`` settings, with Flink's defaults."""

    buffer_capacity: int = DEFAULT_CAPACITY
    blocked_capacity: int = DEFAULT_BLOCKED
    timeout: float = DEFAULT_TIMEOUT
    output_mode: str = "ORDERED"  # or ALLOW_UNORDERED
    key_ordered_enabled: bool = False
    retry_predicate: str | None = None  # LOOKUP_MISS
    retry_strategy: str | None = None  # FIXED_DELAY | EXPONENTIAL_BACKOFF
    fixed_delay: float = 1.0
    max_attempts: int = 3
    initial_delay: float = 1.0
    max_delay: float = 60.0
    multiplier: float = 2.0

    @classmethod
    def from_conf(
        cls,
        get: Callable[[str], Any],
        present: Iterable[str] | None = None,
        others: Iterable[SettingsGroup] = (),
    ) -> SessionSettings:
        """Read and check every operator key with ``get(full_key)`` (None when unset).

        ``present``: every key that is set (or a superset); one under :data:`PREFIX` that neither
        the operator nor one of ``others`` (the lookups' settings, ...) knows is an error naming
        it and the closest known key, never ignored.
        """
        if present is not None:
            check_known_keys(present, (OPERATOR_SETTINGS, *others), get)
        return cls(**OPERATOR_SETTINGS.parse(get))

    def retry(self) -> RetryStrategy | None:
        """The retry strategy the settings describe (None: no retries)."""
        predicate = lookup_miss if self.retry_predicate == "LOOKUP_MISS" else None
        if self.retry_strategy is None:
            return None
        if self.retry_strategy == "FIXED_DELAY":
            return RetryStrategy.fixed_delay(self.max_attempts, self.fixed_delay, retry_on_result=predicate)
        return RetryStrategy.exponential_backoff(
            self.max_attempts, self.initial_delay, self.max_delay, self.multiplier, retry_on_result=predicate
        )

    def defaults(self) -> dict[str, Any]:
        """What a wait takes from the session for an option it leaves as None."""
        return {
            "capacity": self.buffer_capacity,
            "blocked_capacity": self.blocked_capacity,
            "timeout": self.timeout,
            "retry": self.retry(),
        }


def _choice(*allowed: str) -> Callable[[str, Any], str]:
    return lambda key, value: parse_choice(key, value, allowed)


OPERATOR_SETTINGS: Final = SettingsGroup(
    "the operator",
    {
        "buffer-capacity": ("buffer_capacity", parse_int),
        "blocked-capacity": ("blocked_capacity", lambda key, value: parse_int(key, value, minimum=0)),
        "timeout": ("timeout", parse_duration),
        "output-mode": ("output_mode", _choice("ORDERED", "ALLOW_UNORDERED")),
        "key-ordered-enabled": ("key_ordered_enabled", parse_bool),
        "retry-predicate": ("retry_predicate", _choice("LOOKUP_MISS")),
        "retry-strategy": ("retry_strategy", _choice("FIXED_DELAY", "EXPONENTIAL_BACKOFF")),
        "fixed-delay": ("fixed_delay", parse_duration),
        "max-attempts": ("max_attempts", parse_int),
        "initial-delay": ("initial_delay", parse_duration),
        "max-delay": ("max_delay", parse_duration),
        "backoff-multiplier": ("multiplier", parse_multiplier),
    },
)
"""The operator's keys, suffixes of :data:`~keyed_async_wait.core.config.PREFIX`."""

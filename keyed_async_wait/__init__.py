"""Keyed-ordered async lookups for PySpark: Flink's async wait operator, with a key-ordered mode.

What a Spark job uses::

    from keyed_async_wait import AsyncDataStream
    out = AsyncDataStream.unordered_wait(df, lookup)                      # a static table
    out = AsyncDataStream.key_ordered_wait(df, lookup, key="order_id", order_by="offset")

Errors (one tree, drawn in :mod:`keyed_async_wait.core.exceptions`) all derive from
:class:`KeyedAsyncWaitError`, the lookups' too. The engine without Spark (the operator, its
watermarks, snapshots and key groups) is :mod:`keyed_async_wait.operator`.
"""

from typing import TYPE_CHECKING

from .core.backlog import BacklogPolicy
from .core.exceptions import (
    ConfigError,
    KeyedAsyncWaitError,
    RecordFailedError,
    RecordKeyError,
    RecordTimeoutError,
    ResultSchemaError,
    ResultTypeError,
    SnapshotError,
    SparkVersionError,
    StateError,
    UnknownSettingError,
)
from .core.keys import WHOLE_RECORD
from .core.parking import DeferPolicy
from .core.retry import RetryStrategy, lookup_miss
from .runtime.chain import Chain, Step, StepError, StepStats
from .runtime.function import AsyncFunction

__version__ = "0.2.0"


if TYPE_CHECKING:  # what type checkers and IDEs see; at run time, imported on first use
    from .spark.api import AsyncDataStream, split_errors
    from .spark.metrics import AsyncWaitMetrics
    from .spark.stream import KeyedStream

_SPARK_NAMES = {
    "AsyncDataStream": "api",
    "split_errors": "api",
    "AsyncWaitMetrics": "metrics",
    "KeyedStream": "stream",
}

# names that moved in 0.2.0: still importable from here for a release, with a DeprecationWarning
_MOVED = {
    name: "keyed_async_wait.operator"
    for name in (
        "FailedRecord",
        "KeyedAsyncWaitOperator",
        "OperatorSnapshot",
        "OperatorStats",
        "OutputMode",
        "Watermark",
        "key_group_for",
        "key_group_range",
        "subtask_for_key",
    )
}


_WARNED: set[str] = set()  # each moved name warns once a process (an import asks for it twice)


def __getattr__(name: str) -> object:
    import importlib

    # the Spark layer is imported on first use, so the core never needs pyspark
    module = _SPARK_NAMES.get(name)
    if module is not None:
        return getattr(importlib.import_module(f".spark.{module}", __name__), name)
    home = _MOVED.get(name)
    if home is not None:
        import warnings

        if name not in _WARNED:
            _WARNED.add(name)
            warnings.warn(
                f"keyed_async_wait.{name} is deprecated and goes in the next release: "
                f"import it from {home} ({home}.{name})",
                DeprecationWarning,
                stacklevel=2,
            )
        return getattr(importlib.import_module(home), name)
    raise AttributeError(f"module 'keyed_async_wait' has no attribute {name!r}")


__all__ = [  # noqa: RUF022 - grouped: the Spark calls, the options, the errors
    "AsyncDataStream",
    "AsyncWaitMetrics",
    "KeyedStream",
    "split_errors",
    "AsyncFunction",
    "BacklogPolicy",
    "Chain",
    "DeferPolicy",
    "RetryStrategy",
    "Step",
    "StepStats",
    "WHOLE_RECORD",
    "lookup_miss",
    "ConfigError",
    "KeyedAsyncWaitError",
    "RecordFailedError",
    "RecordKeyError",
    "RecordTimeoutError",
    "ResultSchemaError",
    "ResultTypeError",
    "SnapshotError",
    "SparkVersionError",
    "StateError",
    "StepError",
    "UnknownSettingError",
]

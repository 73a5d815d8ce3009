"""Keyed-ordered async I/O for Python: Flink's async wait operator, with a key-ordered mode.

``KeyedAsyncWaitOperator`` is the engine-agnostic core (it imports neither pyspark nor any
client library); ``AsyncDataStream`` runs it over Spark DataFrames.
"""

from typing import TYPE_CHECKING

from .core.elements import FailedRecord, OutputMode, Watermark
from .core.exceptions import (
    ConfigError,
    KeyedAsyncWaitError,
    RecordFailedError,
    RecordKeyError,
    RecordTimeoutError,
    ResultTypeError,
    SnapshotError,
    SparkVersionError,
)
from .core.keys import WHOLE_RECORD, key_group_for, key_group_range, subtask_for_key
from .core.parking import DeferPolicy
from .core.retry import RetryStrategy, lookup_miss
from .core.snapshot import OperatorSnapshot
from .runtime.chain import Chain, Step, StepError, StepStats
from .runtime.function import AsyncFunction
from .runtime.operator import KeyedAsyncWaitOperator, OperatorStats

__version__ = "0.1.0"


if TYPE_CHECKING:  # what type checkers and IDEs see; at run time, imported on first use
    from .spark.api import AsyncDataStream, split_errors
    from .spark.metrics import AsyncWaitMetrics

_SPARK_NAMES = {
    "AsyncDataStream": "api",
    "split_errors": "api",
    "AsyncWaitMetrics": "metrics",
}


def __getattr__(name: str) -> object:
    # the Spark layer is imported on first use, so the core never needs pyspark
    module = _SPARK_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'keyed_async_wait' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".spark.{module}", __name__), name)


__all__ = [  # noqa: RUF022 - grouped: the lazy Spark names first
    "AsyncDataStream",
    "AsyncWaitMetrics",
    "split_errors",
    "WHOLE_RECORD",
    "AsyncFunction",
    "Chain",
    "ConfigError",
    "DeferPolicy",
    "FailedRecord",
    "KeyedAsyncWaitError",
    "KeyedAsyncWaitOperator",
    "OperatorSnapshot",
    "OperatorStats",
    "OutputMode",
    "RecordFailedError",
    "RecordKeyError",
    "RecordTimeoutError",
    "ResultTypeError",
    "RetryStrategy",
    "SnapshotError",
    "SparkVersionError",
    "Step",
    "StepError",
    "StepStats",
    "Watermark",
    "key_group_for",
    "key_group_range",
    "lookup_miss",
    "subtask_for_key",
]

"""The engine without Spark: embed :class:`KeyedAsyncWaitOperator` in a program of your own.

Spark users need none of this (``AsyncDataStream`` runs the operator in every task). Another
engine, a service or a test drives the operator itself: it pushes records and watermarks,
awaits results, and snapshots what is in flight. What it takes and gives::

    from keyed_async_wait.operator import KeyedAsyncWaitOperator, OutputMode, Watermark

    op = KeyedAsyncWaitOperator(fn, mode=OutputMode.KEY_ORDERED, key=lambda r: r["id"])

``key_group_for``, ``key_group_range`` and ``subtask_for_key`` are Flink's key groups: which
of ``max_parallelism`` groups a key falls in, and which subtask holds a group, so that a
snapshot's records go back to the subtask that owns their keys at any parallelism.
"""

from .core.elements import FailedRecord, OutputMode, Watermark
from .core.keys import key_group_for, key_group_range, subtask_for_key
from .core.snapshot import OperatorSnapshot
from .runtime.operator import KeyedAsyncWaitOperator, OperatorStats

__all__ = [
    "FailedRecord",
    "KeyedAsyncWaitOperator",
    "OperatorSnapshot",
    "OperatorStats",
    "OutputMode",
    "Watermark",
    "key_group_for",
    "key_group_range",
    "subtask_for_key",
]

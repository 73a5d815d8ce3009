"""What runs in the Spark Python workers for the SQL functions: settings from the task,
the process's instance of a source, and the null-key rule.

Imports no pyspark at module level; ``TaskContext`` is read when a task starts.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from keyed_async_wait.core.config import AsyncLookupConfig
from keyed_async_wait.runtime.function import FunctionAdapter
from keyed_async_wait.spark.worker import shared, worker_loop

from .sources import LookupSource

__all__ = ["source_adapter", "task_conf", "task_time_zone"]


def task_conf() -> AsyncLookupConfig:
    """The ``spark.sql.exec.async-lookup.*`` settings of the session that runs the task, read
    through the task's local properties (workers have no SparkSession). Raises ConfigError."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        return AsyncLookupConfig()
    # every key the session set reaches the task: a misspelt one is an error, not ignored
    present = getattr(context, "_localProperties", None) or {}
    return AsyncLookupConfig.from_conf(context.getLocalProperty, present=present.keys())


def task_time_zone(default: str) -> str:
    """The session time zone of the task (a naive datetime in a TIMESTAMP result is read in
    it); ``default``, the zone when the functions were installed, when the task has none."""
    from pyspark import TaskContext

    context = TaskContext.get()
    zone = context.getLocalProperty("spark.sql.session.timeZone") if context is not None else None
    return zone or default


def source_adapter(source: LookupSource, conf: AsyncLookupConfig) -> FunctionAdapter:
    """The process's instance of ``source`` for a task; for a lookup, a NULL in a key field is a
    miss without a lookup (SQL's rule for a join key)."""
    token, function = source.instance_for(conf)
    adapter = shared(worker_loop().function(token, function))
    return _null_is_miss(adapter, source.null_keys) if source.null_keys else adapter


async def _miss() -> list[Any]:
    return []


def _null_is_miss(adapter: FunctionAdapter, inputs: tuple[str, ...]) -> FunctionAdapter:
    call, call_batch = adapter.call, adapter.call_batch

    def has_null(record: dict[str, Any]) -> bool:
        return any(record.get(name) is None for name in inputs)

    def checked_call(record: Any) -> Awaitable[Any]:
        return _miss() if has_null(record) else call(record)

    checked_batch = None
    if call_batch is not None:
        inner_batch = call_batch

        async def checked_batch(records: list[Any]) -> Any:
            keep = [i for i, r in enumerate(records) if not has_null(r)]
            if len(keep) == len(records):
                return await inner_batch(records)
            values: list[Any] = [[] for _ in records]
            if keep:
                answers = await inner_batch([records[i] for i in keep])
                for i, answer in zip(keep, answers, strict=True):
                    values[i] = answer
            return values

    return adapter.replaced(call=checked_call, call_batch=checked_batch)

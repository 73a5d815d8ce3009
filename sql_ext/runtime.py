"""What runs in the Spark Python workers for the SQL functions: the task's settings, its plan
(through the one plan builder) and the process's instance of a source, with the null-key rule.

Imports no pyspark at module level; ``TaskContext`` is read when a task starts.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from keyed_async_wait.core.config import PREFIX
from keyed_async_wait.core.elements import OutputMode
from keyed_async_wait.core.spec import WaitSpec
from keyed_async_wait.runtime.backend import FunctionAdapter, adapt_function
from keyed_async_wait.spark.plan import Plan, plan_of
from keyed_async_wait.spark.runner import process_instance
from keyed_async_wait.spark.session import SessionView

from .sources import LookupSource

__all__ = ["task_plan", "task_time_zone", "task_view"]


def task_view(source: LookupSource) -> SessionView:
    """The ``spark.sql.exec.async-lookup.*`` settings of the session that runs the task, read
    through the task's local properties (workers have no SparkSession), checked against the
    settings known when the functions were installed. Raises ConfigError."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        return SessionView()
    # every key the session set reaches the task: a misspelt one is an error, not ignored
    present = getattr(context, "_localProperties", None) or {}
    raw = {key: context.getLocalProperty(key) for key in present if str(key).startswith(PREFIX)}
    return SessionView.of(raw, known=source.known)


def task_time_zone(default: str) -> str:
    """The session time zone of the task (a naive datetime in a TIMESTAMP result is read in
    it); ``default``, the zone when the functions were installed, when the task has none."""
    from pyspark import TaskContext

    context = TaskContext.get()
    zone = context.getLocalProperty("spark.sql.session.timeZone") if context is not None else None
    return zone or default


def task_plan(
    source: LookupSource,
    view: SessionView,
    mode: OutputMode,
    *,
    session_tz: str,
    out_schema: Any = None,
    input_columns: tuple[str, ...] | None = None,
    **options: Any,
) -> tuple[Plan, FunctionAdapter]:
    """The plan of this task's call of ``source`` under ``view``'s settings, and the process's
    instance of the source as the settings configure it (a lookup without a cache or limits of
    its own gets those the settings describe). ``options``: the spec's (``key``) and the
    plan's (``join``, ``error_column``)."""
    configured = adapt_function(source.function).configured
    identity, backend = configured(view.raw) if configured is not None else ("", source.function)
    token = f"{source.token}:{identity}" if identity else source.token
    spec_options = {name: options.pop(name) for name in ("key",) if name in options}
    plan = plan_of(
        WaitSpec.resolve(view.operator, mode, **spec_options),
        backend,
        token=token,
        input_columns=input_columns if input_columns is not None else source.inputs,
        result_columns=source.result_columns,
        out_schema=out_schema,
        session_tz=session_tz,
        **options,
    )
    adapter = process_instance(token, backend)
    return plan, (_null_is_miss(adapter, source.null_keys) if source.null_keys else adapter)


async def _miss() -> list[Any]:
    return []


def _null_is_miss(adapter: FunctionAdapter, inputs: tuple[str, ...]) -> FunctionAdapter:
    """For a lookup, a NULL in a key field is a miss without a call (SQL's rule for a join key)."""
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

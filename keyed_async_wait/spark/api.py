"""AsyncDataStream: the operator over Spark DataFrames, batch and Structured Streaming.

    out = AsyncDataStream.key_ordered_wait(orders, users, key="order_id", order_by="offset")

Each call returns a DataFrame with the input columns plus the result columns. The work runs in
``mapInArrow`` with one event loop and one set of clients per Python worker process. Every
option is an explicit keyword parameter, checked on the driver when the call is made.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Literal, NoReturn

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from ..core.backlog import BacklogPolicy
from ..core.checks import check_positive_int
from ..core.elements import OutputMode
from ..core.exceptions import ConfigError, UnknownSettingError
from ..core.keys import WHOLE_RECORD
from ..core.parking import DeferPolicy
from ..core.retry import RetryStrategy
from ..core.spec import WaitSpec
from .balance import Placement
from .column_names import stage_names
from .journal import ProgressJournal
from .key_hash import quoted
from .metrics import AsyncWaitMetrics
from .options import key_columns, make_plan, order_columns, wait_spec
from .stream import KeyedStream
from .stream_build import build_key_ordered_stream
from .task import run_partition

__all__ = ["AsyncDataStream", "split_errors"]

Key = str | Sequence[str] | Any  # a column, columns, or WHOLE_RECORD
Backlog = bool | Literal["auto"] | BacklogPolicy | None


class AsyncDataStream:
    """Flink's ``AsyncDataStream`` for Spark DataFrames (batch and streaming).

    Each wait takes the same keyword-only options, documented on :meth:`ordered_wait`
    (``None`` takes the session's ``spark.sql.exec.async-lookup.*`` setting where there is one).
    """

    @staticmethod
    def ordered_wait(
        df: DataFrame,
        fn: Any,
        *,
        timeout: float | None = None,
        capacity: int | None = None,
        retry: RetryStrategy | None = None,
        output_schema: str | StructType | None = None,
        join: Literal["left", "inner"] = "left",
        error_column: str | None = None,
        batch_size: int | None = 1000,
        metrics: AsyncWaitMetrics | None = None,
        backlog: Backlog = None,
        event_time: str | None = None,
        observe: str | None = None,
        **unknown: NoReturn,
    ) -> DataFrame:
        """Results in input order within each partition.

        Parameters
        ----------
        df : DataFrame
            The records, batch or streaming.
        fn : AsyncFunction, lookup or ``async def``
            Called once per record (or per batch, with ``invoke_batch``).
        timeout : float, optional
            Seconds a record may take, retries included (``...async-lookup.timeout``).
        capacity : int, optional
            Records in flight per task (``...async-lookup.buffer-capacity``).
        retry : RetryStrategy, optional
            When to try a record again (``...async-lookup.retry-strategy`` and friends).
        output_schema : str or StructType, optional
            The result columns (DDL or StructType); lookups with declared fields derive it.
        join : {"left", "inner"}
            Keep (NULL results) or drop the rows whose lookup missed.
        error_column : str, optional
            A struct column for rows that failed (the wait then never fails the job on a record).
        batch_size : int, optional
            Records per ``invoke_batch`` call of a batching function (None: one at a time).
        metrics : AsyncWaitMetrics, optional
            Counters summed over the tasks, read on the driver after an action.
        backlog : bool, "auto" or BacklogPolicy, optional
            Run tasks with a backlog in the backlog gear (FLIP-327): bigger batches, columnar
            lookups, one lookup per distinct key.
        event_time : str, optional
            A column whose lag behind the clock signals a backlog.
        observe : str, optional
            A name under which Spark's observed metrics count rows, misses and errors.

        Returns
        -------
        DataFrame
            The input columns, then the result columns (and ``error_column``).

        Raises
        ------
        ConfigError
            An option out of range, a column that is not there, a result column that clashes;
            raised here, before any job. An unknown option is named with the closest one.

        Examples
        --------
        >>> out = AsyncDataStream.ordered_wait(orders, users, timeout=5.0)  # doctest: +SKIP
        """
        _no_unknown("ordered_wait", unknown)
        spec = wait_spec(
            df, OutputMode.ORDERED, timeout=timeout, capacity=capacity, retry=retry, batch_size=batch_size
        )
        edge = dict(output_schema=output_schema, join=join, error_column=error_column, metrics=metrics)
        return _wait(df, fn, spec, observe, backlog=backlog, event_time=event_time, **edge)

    @staticmethod
    def unordered_wait(
        df: DataFrame,
        fn: Any,
        *,
        timeout: float | None = None,
        capacity: int | None = None,
        retry: RetryStrategy | None = None,
        output_schema: str | StructType | None = None,
        join: Literal["left", "inner"] = "left",
        error_column: str | None = None,
        batch_size: int | None = 1000,
        metrics: AsyncWaitMetrics | None = None,
        backlog: Backlog = None,
        event_time: str | None = None,
        observe: str | None = None,
        **unknown: NoReturn,
    ) -> DataFrame:
        """Results as they complete; may reorder rows within a partition.

        Parameters, Returns, Raises: as :meth:`ordered_wait`.

        Examples
        --------
        >>> out = AsyncDataStream.unordered_wait(orders, users, capacity=200)  # doctest: +SKIP
        """
        _no_unknown("unordered_wait", unknown)
        spec = wait_spec(
            df, OutputMode.UNORDERED, timeout=timeout, capacity=capacity, retry=retry, batch_size=batch_size
        )
        edge = dict(output_schema=output_schema, join=join, error_column=error_column, metrics=metrics)
        return _wait(df, fn, spec, observe, backlog=backlog, event_time=event_time, **edge)

    @staticmethod
    def key_ordered_wait(
        df: DataFrame,
        fn: Any,
        key: Key,
        *,
        order_by: str | Sequence[str] | None = None,
        assume_partitioned: bool = False,
        num_partitions: int | None = None,
        balance_keys: bool = False,
        blocked_capacity: int | None = None,
        timeout: float | None = None,
        capacity: int | None = None,
        retry: RetryStrategy | None = None,
        output_schema: str | StructType | None = None,
        join: Literal["left", "inner"] = "left",
        error_column: str | None = None,
        batch_size: int | None = 1000,
        metrics: AsyncWaitMetrics | None = None,
        backlog: Backlog = None,
        event_time: str | None = None,
        observe: str | None = None,
        **unknown: NoReturn,
    ) -> DataFrame:
        """Rows with the same ``key`` run one at a time in arrival order, different keys
        concurrently.

        Parameters
        ----------
        key : str, list of str or WHOLE_RECORD
            The upsert key. Each key is co-located in one partition (a ``repartition`` by it).
        order_by : str or list of str, optional
            Arrival order within a partition (a Kafka offset, an event time); without it, the
            order Spark delivers, which after a shuffle is not the source order.
        assume_partitioned : bool
            Each key is in one partition already: no repartition or ``num_partitions``. Checked at
            the call on a batch DataFrame (a job over its key columns; a ``ConfigError`` names a
            key in two partitions); a streaming DataFrame's is your word (``key_ordered_stream``
            checks each micro-batch).
        num_partitions : int, optional
            Partitions of the repartition (default: one per task slot of the cluster, so that
            every running task holds as many keys as it can; see "Hot keys, skew and
            Spark's defaults" in the Spark guide).
        balance_keys : bool
            Place each key by its rows, not its hash, so the fullest partition (the job's
            length) holds as few rows as it can: a job at this call counts every key's rows (at
            most 100,000 distinct keys, else the hash, logged). A batch DataFrame only.
        blocked_capacity : int, optional
            Rows that may wait behind their keys per task, outside ``capacity``
            (``...async-lookup.blocked-capacity``, default 10,000, about 10 MB): a hot key never
            holds the other keys back. Past it a hot key's further rows (twice the rows the
            other keys have waiting, on average) are set aside on the task's local disk and
            come back in order, and other waiting rows count against ``capacity``. 0: rows
            behind their key count against ``capacity`` instead.
        df, fn, timeout, capacity, retry, output_schema, join, error_column
            As :meth:`ordered_wait`.
        batch_size, metrics, backlog, event_time, observe
            As :meth:`ordered_wait`, which says what is returned and raised.

        Examples
        --------
        >>> out = AsyncDataStream.key_ordered_wait(  # doctest: +SKIP
        ...     updates, users, "order_id", order_by="offset"
        ... )
        """
        _no_unknown("key_ordered_wait", unknown)
        columns = key_columns(df, key)
        sort_by = order_columns(df, order_by) or None
        check_positive_int("num_partitions", num_partitions, optional=True)
        limits: dict[str, Any] = dict(timeout=timeout, capacity=capacity, retry=retry, batch_size=batch_size)
        spec = wait_spec(df, OutputMode.KEY_ORDERED, key=columns, blocked_capacity=blocked_capacity, **limits)
        sort_in_task = sort_by if df.isStreaming else None  # streaming: Spark rejects sortWithinPartitions
        place = Placement(
            columns, num_partitions, balance_keys, assume_partitioned, sort_by, key is WHOLE_RECORD
        )
        edge: dict[str, Any] = dict(output_schema=output_schema, join=join, error_column=error_column)
        edge.update(metrics=metrics, backlog=backlog, event_time=event_time, sort_in_task=sort_in_task)
        return _wait(df, fn, spec, observe, place=place, **edge)

    @staticmethod
    def key_ordered_stream(
        df: DataFrame,
        fn: Any,
        key: Key,
        *,
        sink: Callable[[DataFrame, int], None],
        checkpoint_location: str,
        order_by: str | Sequence[str] | None = None,
        assume_partitioned: bool = False,
        time_cap: float | None = None,
        defer: DeferPolicy | None = None,
        max_defer_age: float | None = None,
        heartbeat: float | None = None,
        num_partitions: int | None = None,
        keep_versions: int = 3,
        replay_rows: int | None = None,
        state_window: int = 16,
        step_journal: ProgressJournal | None = None,
        blocked_capacity: int | None = None,
        timeout: float | None = None,
        capacity: int | None = None,
        retry: RetryStrategy | None = None,
        output_schema: str | StructType | None = None,
        join: Literal["left", "inner"] = "left",
        error_column: str | None = None,
        batch_size: int | None = 1000,
        metrics: AsyncWaitMetrics | None = None,
        on_error: Literal["fail", "emit", "defer"] | None = None,
        **unknown: NoReturn,
    ) -> KeyedStream:
        """``key_ordered_wait`` for Structured Streaming, unfinished rows kept as keyed state
        across micro-batches (FLIP-455/519): exactly once into an idempotent sink, per key in
        order, across restarts at another parallelism.

        Parameters
        ----------
        sink : callable(DataFrame, int)
            Writes a micro-batch's output, all of it; make it idempotent per batch id.
        checkpoint_location : str
            The query's checkpoint; parked state lives in its ``async_state/``.
        assume_partitioned : bool
            A key's rows of a micro-batch are in one partition already (a Kafka topic keyed so,
            read without ``minPartitions``): with nothing parked, no shuffle. Checked per such
            micro-batch: a key in two partitions fails it, naming the key, uncommitted.
        time_cap : float, optional
            Seconds a task may start work per micro-batch; the rest is parked, key by key.
        defer : DeferPolicy, optional
            A row whose retries ran out is parked and tried again in a later micro-batch; after
            ``max_age`` seconds it is an error row in ``error_column`` (``"_error"`` unless
            named). Without it such a row fails the micro-batch, or is an error row when
            ``error_column`` is given.
        max_defer_age, on_error
            Deprecated: ``defer=DeferPolicy(max_age=...)``; ``on_error="emit"`` is
            ``error_column="_error"`` and ``on_error="defer"`` is ``defer=DeferPolicy()``.
        heartbeat : float, optional
            Seconds: keep micro-batches (and retries of parked rows) going without new input.
        keep_versions, replay_rows, state_window : int
            State versions kept (>= 2); parked rows replayed per micro-batch at most
            (None: the larger of 10,000 and four times the last micro-batch's output);
            micro-batches a segment of state lives before it is compacted.
        step_journal : lookup.StepJournal, optional
            With a :class:`~keyed_async_wait.Chain`: each step a record finishes is written to
            Redis, so a micro-batch re-run after a crash resumes every record at its step.
        blocked_capacity : int, optional
            As :meth:`key_ordered_wait`; past it a hot key's rows are parked (keyed state).
        key, order_by, num_partitions, df, fn, timeout, capacity, retry, output_schema, join
            As :meth:`key_ordered_wait`; ``error_column``, ``batch_size`` and ``metrics`` too.

        Returns
        -------
        KeyedStream
            ``start()`` it; its ``reports`` say what came in, went out and was parked.

        Raises
        ------
        ConfigError
            As :meth:`ordered_wait`; also a batch DataFrame or a type its parked state cannot hold.
        """
        _no_unknown("key_ordered_stream", unknown)
        return build_key_ordered_stream(locals())


def _no_unknown(call: str, unknown: dict[str, Any]) -> None:
    """An option the call does not have: named, with the closest one and all valid ones."""
    if not unknown:
        return
    import inspect

    valid = [
        name
        for name, p in inspect.signature(getattr(AsyncDataStream, call)).parameters.items()
        if p.kind is p.KEYWORD_ONLY
    ]
    name = sorted(unknown)[0]
    closest = difflib.get_close_matches(name, valid, n=1)
    raise UnknownSettingError(
        f"{call}() option {name}", unknown[name], closest[0] if closest else None, ", ".join(valid)
    )


def _wait(df: DataFrame, fn: Any, spec: WaitSpec, observe: str | None, **edge: Any) -> DataFrame:
    """The wait's DataFrame; ``edge["place"]``, a :class:`Placement`, arranges ``df`` first."""
    if observe is not None and (not isinstance(observe, str) or not observe):
        raise ConfigError("observe", observe, "a name for Spark's observed metrics, or None")
    place: Placement | None = edge.pop("place", None)
    plan, out, results = make_plan(df, fn, spec, **edge)
    renamed = stage_names(df.columns)
    if renamed is not None:  # a name Spark reads as a path: renamed for the stage, given back in it
        plan.input_names = tuple(df.columns)
        df = df.toDF(*[renamed.get(c, c) for c in df.columns])
        place = place.renamed(renamed) if place is not None else None
    if place is not None:  # after every option is checked: balancing runs a job
        df = place(df)
    enriched = df.mapInArrow(partial(run_partition, plan), out)
    metrics = edge.get("metrics")
    if metrics is not None and metrics.observed:
        enriched = metrics.observe(enriched)
    if observe is None:
        return enriched
    # Spark's observed metrics: per batch query, or per micro-batch in the streaming query progress
    first = F.col(quoted(results.fieldNames()[0]))
    measures = [
        F.count(F.lit(1)).alias("rows"),
        F.sum(F.when(first.isNull(), 1).otherwise(0)).alias("misses"),
    ]
    if plan.error_column is not None:
        measures.append(
            F.sum(F.when(F.col(quoted(plan.error_column)).isNotNull(), 1).otherwise(0)).alias("errors")
        )
    return enriched.observe(observe, *measures)


def split_errors(df: DataFrame, error_column: str = "_error") -> tuple[DataFrame, DataFrame]:
    """``(rows that succeeded, rows that failed)`` of an output with an error column.

    A batch ``df`` is persisted first (unless it is already): each action on the two parts
    would otherwise run the lookups again, and a row whose call fails on one run and succeeds on
    another would land in both parts, or in neither. ``df.unpersist()`` when done with them.

    Parameters
    ----------
    df : DataFrame
        The output of a wait with ``error_column``.
    error_column : str
        Its name.

    Returns
    -------
    tuple of DataFrame
        The rows without an error (the column dropped), and those with one.
    """
    if not df.isStreaming and not df.is_cached:
        df = df.persist()
    failed = F.col(quoted(error_column)).isNotNull()
    return df.where(~failed).drop(error_column), df.where(failed)

"""The table-function form: ``SELECT * FROM async_lookup(TABLE(orders), 'users', ...)``.

Arguments (constants, by name after the first two):

- ``source``: the name of a registered lookup source.
- ``upsert_key => 'order_id'`` (or ``'a, b'``): declares an update stream keyed by these columns.
- ``change_column => 'op'``: the change-type column of an update stream (``_change_type`` is
  recognised without it).
- ``order_by => 'seq'``: the arrival order within a key (an offset, a sequence number).
- ``buckets => 16``: how many groups of keys an update stream is spread over (below).
- ``join => 'left'`` (keep rows whose lookup missed, results NULL) or ``'inner'`` (drop them).
- ``error_column => '_error'``: a row whose lookup failed (its retries spent, its time out) or
  whose result does not fit its columns keeps its input, with NULL results and the error in
  this struct column (``error_type``, ``error_message``, ``attempts``), as the DataFrame waits'
  ``error_column``; without it such a row fails the task.

The output is the table's columns followed by the source's result columns; a lookup with
several results gives several rows.

Which mode runs follows FLIP-519's truth table (:mod:`sql_ext.modes`), decided in each task
from the session settings, logged (logger ``sql_ext.table``) and counted in
:meth:`AsyncLookupSQL.decisions`. An update stream is partitioned by a hash of its key into
``buckets`` groups, ordered by ``order_by`` inside each, so one key never spans two groups; the
groups are named so that Spark spreads them evenly over its tasks (:mod:`sql_ext.buckets`).
Spark makes one instance per group and runs a task's groups one after another; the groups of a
task share one operator (:mod:`sql_ext.groups`), so every key of the task runs concurrently,
whatever the bucket count. An insert-only input keeps its partitioning.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from keyed_async_wait.core.elements import OutputMode
from keyed_async_wait.core.exceptions import ConfigError
from keyed_async_wait.runtime.operator import KeyedAsyncWaitOperator
from keyed_async_wait.runtime.push import PushDriver
from keyed_async_wait.spark.compat import arrow_type, at_group_boundary
from keyed_async_wait.spark.options import ERROR_STRUCT
from keyed_async_wait.spark.values import column_converter
from keyed_async_wait.spark.worker import worker_loop

from .allowlist import DeclaredSources
from .buckets import bucket_expression
from .declared import DECLARED_KINDS, DECLARED_OPTIONS, declared_source
from .exceptions import TableArgumentError, UnknownSourceError
from .groups import SharedCalls
from .modes import InputShape, decide, describe_input
from .rows import OutputRows
from .runtime import source_adapter, task_conf, task_time_zone
from .sources import LookupSource
from .values import row_reader

__all__ = ["DEFAULT_BUCKETS", "LookupAnalysis", "table_function_class"]

log = logging.getLogger(__name__)

DEFAULT_BUCKETS = 16
_BLOCKED_PER_CAPACITY = 10  # records that may wait behind their keys, per unit of capacity
_PUSH_SIZE = 64  # rows per hand-over to the operator: fewer loop turns, still prompt


def _analysis_base() -> type:
    from pyspark.sql.udtf import AnalyzeResult

    return AnalyzeResult


try:  # pyspark is an optional extra; the class exists only with it
    _AnalyzeResult = _analysis_base()
except ImportError:  # pragma: no cover
    _AnalyzeResult = object


@dataclass
class LookupAnalysis(_AnalyzeResult):  # type: ignore[misc,valid-type]
    """Spark's AnalyzeResult plus what each instance needs (Spark hands it to ``__init__``)."""

    source: str = ""
    declared: LookupSource | None = None  # a source declared in the SQL call itself
    shape: InputShape | None = None
    columns: tuple[str, ...] = ()
    input_schema: Any = None  # the table's StructType
    join: str = "left"
    error_column: str | None = None  # failed rows kept, with their error in this struct column


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _constant(name: str, argument: Any) -> Any:
    if argument is None:
        return None
    if not argument.isConstantExpression:
        raise ConfigError(name, "(a column or an expression)", "a constant, e.g. 'order_id'")
    return argument.value


def _order_columns(value: Any, columns: tuple[str, ...]) -> tuple[str, ...]:
    if value is None:
        return ()
    names = tuple(c.strip() for c in str(value).split(",") if c.strip())
    missing = [c for c in names if c not in columns]
    if not names or missing:
        raise TableArgumentError("order_by", value, f"columns of the table ({', '.join(columns)})")
    return names


CALL_OPTIONS = ("upsert_key", "order_by", "change_column", "buckets", "join", "error_column")


def analyze(
    sources: Mapping[str, LookupSource],
    table: Any,
    source: Any,
    options: Mapping[str, Any],
    allowed: DeclaredSources | None = None,
    spread: list[int] | None = None,
) -> LookupAnalysis:
    """Check the call and derive the output schema and partitioning (runs at analysis time,
    so every error here comes before any lookup). ``options``: the named arguments."""
    from pyspark.sql.types import StructField, StructType
    from pyspark.sql.udtf import OrderingColumn, PartitioningColumn

    if table is None or not table.isTable:
        raise ConfigError("async_lookup first argument", None, "a table: async_lookup(TABLE(t), 'source')")
    unknown = sorted(set(options) - set(CALL_OPTIONS) - set(DECLARED_OPTIONS))
    if unknown:
        raise ConfigError(unknown[0], "(given)", ", ".join((*CALL_OPTIONS, *DECLARED_OPTIONS)))
    upsert_key, order_by, change_column, buckets, join, errors = (options.get(name) for name in CALL_OPTIONS)
    name = _constant("source", source)
    spec = {k: _constant(k, options[k]) for k in DECLARED_OPTIONS if options.get(k) is not None}
    lookup, inline = _resolve_source(sources, name, spec, allowed)
    input_schema: StructType = table.dataType
    columns = tuple(input_schema.fieldNames())
    _check_inputs(lookup, name, columns)
    shape = describe_input(
        columns,
        upsert_key=_constant("upsert_key", upsert_key),
        change_column=_constant("change_column", change_column),
    )
    order = _order_columns(_constant("order_by", order_by), columns)
    if order and not shape.update_stream:
        raise TableArgumentError(
            "order_by", ", ".join(order), "only with an update stream: declare upsert_key => ... too"
        )
    count = _constant("buckets", buckets)
    count = DEFAULT_BUCKETS if count is None else count
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ConfigError("buckets", count, "an integer >= 1")
    mode = _constant("join", join) or "left"
    if mode not in ("left", "inner"):
        raise ConfigError("join", mode, "'left', 'inner'")
    results: StructType = lookup.result_schema
    clash = [f for f in results.fieldNames() if f in columns]
    if clash:
        raise TableArgumentError(
            "source",
            name,
            f"a source whose result columns are not table columns; clashing: {', '.join(clash)}",
        )
    metadata = {"async_lookup.source": name, "async_lookup.input": shape.why}
    fields = list(input_schema.fields) + [
        StructField(f.name, f.dataType, True, metadata) for f in results.fields
    ]
    error_column = _error_column(_constant("error_column", errors), columns, results.fieldNames())
    if error_column is not None:
        fields.append(StructField(error_column, ERROR_STRUCT, True))
    partition_by, order_columns = [], []
    if shape.update_stream:
        hashed = ", ".join(_quoted(c) for c in shape.key)
        partition_by = [PartitioningColumn(bucket_expression(hashed, count, spread))]
        order_columns = [OrderingColumn(_quoted(c)) for c in order]
    return LookupAnalysis(
        schema=StructType(fields),
        partitionBy=partition_by,
        orderBy=order_columns,
        source=name,
        declared=inline,
        shape=shape,
        columns=columns,
        input_schema=input_schema,
        join=mode,
        error_column=error_column,
    )


def _error_column(value: Any, columns: tuple[str, ...], results: list[str]) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.isidentifier():
        raise ConfigError("error_column", value, "a column name")
    if value in columns or value in results:
        raise TableArgumentError("error_column", value, "a name that is no table column and no result column")
    return value


def _resolve_source(
    sources: Mapping[str, LookupSource],
    name: str,
    spec: dict[str, Any],
    allowed: DeclaredSources | None,
) -> tuple[LookupSource, LookupSource | None]:
    """The source named, and whether it was declared in the call itself (inline)."""
    if name in sources and not spec:
        return sources[name], None
    if name in DECLARED_KINDS and name not in sources:
        inline = declared_source(name, spec, allowed)
        return inline, inline
    if spec:
        raise ConfigError(
            next(iter(spec)), "(given)", f"only with a source declared in SQL: {', '.join(DECLARED_KINDS)}"
        )
    known = sorted(sources) + [f"'{k}' with url => ..." for k in DECLARED_KINDS]
    raise UnknownSourceError("source", name, ", ".join(known))


def _check_inputs(lookup: LookupSource, name: str, columns: tuple[str, ...]) -> None:
    missing = [c for c in lookup.inputs if c not in columns]
    if missing:  # in a task every row would miss (a NULL lookup key): say so now
        raise TableArgumentError(
            "source",
            name,
            f"a source whose input fields are columns of the table ({', '.join(columns)}); "
            f"it reads {', '.join(lookup.inputs)}, and {missing[0]!r} is not a column",
        )


class TableCall:
    """One instance's run: the operator fed row by row through a :class:`PushDriver`."""

    def __init__(
        self, sources: Mapping[str, LookupSource], analysis: LookupAnalysis, decisions: Any, time_zone: str
    ) -> None:
        self.source = analysis.declared or sources[analysis.source]
        assert analysis.shape is not None
        self.shape = analysis.shape
        self.columns = analysis.columns
        self.input_schema = analysis.input_schema
        self.time_zone = time_zone
        self.read: Any = None
        self.left = analysis.join == "left"
        self.error_column = analysis.error_column
        self.out: OutputRows | None = None
        self.decisions = decisions
        self.driver: PushDriver | None = None
        self.pending: list[dict[str, Any]] = []
        self.push_size = _PUSH_SIZE

    def _start(self) -> PushDriver:
        conf = task_conf()  # a bad setting fails here, before any lookup
        zone = task_time_zone(self.time_zone)
        self.read = row_reader(self.input_schema, zone)
        convert = {
            f.name: column_converter(arrow_type(f.dataType, zone), zone, arrow=False)
            for f in self.source.result_schema.fields
        }
        self.out = OutputRows(
            self.source.name,
            self.columns,
            self.source.result_columns,
            self.source.inputs,
            convert,
            left=self.left,
            error_column=self.error_column,
        )
        decision = decide(conf, self.shape)
        log.info("async_lookup(%s): %s", self.source.name, decision.describe())
        if self.decisions is not None:
            self.decisions.add({f"{self.source.name}: {decision.describe()}": 1})
        key: Any = None
        if decision.key:
            key = decision.key[0] if len(decision.key) == 1 else list(decision.key)
        # Spark hands a task's rows over group by group: many updates of few keys at a time. Let
        # them wait behind their keys beyond the capacity, so the other keys still run.
        blocked = (
            _BLOCKED_PER_CAPACITY * conf.buffer_capacity if decision.mode is OutputMode.KEY_ORDERED else 0
        )
        on_error = "emit" if self.error_column else "fail"  # with an error column, failures are rows
        settings = conf.operator_settings(
            decision.mode, key=key, output="pairs", blocked_capacity=blocked, on_error=on_error
        )
        op = KeyedAsyncWaitOperator.from_settings(source_adapter(self.source, conf), settings)
        self.push_size = max(1, min(_PUSH_SIZE, conf.buffer_capacity))
        self.driver = PushDriver(op, worker_loop().loop)
        return self.driver

    def eval(self, row: Any) -> Iterator[tuple[Any, ...]]:
        driver = self.driver or self._start()
        self.pending.append(self.read(row))
        if len(self.pending) >= self.push_size:
            batch, self.pending = self.pending, []
            yield from self._rows(self._guarded(driver.push, batch))

    def flush(self) -> Iterator[tuple[Any, ...]]:
        """A group ended, the task goes on: hand over what is pending, the rows ready so far."""
        driver = self.driver
        if driver is None:
            return iter(())
        if not self.pending:
            return self._rows(driver.take())
        batch, self.pending = self.pending, []
        return self._rows(self._guarded(driver.push, batch))

    def terminate(self) -> Iterator[tuple[Any, ...]]:
        """The task's input ended: every row still in flight, waited for."""
        driver = self.driver
        if driver is None:
            return
        batch, self.pending = self.pending, []
        outputs = self._guarded(driver.push, batch) if batch else []
        outputs += self._guarded(driver.finish)
        self.driver = None
        yield from self._rows(outputs)

    @property
    def running(self) -> bool:
        return self.driver is not None

    def abort(self) -> None:
        driver, self.driver = self.driver, None
        if driver is not None:
            driver.abort()

    def _guarded(self, step: Any, *args: Any) -> list[Any]:
        assert self.driver is not None
        try:
            outputs: list[Any] = step(*args)
        except BaseException:
            self.driver.abort()  # no lookups left running in the worker's loop
            raise
        return outputs

    def _rows(self, outputs: list[Any]) -> Iterator[tuple[Any, ...]]:
        assert self.out is not None
        return self.out.rows(outputs)


def table_function_class(
    sources: Mapping[str, LookupSource],
    decisions: Any,
    time_zone: str,
    allowed: DeclaredSources | None,
    spread: list[int] | None = None,
) -> type:
    """A UDTF class bound to ``sources`` and the allow-list of declared sources (defined here so
    that it is pickled by value: nothing in SQL can change either); ``spread``: the bucket
    values for the session's shuffle partitions (:mod:`sql_ext.buckets`)."""
    bound = dict(sources)

    class AsyncLookup:
        @staticmethod
        def analyze(table: Any, source: Any, **options: Any) -> LookupAnalysis:
            return analyze(bound, table, source, options, allowed, spread)

        def __init__(self, analyze_result: LookupAnalysis) -> None:
            # the groups of one task share one call (sql_ext.groups): all their keys run at once
            self._source = analyze_result.source
            self._slot, self._call = _SHARED.get(
                id(type(self)), lambda: TableCall(bound, analyze_result, decisions, time_zone)
            )

        def eval(self, row: Any, *args: Any, **kwargs: Any) -> Iterator[tuple[Any, ...]]:
            yield from self._failing_stops(self._call.eval(row))

        def terminate(self) -> Iterator[tuple[Any, ...]]:
            if at_group_boundary():  # not a generator: this must see its caller
                return self._failing_stops(self._call.flush())
            _SHARED.last(self._slot)
            return self._call.terminate()

        def _failing_stops(self, rows: Iterator[tuple[Any, ...]]) -> Iterator[tuple[Any, ...]]:
            try:
                yield from rows
            except BaseException:
                _SHARED.left_open(self._slot)  # the task fails with this error: its lookups stop
                raise

        def cleanup(self) -> None:
            if _SHARED.left_open(self._slot) is not None:
                raise RuntimeError(
                    f"async_lookup({self._source}): the task ended with lookups in "
                    "flight whose rows were not emitted (no final terminate); the task fails instead"
                )

    return AsyncLookup


_SHARED = SharedCalls()  # per worker process: the call the groups of the running task share

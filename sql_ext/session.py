"""``install(spark, sources)``: the SQL functions of the async lookups, in one session."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from keyed_async_wait.core.exceptions import SparkVersionError
from keyed_async_wait.runtime.backend import adapt_function
from keyed_async_wait.spark import compat
from keyed_async_wait.spark.metrics import is_connect
from keyed_async_wait.spark.session import session_time_zone, session_view, task_slots

from .buckets import bucketing
from .declared import Declarations
from .exceptions import ConfigError
from .modes import Decision, decide, describe_input
from .scalar import return_type, scalar_function
from .sources import LookupSource, make_source
from .table import table_function_class

__all__ = ["AsyncLookupSQL", "install"]

log = logging.getLogger(__name__)


def _count_param() -> Any:
    from pyspark import AccumulatorParam

    class CountByText(AccumulatorParam):
        def zero(self, value: dict[str, int]) -> dict[str, int]:
            return {}

        def addInPlace(self, a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
            for text, count in b.items():
                a[text] = a.get(text, 0) + count
            return a

    return CountByText()


class AsyncLookupSQL:
    """The installed functions: a scalar function per source, and ``async_lookup`` (the table
    function) over all of them. Register more sources with :meth:`register`."""

    def __init__(
        self,
        spark: Any,
        table_function: str,
        declared_sources: Declarations | None = None,
        allow_writes: bool = False,
        arrow: bool | None = None,
    ) -> None:
        self.spark = spark
        self.arrow = arrow
        self.table_function = table_function
        self.declared_sources = declared_sources
        self.allow_writes = allow_writes
        self._sources: dict[str, LookupSource] = {}
        # Spark Connect has no accumulators: there, decisions() says so and points to explain()
        self._decisions = None if is_connect(spark) else spark.sparkContext.accumulator({}, _count_param())

    @property
    def sources(self) -> tuple[str, ...]:
        return tuple(sorted(self._sources))

    def register(
        self,
        name: str,
        function: Any,
        *,
        inputs: Sequence[str] | None = None,
        output_schema: str | None = None,
        error_column: str | None = None,
        error_field: str | None = None,
    ) -> LookupSource:
        """Register ``function`` (a lookup, an AsyncFunction or an ``async def``) as ``name``:
        the scalar function ``name(input, ...)`` and the source ``'name'`` of the table function.

        ``inputs``: the record fields it reads, bound in order to the scalar function's arguments
        (default: the lookup's template fields). ``output_schema``: the result columns as DDL
        (default: the lookup's declared fields). ``error_column``: a field the scalar function's
        struct gets for a row whose lookup failed or whose result does not fit (its results
        NULL, the error struct there, the query goes on); without it such a row fails the query.
        The table function has its own ``error_column => ...`` argument.
        """
        if adapt_function(function).writes and not self.allow_writes:
            raise ConfigError(
                f"{name}: function",
                function,
                "a lookup; a write (RedisWrite, HttpWrite) changes a store whenever a query runs it, "
                "so SQL gets one only from sql_ext.install(..., allow_writes=True)",
            )
        source = make_source(name, function, inputs=inputs, output_schema=output_schema)
        error_field = _error_column(error_column, error_field, "register")
        _check_error_field(name, error_field, source.result_columns)
        try:
            scalar = scalar_function(source, session_time_zone(self.spark), error_field)
        except SparkVersionError as too_old:  # the table function still serves this source
            log.warning("%s(): %s", name, too_old)
            scalar = compat.unavailable_udf(too_old, return_type(source, error_field))
        self.spark.udf.register(name, scalar)
        self._sources[name] = source
        self._register_table_function()
        return source

    def _register_table_function(self) -> None:
        from pyspark.sql.functions import udtf

        partitions = str(self.spark.conf.get("spark.sql.shuffle.partitions") or "200")
        spread, default = bucketing(partitions, task_slots(self.spark))

        def bound(arrow: bool) -> type:
            zone, allowed = session_time_zone(self.spark), self.declared_sources
            return table_function_class(
                self._sources, self._decisions, zone, allowed, spread, arrow, default_buckets=default
            )

        function = None
        if self.arrow is not False:  # None where pyspark has no Arrow UDTF (install refused True)
            function = compat.arrow_table_function(bound(True), connect=is_connect(self.spark))
        if function is None:
            function = udtf(bound(False), useArrow=False)
        self.spark.udtf.register(self.table_function, function)

    def decisions(self) -> dict[str, int]:
        """Which mode the table function ran, and why, with the number of tasks that ran it
        (read on the driver after an action; counts accumulate over the session)."""
        if self._decisions is None:
            raise ConfigError(
                "decisions()",
                "on Spark Connect",
                "a classic session (it counts through accumulators); on Spark Connect, explain() predicts "
                "the decision on the client, and each task logs it (logger sql_ext.table)",
            )
        return dict(self._decisions.value)

    def explain(
        self,
        table: Any,
        *,
        upsert_key: str | Sequence[str] | None = None,
        change_column: str | None = None,
    ) -> Decision:
        """The mode a call over ``table`` (a DataFrame or a table name) would run under the
        session's current settings."""
        df = self.spark.table(table) if isinstance(table, str) else table
        conf = session_view(self.spark).operator
        return decide(conf, describe_input(df.columns, upsert_key=upsert_key, change_column=change_column))


def _error_column(error_column: str | None, error_field: str | None, call: str) -> str | None:
    """``error_column``, or the 0.1 spelling ``error_field`` with a DeprecationWarning."""
    if error_field is None:
        return error_column
    warnings.warn(
        f"sql_ext {call}(error_field=...) is deprecated and goes in the next release; "
        "use error_column=... (the name every wait and the table function use)",
        DeprecationWarning,
        stacklevel=3,
    )
    if error_column is not None and error_column != error_field:
        raise ConfigError("error_field", error_field, f"None when error_column={error_column!r} is given")
    return error_field


def _check_error_field(name: str, error_field: str | None, results: Sequence[str]) -> None:
    if error_field is None:
        return
    if not isinstance(error_field, str) or not error_field.isidentifier():
        raise ConfigError(f"{name}: error_column", error_field, "a field name, e.g. '_error', or None")
    if error_field in results:
        allowed = f"a name that is no result column ({', '.join(results)})"
        raise ConfigError(f"{name}: error_column", error_field, allowed)


def install(
    spark: Any,
    sources: Mapping[str, Any] | None = None,
    *,
    table_function: str = "async_lookup",
    declared_sources: Declarations | None = None,
    allow_writes: bool = False,
    error_column: str | None = None,
    arrow: bool | None = None,
    error_field: str | None = None,
) -> AsyncLookupSQL:
    """Register the SQL functions in ``spark``'s session.

    ``sources`` maps SQL names to lookups (``{"users": HttpLookup(...)}``); each becomes a
    scalar function of that name and a source of the table function. The session's
    ``spark.sql.exec.async-lookup.*`` settings are checked now (and again in every task).

    ``declared_sources``: the services a SQL user may name in the query itself (``'http'`` and
    ``'redis'`` sources of the table function), a :class:`lookup.DeclaredSources`; without it,
    none. Nothing in SQL widens it.

    ``allow_writes``: whether ``sources`` may hold writes (:class:`lookup.RedisWrite`,
    :class:`lookup.HttpWrite`), which change a store whenever a query calls them; refused
    without it.

    ``error_column``: for each scalar function of ``sources``, a struct field that holds a
    row's error instead of failing the query (see :meth:`AsyncLookupSQL.register`); the table
    function takes its own ``error_column => '...'`` argument. ``error_field``: deprecated, the
    0.1 name of ``error_column``.

    ``arrow``: how Spark hands the table function its table. ``None`` (the default): Arrow
    batches where pyspark can (4.1+), rows before; ``True``: Arrow batches, refused before 4.1;
    ``False``: rows (one pickled row per call, about 3x the CPU per row; the values are the same).

    Needs pyspark 4.0 (the table function analyzes its call); the scalar functions need 4.2 (an
    Arrow UDF): before that, a query calling one fails naming the version, and the table function
    serves the same source.
    """
    compat.require_table_function()
    error_column = _error_column(error_column, error_field, "install")
    if declared_sources is not None and not isinstance(declared_sources, Declarations):
        raise ConfigError(
            "declared_sources", declared_sources, "a DeclaredSources(http=[...], redis=[...]) or None"
        )
    session_view(spark)  # a bad or unknown setting fails now
    if arrow not in (None, True, False):
        raise ConfigError("arrow", arrow, "None (Arrow where pyspark can), True or False")
    if arrow:
        compat.require("the Arrow form of the table function (arrow=True)", (4, 1), "arrow=None or False")
    installed = AsyncLookupSQL(spark, table_function, declared_sources, allow_writes, arrow)
    for name, function in (sources or {}).items():
        installed.register(name, function, error_column=error_column)
    if not sources:
        installed._register_table_function()
    return installed

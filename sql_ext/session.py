"""``install(spark, sources)``: the SQL functions of the async lookups, in one session."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from keyed_async_wait.core.exceptions import SparkVersionError
from keyed_async_wait.spark import compat
from keyed_async_wait.spark.metrics import is_connect
from keyed_async_wait.spark.options import session_config, session_time_zone

from .allowlist import DeclaredSources
from .buckets import spread_values
from .exceptions import ConfigError
from .modes import Decision, decide, describe_input
from .scalar import scalar_function
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
        declared_sources: DeclaredSources | None = None,
        allow_writes: bool = False,
    ) -> None:
        self.spark = spark
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
    ) -> LookupSource:
        """Register ``function`` (a lookup, an AsyncFunction or an ``async def``) as ``name``:
        the scalar function ``name(input, ...)`` and the source ``'name'`` of the table function.

        ``inputs``: the record fields it reads, bound in order to the scalar function's arguments
        (default: the lookup's template fields). ``output_schema``: the result columns as DDL
        (default: the lookup's declared fields).
        """
        from lookup import Write

        if isinstance(function, Write) and not self.allow_writes:
            raise ConfigError(
                f"{name}: function",
                function,
                "a lookup; a write (RedisWrite, HttpWrite) changes a store whenever a query runs it, "
                "so SQL gets one only from sql_ext.install(..., allow_writes=True)",
            )
        source = make_source(name, function, inputs=inputs, output_schema=output_schema)
        try:
            scalar = scalar_function(source, session_time_zone(self.spark))
        except SparkVersionError as too_old:  # the table function still serves this source
            log.warning("%s(): %s", name, too_old)
            scalar = compat.unavailable_udf(too_old, source.result_schema)
        self.spark.udf.register(name, scalar)
        self._sources[name] = source
        self._register_table_function()
        return source

    def _register_table_function(self) -> None:
        from pyspark.sql.functions import udtf

        partitions = str(self.spark.conf.get("spark.sql.shuffle.partitions") or "200")
        cls = table_function_class(
            self._sources,
            self._decisions,
            session_time_zone(self.spark),
            self.declared_sources,
            spread_values(int(partitions)) if partitions.isdigit() else None,  # "auto" on some platforms
        )
        self.spark.udtf.register(self.table_function, udtf(cls, useArrow=False))

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
        conf = session_config(self.spark)
        return decide(conf, describe_input(df.columns, upsert_key=upsert_key, change_column=change_column))


def install(
    spark: Any,
    sources: Mapping[str, Any] | None = None,
    *,
    table_function: str = "async_lookup",
    declared_sources: DeclaredSources | None = None,
    allow_writes: bool = False,
) -> AsyncLookupSQL:
    """Register the SQL functions in ``spark``'s session.

    ``sources`` maps SQL names to lookups (``{"users": HttpLookup(...)}``); each becomes a
    scalar function of that name and a source of the table function. The session's
    ``spark.sql.exec.async-lookup.*`` settings are checked now (and again in every task).

    ``declared_sources``: the services a SQL user may name in the query itself (``'http'`` and
    ``'redis'`` sources of the table function); without it, none. Nothing in SQL widens it.

    ``allow_writes``: whether ``sources`` may hold writes (:class:`lookup.RedisWrite`,
    :class:`lookup.HttpWrite`), which change a store whenever a query calls them; refused
    without it.

    Needs pyspark 4.0 (the table function analyzes its call); the scalar functions need 4.2 (an
    Arrow UDF): before that, a query calling one fails naming the version, and the table function
    serves the same source.
    """
    compat.require_table_function()
    if declared_sources is not None and not isinstance(declared_sources, DeclaredSources):
        raise ConfigError(
            "declared_sources", declared_sources, "a DeclaredSources(http=[...], redis=[...]) or None"
        )
    session_config(spark)  # a bad or unknown setting fails now
    installed = AsyncLookupSQL(spark, table_function, declared_sources, allow_writes)
    for name, function in (sources or {}).items():
        installed.register(name, function)
    if not sources:
        installed._register_table_function()
    return installed

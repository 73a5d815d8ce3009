"""A micro-batch's own values (its id, the time, a cutoff) in Spark plans, without new
generated code for every micro-batch.

Spark's code generation writes a numeric literal into the Java code it generates, so a plan
that holds one compiles a new class whenever the value changes (and the JVM's JIT compiles it
again): measured, about 15 new classes a micro-batch of a long ``key_ordered_stream`` with
parked rows, and the JIT busy with them. A decimal literal is passed to the generated code by
reference instead, so a comparison with one keeps its code from one micro-batch to the next;
a value the rows must carry comes from a one-row inline table, joined in (data, not code).

The column side is cast through ``double``: Spark unwraps a comparison of an integer column
cast up to decimal into one with an integer literal again. Values are compared at microsecond
precision (``decimal(38, 6)``), which the times and micro-batch ids compared here never need
more than.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

__all__ = ["at_most", "equal_to", "one_row", "without_adaptive_stages", "without_stage_code"]

WHOLE_STAGE = "spark.sql.codegen.wholeStage"
ADAPTIVE = "spark.sql.adaptive.enabled"

_DECIMAL = "decimal(38,6)"


def _value(value: float) -> Any:
    return F.lit(Decimal(f"{value:.6f}")).cast(_DECIMAL)


def _column(column: Any) -> Any:
    return column.cast("double").cast(_DECIMAL)


def at_most(column: Any, value: float) -> Any:
    """``column <= value``."""
    return _column(column) <= _value(value)


def equal_to(column: Any, value: float) -> Any:
    """``column == value``."""
    return _column(column) == _value(value)


def one_row(spark: SparkSession, name: str, value: int) -> DataFrame:
    """A one-row table with ``value`` (a long) as column ``name``, to cross join."""
    return spark.sql(f"SELECT * FROM VALUES (CAST({int(value)} AS BIGINT)) AS t({name})")


@contextmanager
def without_stage_code(spark: SparkSession) -> Iterator[None]:
    """Plans made inside run without whole-stage code generation; the session's own setting
    is back outside (a user's sink plans with it).

    A micro-batch with parked rows plans several queries over the same parts of the state,
    and whole-stage code generation writes each into a class named after its stage's place in
    its query: the same read, join or aggregation in another query or place is another class.
    Measured, such a micro-batch needs more classes than Spark keeps compiled (100 by default,
    ``spark.sql.codegen.cache.maxEntries``, fixed when the JVM starts), so each one compiled
    them again (560-600 classes a minute, the JIT a third of the driver's CPU). Expressions
    are still compiled (filters, projections, orderings: a class per expression, shared by
    every query). A persisted plan keeps the setting it was planned with."""
    with _set(spark, WHOLE_STAGE, "false"):
        yield


@contextmanager
def without_adaptive_stages(spark: SparkSession) -> Iterator[None]:
    """Plans made inside (a persisted one keeps it) run without adaptive execution; the
    session's own setting is back outside.

    For a micro-batch's lookups with nothing parked: a shuffle by the key into an explicit
    number of partitions, a sort and the Python stage. Adaptive execution (Spark's default) can
    change nothing there (it never coalesces an explicit partition count, and there is no
    join), but runs the shuffle as a Spark job of its own and plans the rest after it: measured,
    about 0.08 s a micro-batch of 2,500 rows."""
    with _set(spark, ADAPTIVE, "false"):
        yield


@contextmanager
def _set(spark: SparkSession, key: str, value: str) -> Iterator[None]:
    before = spark.conf.get(key, None)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)

"""Every difference between the supported pyspark versions, one function each.

The rest of the code calls these and never looks at a version itself. Supported: pyspark 3.5.2
through 4.3 (``.ci/spark-versions`` lists what CI runs; ``./run compat`` runs the tier).

=============================  ==========  ===================================================
function                       versions    the difference
=============================  ==========  ===================================================
:func:`session_settings`       < 4.0       ``spark.conf.getAll`` does not exist: read ``SET``
:func:`parse_schema`           < 4.0       no ``StructType.fromDDL``: the active session parses
:func:`observed_progress`      < 4.0       a query's progress is a dict (parsed JSON), not a
                                           ``StreamingQueryProgress``
:func:`arrow_type`             < 4.2       ``to_arrow_type`` takes no ``timezone`` (timestamps
                                           are UTC instants there, the same values)
:func:`arrow_scalar_udf`       < 4.2       no ``arrow_udf``; a pandas UDF cannot return a
                                           NULL struct: the scalar functions need 4.2
:func:`require_table_function` < 4.0       a Python UDTF cannot ``analyze`` (no dynamic schema)
:func:`at_group_boundary`      >= 4.0      reads pyspark's partitioning wrappers (internal; a
                                           test on every version fails if it changes)
:func:`arrow_table_function`   < 4.1       no Arrow UDTF: the table function takes rows
                                           (pickled, one call each); 4.1+ takes Arrow batches
=============================  ==========  ===================================================
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator
from typing import Any

from ..core.exceptions import SparkVersionError

__all__ = [
    "arrow_scalar_udf",
    "arrow_table_function",
    "arrow_type",
    "at_group_boundary",
    "observed_progress",
    "parse_schema",
    "pyspark_version",
    "require",
    "require_arrow_udf",
    "require_table_function",
    "session_settings",
]


@functools.cache
def pyspark_version() -> tuple[int, int]:
    """The installed pyspark's (major, minor)."""
    import pyspark

    major, minor = pyspark.__version__.split(".")[:2]
    return int(major), int(minor)


def _text(version: tuple[int, int]) -> str:
    return ".".join(map(str, version))


def require(feature: str, minimum: tuple[int, int], instead: str = "") -> None:
    """Fail now, naming ``feature``, unless the running pyspark is ``minimum`` or newer."""
    import pyspark

    if pyspark_version() < minimum:
        raise SparkVersionError(feature, _text(minimum), pyspark.__version__, instead)


def session_settings(spark: Any, prefix: str) -> dict[str, str]:
    """The session's SQL settings whose key starts with ``prefix`` (classic and Connect)."""
    if pyspark_version() >= (4, 0):
        return {k: v for k, v in spark.conf.getAll.items() if k.startswith(prefix)}
    # 3.5: no getAll; SET lists every setting the session has (its own keys included)
    rows = spark.sql("SET").collect()
    return {str(r[0]): str(r[1]) for r in rows if str(r[0]).startswith(prefix)}


def parse_schema(ddl: str) -> Any:
    """The ``StructType`` of a DDL string (``'name string, score double'``)."""
    from pyspark.sql.types import StructType

    if pyspark_version() >= (4, 0):
        parsed = StructType.fromDDL(ddl)
    else:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        if spark is None:
            raise RuntimeError("no active Spark session to parse a DDL schema with (pyspark < 4.0)")
        parsed = spark.createDataFrame([], ddl).schema
    if not isinstance(parsed, StructType):
        raise TypeError(f"{ddl!r} is no list of columns")
    return parsed


def observed_progress(progresses: Any) -> list[tuple[int, dict[str, dict[str, Any]]]]:
    """Each progress of a streaming query (``query.recentProgress``): its micro-batch id and its
    observed metrics by observation name, each a dict of measure to value (or Connect's
    ``values``/``schema``)."""
    out: list[tuple[int, dict[str, dict[str, Any]]]] = []
    for progress in progresses or []:
        if isinstance(progress, dict):  # 3.5
            batch, observed = progress["batchId"], progress.get("observedMetrics") or {}
        else:
            batch, observed = progress.batchId, progress.observedMetrics or {}
        rows = {name: row if isinstance(row, dict) else row.asDict() for name, row in observed.items()}
        out.append((int(batch), rows))
    return out


def arrow_type(data_type: Any, time_zone: str) -> Any:
    """The Arrow type pyspark uses for ``data_type`` (timestamps in ``time_zone`` where the
    version takes one; before 4.2 pyspark says UTC, which names the same instants)."""
    from pyspark.sql.pandas.types import to_arrow_type

    if pyspark_version() >= (4, 2):
        return to_arrow_type(data_type, timezone=time_zone)
    return to_arrow_type(data_type)


def arrow_scalar_udf(run: Callable[..., Any], return_type: Any, arguments: int) -> Any:
    """An iterator UDF of Arrow arrays (``arrow_udf``, pyspark 4.2+): ``run(batches)`` takes an
    iterator of ``pa.Array`` (a tuple of them for several ``arguments``) and yields one
    ``pa.Array`` per batch.

    Before 4.2 only a pandas UDF can return a struct, and pyspark builds that struct from a
    DataFrame's columns with no mask of its own: a NULL struct (a miss) would come out as a
    struct of NULLs, a silent wrong value. So there it fails at the call instead."""
    require_arrow_udf()
    import pyarrow as pa
    from pyspark.sql.pandas.functions import arrow_udf

    arrays = Iterator[tuple[pa.Array, ...]] if arguments > 1 else Iterator[pa.Array]
    # Spark picks the iterator form from the hints (naming the type instead is deprecated)
    run.__annotations__ = {"batches": arrays, "return": Iterator[pa.Array]}
    return arrow_udf(run, return_type)  # type: ignore[call-overload]


def require_arrow_udf() -> None:
    """The SQL scalar functions return a NULL struct for a miss: an Arrow UDF (pyspark 4.2+)."""
    require(
        "the SQL scalar lookup functions (an Arrow UDF returning a struct, NULL for a miss)",
        (4, 2),
        "on this version use the table function async_lookup(TABLE(t), 'source') or AsyncDataStream",
    )


def unavailable_udf(error: SparkVersionError, return_type: Any) -> Any:
    """A SQL function standing where one this pyspark cannot carry would be: a query that calls
    it fails with ``error``'s text (the feature and the version), not "cannot resolve routine".
    It fails in the first task, before any lookup: SQL has no earlier place to say it."""
    from pyspark.sql.functions import udf

    return udf(_failing(str(error)), return_type)


def _failing(message: str) -> Callable[..., Any]:
    def unavailable(*_: Any) -> Any:
        raise RuntimeError(message)

    return unavailable


def require_table_function() -> None:
    """The SQL functions: the table function derives its schema from its arguments
    (``analyze``, pyspark 4.0+), and the scalar functions need 4.2."""
    require(
        "the SQL functions (sql_ext: a Python UDTF with analyze)",
        (4, 0),
        "on this version use AsyncDataStream",
    )


def at_group_boundary(depth: int = 2) -> bool:
    """Whether the UDTF ``terminate`` that called this was called at a group boundary of a
    partitioned call (``PARTITION BY``), not at the end of the task's input.

    pyspark's partitioning wrapper (``worker.py``, ``UDTFWithPartitions`` in 4.0 - 4.3) calls
    ``terminate`` from its ``eval`` when the partition changes, and from its own ``terminate``
    at the end. No public API tells the two apart, so this reads the caller's frame; anything
    else counts as the end, the safe side (every row in flight is waited for).
    The Arrow form's wrapper (``ArrowUDTFWithPartition``, 4.1 - 4.3) calls it from
    ``_process_arrow_batch_by_partitions`` at a boundary, and from its ``terminate`` at the end.
    ``tests/spark/test_sql_groups.py`` fails on any version where this stops holding."""
    caller = sys._getframe(depth)
    wrapper = caller.f_locals.get("self")
    name = caller.f_code.co_name
    if name == "eval":
        return hasattr(wrapper, "_check_partition_boundaries")
    return name == "_process_arrow_batch_by_partitions" and hasattr(wrapper, "_detect_partition_boundaries")


def arrow_table_function(cls: type, *, connect: bool) -> Any | None:
    """``cls`` (with ``analyze``) as an Arrow UDTF, whose ``eval`` takes a ``pa.RecordBatch``
    of the table and yields ``pa.RecordBatch`` es; None before pyspark 4.1 (no Arrow UDTF).

    pyspark's ``arrow_udtf`` refuses a class with ``analyze`` (SPARK-53286 is to allow it) in a
    Python-side check only: the engine analyzes such a function like any other and runs it with
    Arrow batches, on 4.1 - 4.3 alike. So this makes the function object the way ``arrow_udtf``
    does, without that check. The yielded batches must have the analyzed schema exactly,
    nullability included. ``tests/spark/test_sql_ext.py`` runs every SQL test on this path and
    compares it with the row path on every Spark type."""
    if pyspark_version() < (4, 1):
        return None
    from pyspark.util import PythonEvalType

    if connect:
        from pyspark.sql.connect.udtf import UserDefinedTableFunction as ConnectUDTF

        return ConnectUDTF(cls, returnType=None, evalType=PythonEvalType.SQL_ARROW_UDTF)
    from pyspark.sql.udtf import UserDefinedTableFunction

    return UserDefinedTableFunction(cls, returnType=None, evalType=PythonEvalType.SQL_ARROW_UDTF)

"""The table-function form: ``SELECT * FROM async_lookup(TABLE(orders), 'users', ...)``.

Arguments (constants, by name after the first two):

- ``source``: the name of a registered lookup source.
- ``upsert_key => 'order_id'`` (or ``'a, b'``): declares an update stream keyed by these columns.
- ``change_column => 'op'``: the change-type column of an update stream (``_change_type`` is
  recognised without it).
- ``order_by => 'seq'``: the arrival order within a key (an offset, a sequence number).
- ``buckets => 16``: how many groups of keys an update stream is spread over (below); by
  default one per task slot of the cluster at install (at most one per shuffle partition).
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
groups are named so that Spark spreads them evenly over its tasks (:mod:`sql_ext.buckets`):
with the default count each task gets one group, all its keys interleaved in arrival order.
Spark makes one instance per group and runs a task's groups one after another; the groups of a
task share one operator (:mod:`sql_ext.groups`), so every key of the task runs concurrently,
whatever the bucket count. An insert-only input keeps its partitioning.

On pyspark 4.1+ Spark hands the function Arrow batches of the table and takes Arrow batches
back (:mod:`sql_ext.arrow_call`): the input columns leave as they came, with no row conversion
either way. On 4.0 it takes rows (:mod:`sql_ext.calls`). Both give the same values.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from keyed_async_wait.spark.compat import at_group_boundary

from .analysis import DEFAULT_BUCKETS, LookupAnalysis, analyze
from .arrow_call import ArrowTableCall
from .calls import TableCall
from .declared import Declarations
from .groups import SharedCalls
from .sources import LookupSource

__all__ = ["DEFAULT_BUCKETS", "LookupAnalysis", "table_function_class"]


def table_function_class(
    sources: Mapping[str, LookupSource],
    decisions: Any,
    time_zone: str,
    allowed: Declarations | None,
    spread: list[int] | None = None,
    arrow: bool = False,
    default_buckets: int = DEFAULT_BUCKETS,
) -> type:
    """A UDTF class bound to ``sources`` and the allow-list of declared sources (defined here so
    that it is pickled by value: nothing in SQL can change either); ``spread``: the bucket
    values for the session's shuffle partitions (:mod:`sql_ext.buckets`); ``arrow``: whether
    Spark hands it Arrow batches (:mod:`sql_ext.arrow_call`) rather than rows."""
    bound = dict(sources)
    call_class = ArrowTableCall if arrow else TableCall

    class AsyncLookup:
        @staticmethod
        def analyze(table: Any, source: Any, **options: Any) -> LookupAnalysis:
            return analyze(bound, table, source, options, allowed, spread, default_buckets)

        def __init__(self, analyze_result: LookupAnalysis) -> None:
            # the groups of one task share one call (sql_ext.groups): all their keys run at once
            self._source = analyze_result.source
            self._slot, self._call = _SHARED.get(
                id(type(self)), lambda: call_class(bound, analyze_result, decisions, time_zone)
            )

        def eval(self, table: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
            # a row, or an Arrow batch of the table (then it yields batches)
            yield from self._failing_stops(self._call.eval(table))

        def terminate(self) -> Iterator[Any]:
            if at_group_boundary():  # not a generator: this must see its caller
                return self._failing_stops(self._call.flush())
            _SHARED.last(self._slot)
            return self._call.terminate()

        def _failing_stops(self, rows: Iterator[Any]) -> Iterator[Any]:
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

"""The groups of a task share one call: the hand-over rules, without Spark (sql_ext.groups)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from keyed_async_wait.spark.compat import at_group_boundary
from sql_ext import groups
from sql_ext.groups import SharedCalls


class Call:
    def __init__(self) -> None:
        self.running, self.aborted = True, False

    def eval(self, row: Any) -> Iterator[tuple[Any, ...]]:
        return iter(())

    def flush(self) -> Iterator[tuple[Any, ...]]:
        return iter(())

    def terminate(self) -> Iterator[tuple[Any, ...]]:
        self.running = False
        return iter(())

    def abort(self) -> None:
        self.running, self.aborted = False, True


def test_the_groups_of_one_task_share_a_call_and_a_new_task_aborts_a_stale_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shared = SharedCalls()
    monkeypatch.setattr(groups, "task_attempt", lambda: 7)
    _, first = shared.get(1, Call)
    _, again = shared.get(1, Call)
    _, other_site = shared.get(2, Call)
    assert again is first and other_site is not first
    monkeypatch.setattr(groups, "task_attempt", lambda: 8)  # task 7 failed before its last terminate
    _, fresh = shared.get(1, Call)
    assert fresh is not first and first.aborted and other_site.aborted  # its lookups stop
    assert len(shared) == 1


def test_a_call_left_running_at_cleanup_is_aborted_and_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    shared = SharedCalls()
    monkeypatch.setattr(groups, "task_attempt", lambda: 1)
    slot, call = shared.get(1, Call)
    assert shared.left_open(slot) is call and call.aborted
    slot, done = shared.get(1, Call)
    done.terminate()
    shared.last(slot)
    assert shared.left_open(slot) is None


class _PartitioningWrapper:
    """Stands in for pyspark's wrapper: it calls terminate from eval at a group boundary."""

    def __init__(self, udtf: Any) -> None:
        self._udtf = udtf

    def _check_partition_boundaries(self, arguments: list[Any]) -> bool:
        return True

    def eval(self) -> bool:
        return bool(self._udtf.terminate())

    def terminate(self) -> bool:
        return bool(self._udtf.terminate())


class _Udtf:
    def terminate(self) -> bool:
        return at_group_boundary()


def test_a_boundary_is_a_terminate_from_the_wrappers_eval_and_anything_else_is_the_last() -> None:
    wrapper = _PartitioningWrapper(_Udtf())
    assert wrapper.eval() is True
    assert wrapper.terminate() is False
    assert _Udtf().terminate() is False  # called by anything else: the last (the safe side)


class _BoundaryProbe:
    """A UDTF reporting, at each terminate, its task and whether it is a group boundary (its
    schema from ``analyze``, as async_lookup's: pyspark 4.0 fails on a fixed one here)."""

    @staticmethod
    def analyze(table: Any) -> Any:
        from pyspark.sql.types import BooleanType, IntegerType, StructField, StructType
        from pyspark.sql.udtf import AnalyzeResult

        fields = [StructField("task", IntegerType()), StructField("boundary", BooleanType())]
        return AnalyzeResult(StructType(fields))

    def __init__(self) -> None:
        self.rows = 0

    def eval(self, row: Any) -> Iterator[tuple[Any, ...]]:
        self.rows += 1
        return iter(())

    def terminate(self) -> Iterator[tuple[int, bool]]:  # not a generator: it must see its caller
        from pyspark import TaskContext

        boundary = at_group_boundary()
        context = TaskContext.get()
        assert context is not None
        # a row from an empty task's terminate fails pyspark 4.0 (a NullPointerException)
        return iter([(context.partitionId(), boundary)] if self.rows else [])


@pytest.mark.spark
@pytest.mark.compat("SQL table function: groups of a task share one call")
def test_pysparks_own_wrapper_calls_terminate_as_at_group_boundary_reads_it(spark: Any) -> None:
    """The one place that leans on pyspark internals (compat.at_group_boundary), checked against
    the real worker of this pyspark: in each task every terminate but the last is a boundary."""
    from pyspark.sql.functions import udtf

    from keyed_async_wait.spark.compat import pyspark_version

    if pyspark_version() < (4, 0):
        pytest.skip("partitioned Python UDTFs need pyspark 4.0 (sql_ext is refused on 3.5)")
    spark.udtf.register("boundary_probe", udtf(_BoundaryProbe))
    spark.range(60).selectExpr("id % 12 AS k").createOrReplaceTempView("boundary_input")
    rows = spark.sql("SELECT * FROM boundary_probe(TABLE(boundary_input) PARTITION BY k)").collect()
    _every_terminate_but_each_tasks_last_is_a_boundary(rows, groups=12)


class _ArrowBoundaryProbe(_BoundaryProbe):
    """The same probe in the Arrow form: batches in, a batch out at each terminate."""

    def eval(self, batch: Any) -> Iterator[Any]:
        self.rows += batch.num_rows
        return iter(())

    def terminate(self) -> Iterator[Any]:  # not a generator: it must see its caller
        import pyarrow as pa
        from pyspark import TaskContext

        boundary = at_group_boundary()
        context = TaskContext.get()
        assert context is not None
        schema = pa.schema([pa.field("task", pa.int32()), pa.field("boundary", pa.bool_())])
        row = pa.RecordBatch.from_pylist(
            [{"task": context.partitionId(), "boundary": boundary}], schema=schema
        )
        return iter([row] if self.rows else [])


@pytest.mark.spark
@pytest.mark.compat("SQL table function: groups of a task share one call")
def test_the_arrow_wrapper_calls_terminate_as_at_group_boundary_reads_it(spark: Any) -> None:
    """As above, for the Arrow form (compat.arrow_table_function, pyspark 4.1+): made as
    async_lookup's is, with analyze, and run by this pyspark's ArrowUDTFWithPartition."""
    from keyed_async_wait.spark.compat import arrow_table_function, pyspark_version

    if pyspark_version() < (4, 1):
        assert arrow_table_function(_ArrowBoundaryProbe, connect=False) is None
        pytest.skip("the Arrow form needs pyspark 4.1; before, the row form runs (checked above)")
    spark.udtf.register("arrow_boundary_probe", arrow_table_function(_ArrowBoundaryProbe, connect=False))
    spark.range(60).selectExpr("id % 12 AS k").createOrReplaceTempView("boundary_input")
    rows = spark.sql("SELECT * FROM arrow_boundary_probe(TABLE(boundary_input) PARTITION BY k)").collect()
    _every_terminate_but_each_tasks_last_is_a_boundary(rows, groups=12)


def _every_terminate_but_each_tasks_last_is_a_boundary(rows: list[Any], groups: int) -> None:
    per_task: dict[int, list[bool]] = {}
    for row in rows:
        per_task.setdefault(row.task, []).append(row.boundary)
    assert sum(len(flags) for flags in per_task.values()) == groups  # one terminate per group
    assert any(len(flags) > 1 for flags in per_task.values())  # some task did cross a boundary
    for task, flags in per_task.items():
        assert flags[-1] is False and all(flags[:-1]), f"task {task}: {flags}"

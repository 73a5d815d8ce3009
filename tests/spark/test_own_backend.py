"""A backend written outside the package, as the guide "Write your own backend" shows it (the
class is read from that page: ``tests/own_backend.py``), gets what the ready lookups get:
batches, the cache, limits, retries, the backlog gear's column-wise path, metrics, SQL
registration, and errors that name the record and what was asked for it."""

from __future__ import annotations

from typing import Any

import pytest

import sql_ext
from keyed_async_wait import AsyncDataStream, AsyncWaitMetrics, RetryStrategy
from lookup import Field, Limits, Lookup, PartialCache

from ..own_backend import UsersService

pytestmark = [pytest.mark.spark]

SCHEMA = "seq long, order_id long, user_id long"


def users(url: str, **options: Any) -> Lookup:
    return Lookup(UsersService(url), key="{user_id}", fields=[Field("name"), Field("tier")], **options)


def orders(spark: Any, rows: int = 400, users: int = 40) -> Any:
    return spark.createDataFrame([(i, i % 50, i % users) for i in range(rows)], SCHEMA)


def right(rows: list[Any]) -> bool:
    return all(
        r.name == f"user-{r.user_id}" and r.tier == ("bronze", "silver", "gold")[r.user_id % 3] for r in rows
    )


def test_batches_the_cache_retries_and_metrics(spark: Any, service: Any) -> None:
    url, state = service
    state.record_calls = True
    state.fail(503, count=2)  # the first two calls fail: retried
    metrics = AsyncWaitMetrics(spark)
    out = AsyncDataStream.key_ordered_wait(
        orders(spark),
        users(url, cache=PartialCache(1_000)),
        "order_id",
        order_by="seq",
        retry=RetryStrategy.fixed_delay(4, 0.05),
        metrics=metrics,
    ).collect()
    assert len(out) == 400 and right(out)
    counts = metrics.value
    assert counts["lookups"] == state.requests  # every call of the service, counted
    assert state.faults == 2 and counts["retries"] >= 1
    assert all(key.startswith("batch:") for key, _, _, _ in state.calls)  # fetch_many: batches
    # a key answered is not asked again by the same Python worker: 40 users, each answered
    # about once per worker (two cores, and Spark may start a third when one is busy); the
    # failed calls' keys are asked again, as they must be. Without the cache: 400.
    assert counts["cache_hits"] > 0 and state.keys_answered <= 40 * 3


def test_limits_and_errors_that_name_the_record_and_the_call(spark: Any, service: Any) -> None:
    url, state = service
    state.fail(503)  # an outage: every call fails
    metrics = AsyncWaitMetrics(spark)
    rows = AsyncDataStream.key_ordered_wait(
        orders(spark, rows=60),
        users(url, limits=Limits(breaker_failures=2, breaker_cool_off=60)),
        "order_id",
        error_column="_error",
        batch_size=None,  # one call per record
        metrics=metrics,
    ).collect()
    assert all(r._error is not None and r.name is None for r in rows)
    assert metrics.value["short_circuited"] > 0  # the breaker opened: records failed at once
    assert any(r._error.error_type == "CircuitOpenError" for r in rows)
    named = r"record with key (\d) \(GET http://127\.0\.0\.1:\d+/users/\1\) failed"  # whichever fails first
    with pytest.raises(Exception, match=named):
        AsyncDataStream.key_ordered_wait(
            orders(spark, rows=4), users(url), "order_id", batch_size=None, num_partitions=1
        ).collect()


def test_the_backlog_gear_asks_each_key_once(spark: Any, service: Any) -> None:
    url, state = service
    metrics = AsyncWaitMetrics(spark)
    out = AsyncDataStream.unordered_wait(orders(spark), users(url), backlog=True, metrics=metrics).collect()
    assert len(out) == 400 and right(out)
    assert metrics.value["backlog_tasks"] >= 1
    # column-wise: the distinct keys of a task's batches, asked in one call per task
    assert state.requests <= spark.sparkContext.defaultParallelism * 2


def test_sql_takes_it_as_a_source_with_the_sessions_cache(spark: Any, service: Any) -> None:
    url, state = service
    orders(spark).createOrReplaceTempView("own_orders")
    sql_ext.install(spark, {"own_users": users(url)})
    spark.conf.set("spark.sql.exec.async-lookup.cache", "PARTIAL")
    try:
        out = spark.sql(
            "SELECT * FROM async_lookup(TABLE(own_orders), 'own_users', upsert_key => 'order_id', "
            "order_by => 'seq')"
        ).collect()
    finally:
        spark.conf.unset("spark.sql.exec.async-lookup.cache")
    assert len(out) == 400 and right(out)
    # the session's cache, given to a lookup that has none: each user asked once per process
    assert state.keys_asked <= 40 * 2

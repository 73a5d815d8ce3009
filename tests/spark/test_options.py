"""Every option is checked on the driver when the call is made, naming it and what is allowed;
settings in our namespace are never silently ignored; keys and order columns behave as
Spark's own grouping and sorting do."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import sql_ext
from keyed_async_wait import AsyncDataStream, AsyncWaitMetrics, ConfigError
from keyed_async_wait.core.exceptions import UnknownSettingError
from keyed_async_wait.spark.compat import pyspark_version
from keyed_async_wait.spark.session import known_keys
from lookup import Field, HttpLookup

from .calls import overlaps_and_disorder

ALL_KEYS = known_keys()  # every spark.sql.exec.async-lookup.* key, to unset them

pytestmark = [pytest.mark.spark, pytest.mark.compat("options checked at the call")]

P = "spark.sql.exec.async-lookup."
SCHEMA = "seq long, order_id long, user_id long"


async def ok(row: dict) -> dict:
    return {"ok": True}


@pytest.fixture
def clean_conf(spark: Any) -> Iterator[Any]:
    yield spark
    for key in (*ALL_KEYS, P + "tmeout", P + "buffer-capacty"):
        spark.conf.unset(key)


@pytest.fixture
def df(spark: Any) -> Any:
    return spark.createDataFrame([(i, i % 3, i % 5) for i in range(10)], SCHEMA)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"num_partitions": 0}, r"num_partitions=0 is not allowed; allowed: an integer >= 1"),
        ({"metrics": 5}, r"metrics=5 .*AsyncWaitMetrics"),
        ({"capacity": 0}, r"capacity=0 .*an integer >= 1"),
        ({"capacity": 2.5}, r"capacity=2.5 "),
        ({"timeout": -1}, r"timeout=-1 .*seconds > 0"),
        ({"timeout": float("nan")}, r"timeout=nan "),
        ({"batch_size": 0}, r"batch_size=0 "),
        ({"retry": 3}, r"retry=3 .*RetryStrategy"),
        ({"join": "outer"}, r"join='outer'"),
        ({"error_column": ""}, r"error_column=''"),
        ({"event_time": "nope"}, r"event_time='nope'"),
        ({"observe": 7}, r"observe=7"),
        ({"backlog": "sometimes"}, r"backlog='sometimes'"),
        ({"order_by": "nope"}, r"order_by='nope'.*missing: \['nope'\]"),
        ({"blocked_capacity": -1}, r"blocked_capacity=-1 .*an integer >= 0"),
        ({"balance_keys": "yes"}, r"balance_keys='yes' .*True or False"),
        ({"assume_partitioned": 1}, r"assume_partitioned=1 .*True or False"),
        ({"assume_partitioned": True, "num_partitions": 4}, r"num_partitions=4 .*None with assume_"),
        ({"balance_keys": True, "assume_partitioned": True}, r"balance_keys=True .*assume_partitioned=True"),
        ({"balance_keys": True, "event_time": "nope"}, r"event_time='nope'"),  # before its counting job
    ],
)
def test_a_bad_option_fails_at_the_call_before_any_job(df: Any, options: dict, match: str) -> None:
    jobs = df.sparkSession.sparkContext.statusTracker().getJobIdsForGroup()
    with pytest.raises(ConfigError, match=match):
        AsyncDataStream.key_ordered_wait(df, ok, key="order_id", output_schema="ok boolean", **options)
    assert df.sparkSession.sparkContext.statusTracker().getJobIdsForGroup() == jobs  # no job ran


@pytest.mark.parametrize("call", ["ordered_wait", "unordered_wait", "key_ordered_wait", "key_ordered_stream"])
def test_a_misspelt_option_is_named_with_the_closest_and_the_valid_ones(df: Any, call: str) -> None:
    wait = getattr(AsyncDataStream, call)
    with pytest.raises(UnknownSettingError) as raised:
        required: dict[str, Any] = (
            {"sink": print, "checkpoint_location": "/nowhere"} if "stream" in call else {}
        )
        wait(df, ok, *(["order_id"] if "key" in call else []), capacty=5, **required)
    message = str(raised.value)
    assert f"unknown setting {call}() option capacty=5; did you mean capacity" in message
    assert "timeout, capacity, retry" in message  # every valid option listed


def test_a_misspelt_option_is_a_type_error_for_mypy(tmp_path: Path) -> None:
    import subprocess
    import sys

    use = tmp_path / "use.py"
    use.write_text(
        "from pyspark.sql import DataFrame\n"
        "from keyed_async_wait import AsyncDataStream\n\n\n"
        "def enrich(df: DataFrame, fn: object) -> DataFrame:\n"
        "    ok = AsyncDataStream.key_ordered_wait(df, fn, 'id', capacity=5, order_by='seq')\n"
        "    return AsyncDataStream.ordered_wait(ok, fn, capacty=5)\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--follow-imports=silent", str(use)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=Path(__file__).parents[2],
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith(str(use))]
    assert len(lines) == 1, done.stdout  # the misspelt option, and nothing else
    assert 'Argument "capacty" to "ordered_wait"' in lines[0]


def test_a_lookup_template_naming_a_missing_column_fails_at_the_call(df: Any) -> None:
    users = HttpLookup("http://127.0.0.1:1/users/{customer_id}", fields=[Field("name")])
    with pytest.raises(ConfigError, match=r"input field='customer_id'.*seq, order_id, user_id"):
        AsyncDataStream.unordered_wait(df, users)


def test_a_misspelt_setting_is_named_with_the_closest_key(clean_conf: Any, df: Any, service: Any) -> None:
    spark = clean_conf
    url, state = service
    spark.conf.set(P + "tmeout", "5s")
    with pytest.raises(UnknownSettingError, match=rf"{P}tmeout='5s'; did you mean {P}timeout"):
        AsyncDataStream.unordered_wait(df, ok, output_schema="ok boolean")
    if pyspark_version() < (4, 0):  # sql_ext needs 4.0 (test_sql_versions)
        return
    with pytest.raises(UnknownSettingError, match="tmeout"):
        sql_ext.install(spark)
    spark.conf.unset(P + "tmeout")
    sql_ext.install(spark, {"users": HttpLookup(url + "/users/{user_id}", fields=[Field("name")])})
    df.createOrReplaceTempView("typo_orders")
    spark.sql(f"SET `{P}buffer-capacty`=10")  # after install: the tasks find it
    queries = ["SELECT * FROM async_lookup(TABLE(typo_orders), 'users')"]
    if pyspark_version() >= (4, 2):  # the scalar functions: an Arrow UDF
        queries.append("SELECT users(user_id) FROM typo_orders")
    for query in queries:
        with pytest.raises(
            Exception, match=rf"unknown setting {P}buffer-capacty='10'; did you mean {P}buffer-capacity"
        ):
            spark.sql(query).collect()
    assert state.requests == 0


def test_flink_style_float_backoff_multiplier_is_accepted(clean_conf: Any, df: Any, service: Any) -> None:
    spark = clean_conf
    url, state = service
    state.fail(503, count=2)
    spark.conf.set(P + "retry-strategy", "exponential_backoff")
    spark.conf.set(P + "initial-delay", "10 ms")
    spark.conf.set(P + "backoff-multiplier", "1.5")
    users = HttpLookup(url + "/users/{user_id}", fields=[Field("name")])
    rows = AsyncDataStream.ordered_wait(df, users, capacity=1).collect()
    assert all(r.name == f"user-{r.user_id}" for r in rows)


def test_streaming_order_by_with_nulls_sorts_them_first(spark: Any, service: Any, tmp_path: Path) -> None:
    url, state = service
    state.record_calls = True
    source = tmp_path / "in"
    source.mkdir()
    rows = [{"seq": None if i % 4 == 0 else i, "order_id": 1, "user_id": i} for i in range(12)]
    (source / "a.json").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    users = HttpLookup(
        url + "/users/{user_id}", params={"order": "{order_id}", "seq": "{user_id}"}, fields=[Field("name")]
    )
    stream = spark.readStream.schema(SCHEMA).json(str(source))
    out = AsyncDataStream.key_ordered_wait(stream, users, key="order_id", order_by="seq")
    query = out.writeStream.format("memory").queryName("null_order").trigger(availableNow=True).start()
    assert query.awaitTermination(120)
    assert query.exception() is None
    assert spark.sql("SELECT count(*) AS n FROM null_order").first().n == 12
    order = [int(q["seq"]) for _, _, _, q in sorted(state.calls, key=lambda c: c[1])]
    nulls = [r["user_id"] for r in rows if r["seq"] is None]
    assert sorted(order[:3]) == nulls  # NULL seq first, as Spark sorts ascending
    assert order[3:] == sorted(order[3:])


def test_nan_and_array_keys_group_as_spark_groups(spark: Any, service: Any) -> None:
    url, state = service
    state.latency, state.jitter, state.record_calls = 0.005, 0.01, True
    nan = float("nan")
    rows = [(i, [nan, 0.0, -0.0][i % 3], [i % 2, 1], i % 50) for i in range(90)]
    df = spark.createDataFrame(rows, "seq long, fk double, ak array<int>, user_id long")

    def logged(key: str) -> HttpLookup:
        params = {"order": "{" + key + "}", "seq": "{seq}"}
        return HttpLookup(url + "/users/{user_id}", params=params, fields=[Field("name")])

    # NaN, 0.0 and -0.0 are two keys: each runs one at a time, in seq order
    out = AsyncDataStream.key_ordered_wait(df, logged("fk"), key="fk", order_by="seq", num_partitions=4)
    assert out.count() == 90
    for _, _, _, query in state.calls:
        query["order"] = {"-0.0": "0.0"}.get(query["order"], query["order"])
    assert {q["order"] for _, _, _, q in state.calls} == {"nan", "0.0"}
    assert overlaps_and_disorder(state.calls) == (0, 0)
    # an ARRAY key is a key by value
    state.calls.clear()
    out = AsyncDataStream.key_ordered_wait(df, logged("ak"), key="ak", order_by="seq", num_partitions=4)
    assert out.count() == 90
    assert {q["order"] for _, _, _, q in state.calls} == {"[0, 1]", "[1, 1]"}
    assert overlaps_and_disorder(state.calls) == (0, 0)


def test_metrics_keep_a_fixed_size_histogram(spark: Any, df: Any) -> None:
    metrics = AsyncWaitMetrics(spark)
    AsyncDataStream.unordered_wait(df, ok, output_schema="ok boolean", metrics=metrics).collect()
    value = metrics.value
    assert value["records"] == 10 and value["latency_p50_s"] is not None and value["latency_p50_s"] < 1

"""Every Spark type that Arrow carries, through the three waits and both SQL forms: values reach
the function as natural Python types and come back unchanged; a value that does not fit its
column is an error naming the column and the key, never a truncated or NULL value."""

from __future__ import annotations

import datetime as dt
import decimal
import math
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sql_ext
from keyed_async_wait import AsyncDataStream, ConfigError
from keyed_async_wait.spark.compat import pyspark_version
from keyed_async_wait.spark.session import known_keys

ALL_KEYS = known_keys()  # every spark.sql.exec.async-lookup.* key, to unset them

pytestmark = [pytest.mark.spark, pytest.mark.compat("the three waits on every Spark type")]

# column -> (Spark type, the Python type the function must see)
COLUMNS: dict[str, tuple[str, str]] = {
    "ts": ("timestamp", "datetime+tz"),
    "ntz": ("timestamp_ntz", "datetime"),
    "d": ("date", "date"),
    "tm": ("time", "time"),
    "dec": ("decimal(38,18)", "Decimal"),
    "bin": ("binary", "bytes"),
    "arr": ("array<int>", "list"),
    "m": ("map<string,bigint>", "dict"),
    "st": ("struct<x:int,y:string,z:array<double>,n:map<string,timestamp>>", "dict"),
    "f": ("double", "float"),
    "fl": ("float", "float"),
    "s": ("string", "str"),
    "bo": ("boolean", "bool"),
    "by": ("tinyint", "int"),
    "sh": ("smallint", "int"),
    "i": ("int", "int"),
    "l": ("bigint", "int"),
    "iv": ("interval day to second", "timedelta"),
}
if pyspark_version() < (4, 1):  # Spark's TIME type is 4.1's
    del COLUMNS["tm"]
NAMES = list(COLUMNS)
INPUT_DDL = "k bigint, seq bigint, " + ", ".join(f"{c} {t}" for c, (t, _) in COLUMNS.items())
RESULT_DDL = ", ".join(f"r_{c} {t}" for c, (t, _) in COLUMNS.items()) + ", seen string"
ZONE = "America/New_York"  # not the machine's: a wrong zone anywhere shows


def _kind(value: Any) -> str:
    name = type(value).__name__
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return name + "+tz"
    return name


async def echo(record: dict[str, Any]) -> dict[str, Any]:
    """Every value back as a result column, and what types it saw."""
    seen = [f"{c}:{_kind(record[c])}" for c in NAMES if record[c] is not None]
    nested = (record["st"] or {}).get("n") or {}  # nested values are natural too
    seen += [f"st.n:{_kind(v)}" for _, v in sorted(nested.items()) if v is not None]
    return {**{f"r_{c}": record[c] for c in NAMES}, "seen": ",".join(seen)}


echo.input_fields = lambda: tuple(NAMES)  # type: ignore[attr-defined]

utc = dt.UTC
aware = st.datetimes(dt.datetime(1901, 1, 1), dt.datetime(2099, 12, 31)).map(lambda d: d.replace(tzinfo=utc))
nullable = st.none().__or__
row_values = st.fixed_dictionaries(
    {
        "ts": nullable(aware),
        "ntz": nullable(st.datetimes(dt.datetime(1901, 1, 1), dt.datetime(2099, 12, 31))),
        "d": nullable(st.dates(dt.date(1901, 1, 1), dt.date(2099, 12, 31))),
        "tm": nullable(st.times()),
        "dec": nullable(
            st.decimals(min_value=-(10**19) + 1, max_value=10**19 - 1, places=18, allow_nan=False)
        ),
        "bin": nullable(st.binary(max_size=6)),
        "arr": nullable(st.lists(nullable(st.integers(-(2**31), 2**31 - 1)), max_size=3)),
        "m": nullable(
            st.dictionaries(st.text(max_size=3), nullable(st.integers(-(2**63), 2**63 - 1)), max_size=3)
        ),
        "st": nullable(
            st.fixed_dictionaries(
                {
                    "x": nullable(st.integers(-(2**31), 2**31 - 1)),
                    "y": nullable(st.text(max_size=4)),
                    "z": nullable(st.lists(st.floats(allow_nan=True), max_size=3)),
                    "n": nullable(st.dictionaries(st.text(max_size=2), nullable(aware), max_size=2)),
                }
            )
        ),
        "f": nullable(st.floats(allow_nan=True, allow_infinity=True)),
        "fl": nullable(st.floats(width=32, allow_nan=True)),
        "s": nullable(st.text(max_size=6)),
        "bo": nullable(st.booleans()),
        "by": nullable(st.integers(-128, 127)),
        "sh": nullable(st.integers(-(2**15), 2**15 - 1)),
        "i": nullable(st.integers(-(2**31), 2**31 - 1)),
        "l": nullable(st.integers(-(2**63), 2**63 - 1)),
        "iv": nullable(st.timedeltas(dt.timedelta(days=-(10**6)), dt.timedelta(days=10**6))),
    }
)


def _same(a: Any, b: Any) -> bool:
    """Equality with NaN equal to NaN, through Rows, lists and dicts."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if hasattr(a, "asDict") and hasattr(b, "asDict"):
        return _same(a.asDict(), b.asDict())
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _expected_seen(row: dict[str, Any]) -> list[str]:
    seen = [f"{c}:{kind}" for c, (_, kind) in COLUMNS.items() if row[c] is not None]
    nested = (row["st"] or {}).get("n") or {}
    return seen + ["st.n:datetime+tz" for _, v in sorted(nested.items()) if v is not None]


@pytest.fixture
def zoned(spark: Any) -> Iterator[Any]:
    spark.conf.set("spark.sql.session.timeZone", ZONE)
    yield spark
    spark.conf.unset("spark.sql.session.timeZone")
    for key in ALL_KEYS:
        spark.conf.unset(key)


def _frames(spark: Any, rows: list[dict[str, Any]]) -> Any:
    data = [{"k": i % 3, "seq": i, **{c: row[c] for c in NAMES}} for i, row in enumerate(rows)]
    return spark.createDataFrame(data, INPUT_DDL)


def _check(out_rows: list[Any], df_rows: list[Any], result: Any) -> None:
    by_seq = {r.seq: r for r in df_rows}
    assert sorted(r.seq for r in out_rows) == sorted(by_seq)
    for row in out_rows:
        source = by_seq[row.seq]
        got = result(row)
        for c in NAMES:
            assert _same(getattr(source, c), getattr(got, f"r_{c}")), (
                c,
                getattr(source, c),
                getattr(got, f"r_{c}"),
            )
        assert (got.seen.split(",") if got.seen else []) == _expected_seen(source.asDict(recursive=True))


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(row_values, min_size=1, max_size=6))
def test_every_type_round_trips_through_every_form(zoned: Any, rows: list[dict[str, Any]]) -> None:
    spark = zoned
    df = _frames(spark, rows)
    expected = df.collect()
    for wait in (AsyncDataStream.ordered_wait, AsyncDataStream.unordered_wait):
        _check(wait(df, echo, output_schema=RESULT_DDL).collect(), expected, lambda r: r)
    keyed = AsyncDataStream.key_ordered_wait(df, echo, key="k", order_by="seq", output_schema=RESULT_DDL)
    _check(keyed.collect(), expected, lambda r: r)

    if pyspark_version() < (4, 0):  # sql_ext needs 4.0 (test_sql_versions)
        return
    ext = sql_ext.install(spark)
    ext.register("echo", echo, inputs=NAMES, output_schema=RESULT_DDL)
    df.createOrReplaceTempView("all_types")
    args = ", ".join(NAMES)
    if pyspark_version() >= (4, 2):  # the scalar functions: an Arrow UDF
        scalar = spark.sql(f"SELECT *, echo({args}) AS u FROM all_types").collect()
        _check(scalar, expected, lambda r: r.u)
    spark.conf.set("spark.sql.exec.async-lookup.output-mode", "ALLOW_UNORDERED")
    spark.conf.set("spark.sql.exec.async-lookup.key-ordered-enabled", "true")
    forms = [False, True] if pyspark_version() >= (4, 1) else [False]  # rows; Arrow batches (4.1+)
    for arrow in forms:
        sql_ext.install(spark, arrow=arrow).register("echo", echo, inputs=NAMES, output_schema=RESULT_DDL)
        table = spark.sql(
            "SELECT * FROM async_lookup(TABLE(all_types), 'echo', upsert_key => 'k', order_by => 'seq')"
        ).collect()
        _check(table, expected, lambda r: r)
        by_seq = {r.seq: r for r in expected}  # the table's own columns leave as they came
        assert all(_same(r[c], by_seq[r.seq][c]) for r in table for c in NAMES), arrow


def test_a_naive_datetime_in_a_timestamp_result_is_session_wall_time(zoned: Any) -> None:
    async def noon(record: dict[str, Any]) -> dict[str, Any]:
        return {"at": dt.datetime(2024, 7, 1, 12, 0)}

    df = zoned.createDataFrame([(1,)], "k bigint")
    out = AsyncDataStream.ordered_wait(df, noon, output_schema="at timestamp")
    (row,) = out.selectExpr("date_format(at, 'yyyy-MM-dd HH:mm XXX') AS shown").collect()
    assert row.shown == "2024-07-01 12:00 -04:00"  # noon in New York, as Spark reads '2024-07-01 12:00'


@pytest.mark.parametrize(
    ("ddl", "value", "reason"),
    [
        ("n bigint", 5.7, "5.7 (float) is not an int"),
        ("n int", 2**31, "outside int32"),
        ("n bigint", True, "True (bool) is not an int"),
        ("n decimal(10,2)", decimal.Decimal("1.005"), "more than 2 digits after the point"),
        ("n decimal(10,2)", 0.5, "is not a Decimal or int"),
        ("n date", dt.datetime(2024, 1, 1, 10), "is a datetime; a DATE column takes a date"),
        ("n timestamp_ntz", dt.datetime(2024, 1, 1, tzinfo=dt.UTC), "a TIMESTAMP_NTZ column takes a naive"),
        ("n string", 5, "5 (int) is not a str"),
        ("n struct<a:int>", {"a": 1, "b": 2}, "field 'b' is not in the struct"),
        ("n struct<a:int,b:int>", {"a": 1}, "field 'b' is missing"),
        ("n map<string,int>", [("a", 1)], "is not a dict"),
    ],
)
def test_a_value_that_does_not_fit_is_named_never_truncated(
    spark: Any, ddl: str, value: Any, reason: str
) -> None:
    async def fn(record: dict[str, Any]) -> dict[str, Any]:
        return {"n": value}

    df = spark.createDataFrame([(7, 1)], "order_id bigint, seq bigint")
    out = AsyncDataStream.key_ordered_wait(df, fn, key="order_id", output_schema=ddl)
    with pytest.raises(Exception) as failure:
        out.collect()
    text = str(failure.value)
    assert "result column 'n'" in text and "key 7" in text and reason in text, text[-600:]


def test_a_result_without_one_of_its_columns_is_an_error_not_a_null(spark: Any) -> None:
    async def partial(record: dict[str, Any]) -> dict[str, Any]:
        return {"a": 1}

    df = spark.createDataFrame([(3,)], "order_id bigint")
    with pytest.raises(
        Exception, match=r"result column 'b' is missing from the result .* key {'order_id': 3}"
    ):
        AsyncDataStream.unordered_wait(df, partial, output_schema="a int, b int").collect()


def test_a_column_arrow_cannot_carry_is_named_at_the_call(spark: Any) -> None:
    df = spark.sql("SELECT 1 AS k, INTERVAL '1' YEAR AS span")

    async def fn(record: dict[str, Any]) -> dict[str, Any]:
        return {"x": 1}

    with pytest.raises(ConfigError, match=r"column 'span'.*interval year.*cast it first"):
        AsyncDataStream.unordered_wait(df, fn, output_schema="x int")


async def slow_echo(record: dict[str, Any]) -> dict[str, Any]:
    import asyncio

    await asyncio.sleep(0.05)
    return await echo(record)


slow_echo.input_fields = echo.input_fields  # type: ignore[attr-defined]


@settings(max_examples=1, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(row_values, min_size=8, max_size=12))
def test_every_type_survives_parked_state_between_micro_batches(
    zoned: Any, tmp_path_factory: Any, rows: list[dict[str, Any]]
) -> None:
    """Rows parked by a time cap are written as state (parquet) and read back by the next
    micro-batch: every type must come out of that round trip unchanged too."""
    from pyspark.sql import functions as F

    spark = zoned
    tmp_path = tmp_path_factory.mktemp("parked")
    rows = [{name: None for name in NAMES}, *rows]  # all NULL, and the drawn ones
    df = _frames(spark, rows)
    if "tm" in COLUMNS:  # Spark writes no TIME to parquet: the source, and parked state, cannot hold one
        df = df.drop("tm").withColumn("tm", F.lit(None).cast("string"))
        (tmp_path / "nothing").mkdir()
        with pytest.raises(ConfigError, match=r"column 'tm'.*Spark writes no TIME to parquet"):
            AsyncDataStream.key_ordered_stream(
                spark.readStream.schema("k bigint, tm time").parquet(str(tmp_path / "nothing")),
                echo,
                "k",
                sink=lambda out, batch_id: None,
                checkpoint_location=str(tmp_path / "never"),
                output_schema="x int",
            )
    expected = df.collect()
    df.write.parquet(str(tmp_path / "in"))
    got: dict[int, list[Any]] = {}

    def sink(out: Any, batch_id: int) -> None:
        got[batch_id] = out.collect()

    stream = AsyncDataStream.key_ordered_stream(
        spark.readStream.schema(df.schema).parquet(str(tmp_path / "in")),
        slow_echo,
        "k",
        order_by="seq",
        sink=sink,
        checkpoint_location=str(tmp_path / "cp"),
        time_cap=0.01,  # the first wave only: the rest is parked, every micro-batch
        heartbeat=1,
        output_schema=RESULT_DDL,
        timeout=30.0,
    )
    query = stream.start(processingTime="0.5 seconds")
    try:
        assert stream.wait_until(lambda r: sum(x.rows_out for x in r) >= len(rows) and r[-1].parked == 0, 180)
    finally:
        query.stop()
    assert sum(r.replayed for r in stream.reports) > 0  # rows did go through parked state
    _check([row for batch in got.values() for row in batch], expected, lambda r: r)

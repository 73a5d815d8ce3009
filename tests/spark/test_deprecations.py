"""The 0.1 spellings of the Spark calls: each works for a release, warns naming the new one,
and means exactly what the new spelling means."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from keyed_async_wait import AsyncDataStream, ConfigError, DeferPolicy
from keyed_async_wait.spark.compat import pyspark_version
from keyed_async_wait.spark.stream import error_handling
from lookup import Field, HttpLookup

pytestmark = pytest.mark.spark

SCHEMA = "seq long, order_id long, user_id long"


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ({"on_error": "emit"}, {"error_column": "_error"}, (None, "_error")),
        ({"on_error": "defer"}, {"defer": DeferPolicy()}, (DeferPolicy(), "_error")),
        ({"on_error": "fail"}, {}, (None, None)),
        (
            {"max_defer_age": 60.0},
            {"defer": DeferPolicy(max_age=60.0)},
            (DeferPolicy(max_age=60.0), "_error"),
        ),
        (
            {"on_error": "defer", "max_defer_age": 5.0, "defer": DeferPolicy(delay=1.0)},
            {"defer": DeferPolicy(delay=1.0, max_age=5.0)},
            (DeferPolicy(delay=1.0, max_age=5.0), "_error"),
        ),
        ({"on_error": "emit", "error_column": "err"}, {"error_column": "err"}, (None, "err")),
    ],
)
def test_an_old_spelling_of_the_streams_failures_means_what_the_new_one_does(
    old: dict[str, Any], new: dict[str, Any], expected: tuple[Any, Any]
) -> None:
    def handled(options: dict[str, Any]) -> tuple[Any, Any]:
        given = {"on_error": None, "defer": None, "max_defer_age": None, "error_column": None, **options}
        return error_handling(
            given["on_error"], given["defer"], given["max_defer_age"], given["error_column"]
        )

    with pytest.warns(DeprecationWarning, match="deprecated and goes in the next release; use "):
        assert handled(old) == expected
    assert handled(new) == expected  # and the new spelling warns not (warnings are errors here)


def test_old_spellings_that_contradict_the_new_ones_are_errors() -> None:
    with pytest.warns(DeprecationWarning), pytest.raises(ConfigError, match="on_error='fail'"):
        error_handling("fail", DeferPolicy(), None, None)
    with pytest.warns(DeprecationWarning), pytest.raises(ConfigError, match="max_defer_age=5"):
        error_handling(None, DeferPolicy(max_age=60.0), 5.0, None)
    with pytest.raises(ConfigError, match="on_error='skip'"):
        error_handling("skip", None, None, None)


def test_the_stream_warns_at_the_users_line_and_still_builds(spark: Any, tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    stream = spark.readStream.schema(SCHEMA).json(str(tmp_path / "in"))
    users = HttpLookup("http://127.0.0.1:9/users/{user_id}", fields=[Field("name")])
    common = {"sink": lambda df, i: None, "checkpoint_location": str(tmp_path / "cp")}
    with pytest.warns(DeprecationWarning, match=r"on_error= .*use error_column='_error'") as caught:
        built = AsyncDataStream.key_ordered_stream(stream, users, "order_id", on_error="emit", **common)
    assert built is not None
    assert {Path(w.filename).name for w in caught} == {Path(__file__).name}
    with pytest.warns(DeprecationWarning, match=r"max_defer_age= .*DeferPolicy\(max_age=\.\.\.\)"):
        AsyncDataStream.key_ordered_stream(stream, users, "order_id", max_defer_age=30, **common)


@pytest.mark.skipif(pyspark_version() < (4, 0), reason="sql_ext needs pyspark 4.0")
def test_sqls_error_field_is_error_column(spark: Any) -> None:
    import sql_ext

    async def tier(record: dict[str, Any]) -> dict[str, Any]:
        return {"tier": 1}

    installed = sql_ext.install(spark)
    with pytest.warns(
        DeprecationWarning, match=r"register\(error_field=\.\.\.\) .*use error_column="
    ) as caught:
        source = installed.register(
            "old_tiers", tier, inputs=["user_id"], output_schema="tier bigint", error_field="_e"
        )
    assert source is not None and {Path(w.filename).name for w in caught} == {Path(__file__).name}
    with pytest.warns(DeprecationWarning), pytest.raises(ConfigError, match="error_field='_e'"):
        installed.register(
            "both", tier, inputs=["user_id"], output_schema="tier bigint", error_column="x", error_field="_e"
        )
    with pytest.warns(DeprecationWarning, match=r"install\(error_field=\.\.\.\)"):
        sql_ext.install(spark, error_field="_e")

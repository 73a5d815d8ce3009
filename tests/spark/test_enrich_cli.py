"""``kaw-enrich`` on your own data, end to end in this process (the session fixture's Spark, which
the command uses and leaves running): parquet over HTTP with a bearer token, the same as a
stream, CSV over Redis; and bad flags, each an exit 2 naming the flag with nothing written."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from keyed_async_wait.app import own_job
from keyed_async_wait.app.enrich import main

pytestmark = pytest.mark.spark

TOKEN = "t0ken-of-the-cli-test"
# users 1-4 answer; 40 is not there (a miss: NULL fields); 50 is refused (400: a failed row)
USERS = [1, 2, 3, 1, 2, 4, 40, 50, 1]


def profile(user_id: int) -> dict[str, Any]:
    return {
        "name": f"user-{user_id}",
        "score": user_id * 1.5,
        "visits": user_id * 10,
        "vip": user_id % 2 == 0,
        "address": {"city": f"city-{user_id}", "zip": str(1000 + user_id)},
    }


def orders(ids: range) -> pa.Table:
    """id, user_id, amount: one row per id, its user from USERS in turn."""
    return pa.table(
        {
            "id": list(ids),
            "user_id": [USERS[i % len(USERS)] for i in ids],
            "amount": [i + 0.25 for i in ids],
        }
    )


@pytest.fixture
def users(httpserver: HTTPServer) -> Iterator[tuple[str, list[str]]]:
    """GET /users/{id} behind the bearer token; the Authorization headers that arrived."""
    seen: list[str] = []

    def answer(request: Request) -> Response:
        seen.append(request.headers.get("Authorization", ""))
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return Response("no", status=401)
        user = int(request.path.rsplit("/", 1)[1])
        if user == 40:
            return Response(status=404)
        if user == 50:
            return Response('{"error": "refused"}', status=400, content_type="application/json")
        return Response(json.dumps(profile(user)), content_type="application/json")

    httpserver.expect_request(re.compile(r"/users/\d+")).respond_with_handler(answer)
    yield httpserver.url_for("/users/{user_id}"), seen


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 0, err[-3000:]
    assert TOKEN not in out + err
    return dict(json.loads(out))


HTTP_FLAGS = [
    *("--bearer-env", "KAW_TEST_TOKEN", "--key", "user_id", "--order-by", "id"),
    *("--field", "name", "--field", "score:float", "--field", "visits:int", "--field", "vip:bool"),
    *("--field", "address.city", "--field", "address:json", "--error-column", "failure"),
    *(
        "--field",
        "postcode=address.zip",
    ),
]


def check_enriched(rows: list[Any], ids: range) -> None:
    """Every input row once, each with its user's profile (typed), a miss's NULLs or its error."""
    assert sorted(r.id for r in rows) == list(ids)
    for r in rows:
        assert r.user_id == USERS[r.id % len(USERS)] and r.amount == r.id + 0.25
        if r.user_id in (40, 50):
            assert (r.name, r.score, r.visits, r.vip, r.address_city, r.address, r.postcode) == (None,) * 7
            assert (r.failure is None) == (r.user_id == 40), r
            continue
        p = profile(r.user_id)
        assert (r.name, r.score, r.visits, r.vip) == (p["name"], p["score"], p["visits"], p["vip"])
        assert r.address_city == p["address"]["city"] and json.loads(r.address) == p["address"]
        assert r.postcode == p["address"]["zip"]  # --field COLUMN=NAME
        assert r.failure is None
    failed = [r for r in rows if r.failure is not None]
    assert all("400" in r.failure.error_message and TOKEN not in r.failure.error_message for r in failed)


def test_parquet_over_http_with_a_bearer_token(
    spark: Any,
    users: tuple[str, list[str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, seen = users
    monkeypatch.setenv("KAW_TEST_TOKEN", TOKEN)
    ids = range(30)
    pq.write_table(orders(ids), tmp_path / "orders.parquet")
    out = tmp_path / "enriched"
    summary = run_cli(
        ["--input", str(tmp_path / "orders.parquet"), "--output", str(out), "--http-url", url, *HTTP_FLAGS],
        capsys,
    )
    assert seen and set(seen) == {f"Bearer {TOKEN}"}
    fails = sum(1 for i in ids if USERS[i % len(USERS)] == 50)
    assert summary["rows_in"] == summary["rows_out"] == len(ids) and summary["failed_rows"] == fails
    assert summary["output"] == str(out) and summary["mode"] == "key_ordered" and summary["wall_s"] > 0
    result = spark.read.parquet(str(out))
    types = dict(result.dtypes)
    assert types["score"] == "double" and types["visits"] == "bigint" and types["vip"] == "boolean"
    assert types["address_city"] == "string" and types["id"] == "bigint"
    check_enriched(result.collect(), ids)


def test_a_folder_as_a_stream_and_its_next_run(
    spark: Any,
    users: tuple[str, list[str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, _ = users
    monkeypatch.setenv("KAW_TEST_TOKEN", TOKEN)
    incoming, out, state = tmp_path / "incoming", tmp_path / "enriched", tmp_path / "state"
    incoming.mkdir()
    pq.write_table(orders(range(0, 12)), incoming / "part-0.parquet")
    pq.write_table(orders(range(12, 20)), incoming / "part-1.parquet")
    argv = ["--input", str(incoming), "--stream", "--checkpoint", str(state), "--output", str(out)]
    argv += ["--http-url", url, *HTTP_FLAGS]
    first = run_cli(argv, capsys)
    assert first["stream"] is True and first["rows_in"] == first["rows_out"] == 20
    assert first["failed_rows"] == sum(1 for i in range(20) if USERS[i % len(USERS)] == 50)
    check_enriched(spark.read.parquet(str(out)).collect(), range(20))
    # the next run takes the file that came since, and appends its rows (the output is not empty,
    # but the checkpoint says what it holds)
    pq.write_table(orders(range(20, 27)), incoming / "part-2.parquet")
    second = run_cli(argv, capsys)
    assert second["rows_in"] == second["rows_out"] == 7
    check_enriched(spark.read.parquet(str(out)).collect(), range(27))


def test_csv_over_redis_to_csv(
    spark: Any, redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        for user in (1, 2, 3):
            client.set(f"kaw-cli:user:{user}", json.dumps({"name": f"user-{user}", "score": user * 1.5}))
        client.set("kaw-cli:user:9", "not json")  # a bad answer: that row fails, kept with its error
        source = tmp_path / "payments.csv"
        source.write_text("id,user_id,amount\n1,1,9.5\n2,2,3.25\n3,3,1.0\n4,1,2.0\n5,7,4.0\n6,9,8.0\n")
        out = tmp_path / "enriched"
        summary = run_cli(
            [
                *("--input", str(source), "--output", str(out), "--output-format", "csv"),
                *("--redis-url", redis_url, "--redis-key", "kaw-cli:user:{user_id}"),
                *("--field", "name", "--field", "score:float", "--error-column", "failure"),
            ],
            capsys,
        )
    finally:
        client.delete(*[f"kaw-cli:user:{user}" for user in (1, 2, 3, 9)])
        client.close()
    assert summary["rows_in"] == summary["rows_out"] == 6 and summary["failed_rows"] == 1
    assert summary["mode"] == "unordered" and summary["output_format"] == "csv"
    rows = {
        r.id: r for r in spark.read.option("header", True).option("inferSchema", True).csv(str(out)).collect()
    }
    assert sorted(rows) == [1, 2, 3, 4, 5, 6]
    for i, user in ((1, 1), (2, 2), (3, 3), (4, 1)):
        assert (rows[i].name, rows[i].score, rows[i].failure) == (f"user-{user}", user * 1.5, None)
    assert (rows[5].name, rows[5].score, rows[5].failure) == (None, None, None)  # user 7: a miss
    assert rows[6].name is None and "not JSON" in json.loads(rows[6].failure)["error_message"]


@pytest.fixture
def parquet_input(tmp_path: Path) -> Path:
    path = tmp_path / "orders.parquet"
    pq.write_table(orders(range(3)), path)
    return path


@pytest.fixture
def no_spark(monkeypatch: pytest.MonkeyPatch) -> None:
    """A check that must come before Spark starts: starting it fails the test."""

    def refuse(plan: Any) -> Any:
        raise AssertionError("Spark started before the flags were checked")

    monkeypatch.setattr(own_job, "_session", refuse)


URL = "http://127.0.0.1:9/users/{user_id}"
PRE_SPARK = [  # (flags after --input and --output, the flag named, what else the message says)
    (["--format", "xml", "--http-url", URL, "--field", "name"], "--format", "invalid choice"),
    (["--http-url", URL, "--field", "name", "--rows", "10"], "--rows", "--input"),
    (
        ["--http-url", URL, "--field", "name", "--bearer-env", "KAW_TEST_UNSET"],
        "--bearer-env",
        "KAW_TEST_UNSET",
    ),
    (["--http-url", URL, "--field", "name", "--stream"], "--checkpoint", "--stream"),
    (["--http-url", URL, "--field", "name:decimal"], "--field", "string, int, float, bool, json"),
    (["--http-url", URL], "--field", "none given"),
    (["--http-url", URL, "--field", "name", "--redis-url", "redis://x"], "--http-url", "one lookup"),
    (["--redis-url", "redis://x", "--field", "name"], "--redis-key", "not given"),
    (["--http-url", URL, "--field", "name", "--mode", "key_ordered"], "--key", "not given"),
    (["--http-url", URL, "--field", "name", "--order-by", "id"], "--order-by", "without --key"),
    (["--http-url", URL, "--field", "a=b=c"], "--field", "[COLUMN=]NAME[:TYPE]"),
]


@pytest.mark.usefixtures("no_spark")
@pytest.mark.parametrize(
    ("flags", "flag", "says"), PRE_SPARK, ids=[f"{c[1]}-{i}" for i, c in enumerate(PRE_SPARK)]
)
def test_a_bad_flag_exits_2_naming_it_before_spark_starts(
    parquet_input: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    flag: str,
    says: str,
) -> None:
    monkeypatch.delenv("KAW_TEST_UNSET", raising=False)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit:
        main(["--input", str(parquet_input), "--output", str(out), *flags])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit.value.code == 2 and error.startswith("kaw-enrich: error: ")
    assert flag in error and says in error, error
    assert not out.exists()


@pytest.mark.usefixtures("no_spark")
def test_the_input_and_output_flags_are_checked_before_spark_starts(
    parquet_input: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = tmp_path / "orders.txt"
    text.write_text("id\n1\n")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "part-0.parquet").write_text("earlier")
    lookup = ["--http-url", URL, "--field", "name"]
    cases = [
        (["--input", str(parquet_input), *lookup], "--output: not given"),
        (["--input", str(text), "--output", str(tmp_path / "o"), *lookup], "--format: not given"),
        (["--input", str(parquet_input), "--output", str(taken), *lookup], "--output: "),
        (["--input", str(tmp_path / "nope.parquet"), "--output", str(tmp_path / "o"), *lookup], "--input: "),
    ]
    for argv, says in cases:
        with pytest.raises(SystemExit) as exit:
            main(argv)
        error = capsys.readouterr().err.strip().splitlines()[-1]
        assert exit.value.code == 2 and says in error, error
    assert not (tmp_path / "o").exists() and [p.name for p in taken.iterdir()] == ["part-0.parquet"]


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (
            ["--http-url", "http://127.0.0.1:9/users/{customer}", "--field", "name"],
            "--http-url: column 'customer'",
        ),
        (["--http-url", URL, "--field", "amount"], "--field: column 'amount'"),
        (["--http-url", URL, "--field", "amount"], "--field COLUMN=NAME[:TYPE] names it"),
        (["--http-url", URL, "--field", "name", "--key", "order_id"], "--key: column 'order_id'"),
        (["--http-url", URL, "--field", "name", "--schema", "id lonng"], "--schema: 'id lonng' is no schema"),
    ],
)
def test_a_column_that_is_not_there_is_named_before_anything_is_written(
    spark: Any,
    parquet_input: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    named: str,
) -> None:
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit:
        main(["--input", str(parquet_input), "--output", str(out), *flags])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit.value.code == 2 and named in error, error
    assert "--schema" in named or "id, user_id, amount" in error
    assert not out.exists()


def test_a_table_of_the_session_in_input_order(
    spark: Any, redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spark.createDataFrame([(1, 2), (2, 3), (3, 2)], "id long, user_id long").createOrReplaceTempView(
        "kaw_cli_orders"
    )
    client = redis.Redis.from_url(redis_url)
    try:
        client.set("kaw-cli-table:2", json.dumps({"profile": {"tier": "gold", "visits": 4}}))
        out = tmp_path / "enriched"
        summary = run_cli(
            [
                *("--table", "kaw_cli_orders", "--output", str(out), "--mode", "ordered"),
                *("--redis-url", redis_url, "--redis-key", "kaw-cli-table:{user_id}"),
                *("--result-path", "profile", "--field", "tier", "--field", "visits:int"),
            ],
            capsys,
        )
    finally:
        client.delete("kaw-cli-table:2")
        client.close()
        spark.catalog.dropTempView("kaw_cli_orders")
    assert summary["input"] == "table kaw_cli_orders" and summary["rows_out"] == 3
    assert "failed_rows" not in summary
    rows = sorted(spark.read.parquet(str(out)).collect())
    assert [tuple(r) for r in rows] == [(1, 2, "gold", 4), (2, 3, None, None), (3, 2, "gold", 4)]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--key", "user_id"], "--key: given without --input or --table"),
        (["--http-url", URL], "--http-url: a template"),
    ],
)
def test_the_demo_refuses_the_flags_of_your_own_data(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    from keyed_async_wait.app import enrich

    def refuse(args: Any) -> Any:
        raise AssertionError("the demo started")

    monkeypatch.setattr(enrich, "run", refuse)
    with pytest.raises(SystemExit) as exit:
        main(argv)
    assert exit.value.code == 2 and says in capsys.readouterr().err


def test_a_failing_row_without_an_error_column_fails_the_job_in_one_line(
    spark: Any,
    users: tuple[str, list[str]],
    parquet_input: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A row whose call fails for good (here: the service refuses a wrong token) ends the job
    with exit 1 and one line naming the record and the cause, and says how to keep such rows."""
    url, _ = users
    monkeypatch.setenv("KAW_TEST_TOKEN", "not-the-token")
    out = tmp_path / "out"
    flags = ["--http-url", url, "--bearer-env", "KAW_TEST_TOKEN", "--field", "name", "--retries", "1"]
    code = main(["--input", str(parquet_input), "--output", str(out), *flags])
    err = capsys.readouterr().err
    assert code == 1
    failed = [line for line in err.splitlines() if line.startswith("kaw-enrich failed: ")]
    assert len(failed) == 1 and failed[0].startswith("kaw-enrich failed: RecordFailedError: record "), err[
        -2000:
    ]
    assert "status 401" in failed[0] and "not-the-token" not in err
    assert "--error-column NAME keeps such rows" in err

"""Chains of named steps through Spark: a two-step chain in key_ordered_wait (the second step
reads a field of the first's answer), and in key_ordered_stream, where records parked by the
second step's outage resume there: the first step's service sees no repeated call."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from keyed_async_wait import AsyncDataStream, Chain, ConfigError, DeferPolicy, RetryStrategy, Step
from lookup import Field, HttpLookup

from ..processes import run_bounded
from .test_parking_stream import SCHEMA, Sink, write_updates

pytestmark = [pytest.mark.spark, pytest.mark.compat("chains")]


def two_steps(url: str) -> Chain:
    customer = HttpLookup(
        url + "/users/{user_id}",
        params={"step": "customer", "seq": "{seq}"},
        fields=[Field("name"), Field("tier"), Field("boss", "int", path="id")],
    )
    boss = HttpLookup(
        url + "/users/{boss}",
        params={"step": "boss", "seq": "{seq}"},
        fields=[Field("boss_name", path="name")],
    )
    return Chain(Step("customer", customer), Step("boss", boss))


def calls_per(state: Any, step: str) -> Counter[str]:
    return Counter(query["seq"] for _, _, _, query in state.calls if query.get("step") == step)


def test_a_two_step_chain_in_key_ordered_wait(spark: Any, service: Any) -> None:
    url, state = service
    state.record_calls = True
    rows = [(i, i % 7, i % 30) for i in range(120)] + [(120, 3, 10**7)]  # the last: an unknown user
    df = spark.createDataFrame(rows, SCHEMA)
    out = AsyncDataStream.key_ordered_wait(df, two_steps(url), "order_id", order_by="seq").collect()
    assert sorted(r.seq for r in out) == list(range(121))
    for r in out:
        if r.seq == 120:  # the first step missed: the chain missed, every field null
            assert (r.name, r.boss, r.boss_name) == (None, None, None)
        else:
            assert (r.name, r.boss, r.boss_name) == (f"user-{r.user_id}", r.user_id, f"user-{r.user_id}")
    assert set(calls_per(state, "customer").values()) == {1}
    assert len(calls_per(state, "boss")) == 120  # not called after the miss


def test_a_chain_template_field_is_checked_at_the_call(spark: Any, service: Any) -> None:
    url, _ = service
    df = spark.createDataFrame([(1, 1, 1)], SCHEMA)
    assert two_steps(url).input_fields() == ("user_id", "seq")  # boss comes from the first step
    with pytest.raises(ConfigError, match="user_id"):
        AsyncDataStream.ordered_wait(df.drop("user_id"), two_steps(url))


def test_parked_records_resume_at_the_step_they_reached(spark: Any, service: Any, tmp_path: Path) -> None:
    """The second step's service is down: records park after their first step; once it is
    back, replays call only the second step, so the first sees each record once."""
    url, state = service
    state.record_calls = True
    state.down_query = {"step": "boss"}
    rows = [(i, i % 6, i % 40) for i in range(60)]
    write_updates(tmp_path / "in", rows)
    sink = Sink()
    stream = AsyncDataStream.key_ordered_stream(
        spark.readStream.schema(SCHEMA).json(str(tmp_path / "in")),
        two_steps(url),
        "order_id",
        order_by="seq",
        sink=sink,
        checkpoint_location=str(tmp_path / "cp"),
        defer=DeferPolicy(delay=1.0, max_delay=2.0),
        retry=RetryStrategy.fixed_delay(2, 0.01),
        heartbeat=1,
        timeout=10.0,
    )
    query = stream.start(processingTime="0.5 seconds")
    try:
        assert stream.wait_until(lambda r: r[-1].parked == 60, 120), stream.reports
        assert calls_per(state, "boss")  # the second step was tried, and failed
        state.down_query = {}
        assert stream.wait_until(lambda r: sum(x.rows_out for x in r) >= 60 and r[-1].parked == 0, 120)
    finally:
        query.stop()
    out = sink.rows()
    assert sorted(r.seq for r in out) == list(range(60))
    assert all(r.boss_name == f"user-{r.user_id}" and r._error is None for r in out)
    first = calls_per(state, "customer")
    assert set(first.values()) == {1}, first  # no completed first step ran again
    assert len(first) == 60
    for key in range(6):
        seqs = [r.seq for r in out if r.order_id == key]
        assert seqs == sorted(seqs)


def test_a_chain_registered_for_sql(spark: Any, service: Any) -> None:
    import sql_ext
    from keyed_async_wait.spark.compat import pyspark_version

    if pyspark_version() < (4, 0):
        pytest.skip("sql_ext needs pyspark 4.0 (test_sql_versions checks the refusal)")
    url, _ = service
    spark.createDataFrame([(i, i % 5, i % 20) for i in range(40)], SCHEMA).createOrReplaceTempView(
        "chain_orders"
    )
    sql_ext.install(spark, {"enrich": two_steps(url)})
    spark.sql("SET `spark.sql.exec.async-lookup.output-mode`=ALLOW_UNORDERED")
    spark.sql("SET `spark.sql.exec.async-lookup.key-ordered-enabled`=true")
    try:
        rows = spark.sql(
            "SELECT * FROM async_lookup(TABLE(chain_orders), 'enrich', upsert_key => 'order_id', "
            "order_by => 'seq')"
        ).collect()
        assert sorted(r.seq for r in rows) == list(range(40))
        assert all(r.boss_name == f"user-{r.user_id}" and r.boss == r.user_id for r in rows)
        if pyspark_version() >= (4, 2):  # the scalar functions: an Arrow UDF
            scalar = spark.sql("SELECT seq, user_id, enrich(user_id, seq) AS e FROM chain_orders").collect()
            assert all(r.e.boss_name == f"user-{r.user_id}" for r in scalar)
    finally:
        spark.sql("RESET `spark.sql.exec.async-lookup.output-mode`")
        spark.sql("RESET `spark.sql.exec.async-lookup.key-ordered-enabled`")


@pytest.mark.compat_once
def test_a_killed_chain_resumes_at_the_step_it_reached(service: Any, redis_url: str, tmp_path: Path) -> None:
    """SIGKILL of the driver while every key's record waits in the second step; the restart
    (other shuffle partitions) re-runs the micro-batch from its input: with the step journal,
    no record whose first step had finished calls the first step again."""
    url, state = service
    state.record_calls, state.latency = True, 0.01
    state.slow_query, state.slow_seconds = {"step": "boss"}, 5.0  # records wait in the second step
    rows = [(seq, seq % 10, seq % 10 + 100) for seq in range(60)]
    write_updates(tmp_path / "in", rows)
    job = Path(__file__).with_name("parking_job.py")
    args = [
        sys.executable, str(job), "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"),
        "--checkpoint", str(tmp_path / "cp"), "--url", url, "--expect", "60", "--journal", redis_url,
        "--time-cap", "60",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    first = subprocess.Popen(
        [*args, "--partitions", "2"], stdout=subprocess.DEVNULL, env=env, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 180
        # ten keys in two tasks (local[2]): ten first steps done, ten second steps waiting
        while not (state.in_flight >= 10 and state.requests >= 20) and time.monotonic() < deadline:
            state.started.wait(5)
            state.started.clear()
        assert state.in_flight >= 10, (state.in_flight, state.requests)
        killed = time.monotonic()
        os.killpg(first.pid, signal.SIGKILL)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        first.wait(60)
    state.slow_query = {}
    second = run_bounded([*args, "--partitions", "5"], env=env, timeout=300)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-3000:]

    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "out").to_pylist()
    assert sorted(r["seq"] for r in table) == list(range(60))  # every row once
    assert all(r["boss_name"] == f"user-{r['user_id']}" for r in table)
    per_key: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for r in table:
        per_key[r["order_id"]].append((r["batch_id"], r["pos"], r["seq"]))
    assert all([s for _, _, s in sorted(v)] == sorted(s for _, _, s in v) for v in per_key.values())
    waiting = {q["seq"] for _, start, _, q in state.calls if q.get("step") == "boss" and start < killed}
    assert len(waiting) >= 10, waiting  # in their second step when the job died
    first_calls = Counter(q["seq"] for _, _, _, q in state.calls if q.get("step") == "customer")
    assert all(first_calls[seq] == 1 for seq in waiting), {seq: first_calls[seq] for seq in waiting}
    assert sum(first_calls.values()) == 60  # and no other record's first step repeated either

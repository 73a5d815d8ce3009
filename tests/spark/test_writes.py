"""Fenced writes through Spark: re-runs apply nothing twice, a chain looks up then writes, and
a streaming update stream killed twice mid-micro-batch leaves every store at each key's newest
version, never having gone back."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import redis

from keyed_async_wait import AsyncDataStream, AsyncWaitMetrics, Chain, ConfigError, Step
from lookup import Field, HttpLookup, RedisLookup, RedisWrite
from lookup.versions import encode_version

from ..processes import run_bounded
from .test_parking_stream import write_updates

pytestmark = [pytest.mark.spark, pytest.mark.compat("writes")]


def test_a_rerun_batch_job_applies_nothing_twice_and_counts_the_refused(spark: Any, redis_url: str) -> None:
    p = f"w{uuid.uuid4().hex[:8]}"
    rows = [(seq, seq % 20, seq * 3) for seq in range(200)]
    random.Random(1).shuffle(rows)
    df = spark.createDataFrame(rows, "seq long, order_id long, user_id long")
    write = RedisWrite(redis_url, p + ":{order_id}", fields=["seq", "user_id"], version="seq")
    first, again = AsyncWaitMetrics(spark), AsyncWaitMetrics(spark)
    out = AsyncDataStream.key_ordered_wait(df, write, "order_id", order_by="seq", metrics=first).collect()
    assert len(out) == 200 and all(r.applied for r in out)  # sorted by seq per key: all newer
    assert first.value["writes_applied"] == 200 and first.value["writes_stale"] == 0
    rerun = AsyncDataStream.key_ordered_wait(df, write, "order_id", order_by="seq", metrics=again).collect()
    assert not any(r.applied for r in rerun)
    assert again.value["writes_applied"] == 0 and again.value["writes_stale"] == 200
    client = redis.Redis.from_url(redis_url)
    try:
        for key in range(20):
            newest = max(seq for seq, k, _ in rows if k == key)
            assert json.loads(client.get(f"{p}:{key}")) == {"seq": newest, "user_id": newest * 3}
            kept = client.get(f"{p}:{key}:kaw-version").decode()  # version|token of its call
            assert kept.split("|")[0] == encode_version(newest)
    finally:
        client.close()


def test_a_chain_looks_up_then_writes_what_it_found(spark: Any, service: Any, redis_url: str) -> None:
    url, _ = service
    p = f"w{uuid.uuid4().hex[:8]}"
    users = HttpLookup(url + "/users/{user_id}", fields=[Field("name")])
    store = RedisWrite(redis_url, p + ":{order_id}", fields=["name", "seq"], version="seq")
    df = spark.createDataFrame([(i, i % 4, i) for i in range(12)], "seq long, order_id long, user_id long")
    out = AsyncDataStream.key_ordered_wait(
        df, Chain(Step("user", users), Step("store", store)), "order_id", order_by="seq"
    ).collect()
    assert sorted((r.seq, r.name, r.applied) for r in out) == [(i, f"user-{i}", True) for i in range(12)]
    client = redis.Redis.from_url(redis_url)
    try:
        assert json.loads(client.get(f"{p}:3")) == {"name": "user-11", "seq": 11}
    finally:
        client.close()


def test_a_write_without_a_version_names_the_way_out_at_the_call(spark: Any, redis_url: str) -> None:
    from lookup import LookupOptionError

    with pytest.raises(LookupOptionError, match="at_least_once=True"):
        RedisWrite(redis_url, "k:{order_id}", fields=["seq"])
    df = spark.createDataFrame([(1, 1, 1)], "seq long, order_id long, user_id long")
    write = RedisWrite(redis_url, "k:{order_id}", fields=["seq"], version="missing")
    with pytest.raises(ConfigError, match="missing"):
        AsyncDataStream.key_ordered_wait(df, write, "order_id", order_by="seq")


def _kill_when_writing(
    args: list[str], env: dict[str, str], state: Any, partitions: int, writes: int
) -> None:
    """Start the job; SIGKILL it once the service holds ``writes`` more writes and some are
    in flight (mid-micro-batch)."""
    seen = len(state.write_log)
    job = subprocess.Popen(
        [*args, "--partitions", str(partitions)], stdout=subprocess.DEVNULL, env=env, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 180
        while (
            not (len(state.write_log) >= seen + writes and state.in_flight > 0)
            and time.monotonic() < deadline
        ):
            state.started.wait(5)
            state.started.clear()
        assert len(state.write_log) >= seen + writes and job.poll() is None, (len(state.write_log), seen)
        os.killpg(job.pid, signal.SIGKILL)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        job.wait(60)


@pytest.mark.compat_once
def test_an_update_stream_killed_twice_leaves_each_store_at_the_newest_version(
    service: Any, redis_url: str, tmp_path: Path
) -> None:
    url, state = service
    state.latency, state.jitter = 0.02, 0.02
    rows = [(seq, seq % 12, seq) for seq in range(240)]  # 20 versions per key
    random.Random(7).shuffle(rows)  # versions out of order across the files
    write_updates(tmp_path / "in", rows, files=8)
    redis.Redis.from_url(redis_url).delete(
        *[f"kill:{k}" for k in range(12)], *[f"kill:{k}:kaw-version" for k in range(12)]
    )
    job = Path(__file__).with_name("parking_job.py")
    args = [
        sys.executable, str(job), "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"),
        "--checkpoint", str(tmp_path / "cp"), "--url", url, "--expect", "240", "--write", redis_url,
        "--time-cap", "60",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    _kill_when_writing(args, env, state, partitions=2, writes=40)
    _kill_when_writing(args, env, state, partitions=5, writes=40)
    last = run_bounded([*args, "--partitions", "3"], env=env, timeout=300)
    assert last.returncode == 0, last.stdout[-2000:] + last.stderr[-3000:]

    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "out").to_pylist()
    assert sorted(r["seq"] for r in table) == list(range(240))  # every row once in the sink
    newest = {k: max(seq for seq, key, _ in rows if key == k) for k in range(12)}
    client = redis.Redis.from_url(redis_url)
    try:
        for k, seq in newest.items():
            assert json.loads(client.get(f"kill:{k}")) == {"seq": seq, "user_id": seq}
            assert state.records[str(k)][1] == {"seq": seq, "user_id": seq}
    finally:
        client.close()
    held: dict[str, str] = {}
    applied_once: dict[tuple[str, str], int] = defaultdict(int)
    reruns = 0
    for key, version, applied, _ in state.write_log:  # the service's own order
        if applied:
            assert version > held.get(key, ""), (key, version, held.get(key))  # never back in time
            held[key] = version
            applied_once[(key, version)] += 1
        elif (key, version) in applied_once:
            reruns += 1  # a re-run of a write already applied: refused
        else:
            assert version < held[key]  # a late, older version: refused as stale
    assert all(n == 1 for n in applied_once.values())  # each (key, version) applied exactly once
    assert reruns > 0  # the kills made re-runs, and the fence refused them


def test_sql_gets_a_write_only_when_the_installing_code_allows_it(spark: Any, redis_url: str) -> None:
    import sql_ext
    from keyed_async_wait.spark.compat import pyspark_version

    if pyspark_version() < (4, 0):
        pytest.skip("sql_ext needs pyspark 4.0 (test_sql_versions checks the refusal)")
    p = f"w{uuid.uuid4().hex[:8]}"
    write = RedisWrite(redis_url, p + ":{order_id}", fields=["seq"], version="seq")
    with pytest.raises(ConfigError, match="allow_writes=True"):
        sql_ext.install(spark, {"store": write})
    from keyed_async_wait import Chain, Step

    wrapped = Chain(Step("read", RedisLookup(redis_url, p + ":{order_id}")), Step("store", write))
    with pytest.raises(ConfigError, match="allow_writes=True"):  # however wrapped
        sql_ext.install(spark, {"store": wrapped})
    sql_ext.install(spark, {"store": write}, allow_writes=True)
    spark.createDataFrame(
        [(i, i % 3, i) for i in range(9)], "seq long, order_id long, user_id long"
    ).createOrReplaceTempView("write_orders")
    rows = _stored_through_sql(spark, "write_orders")
    assert sorted((r.seq, r.applied) for r in rows) == [(i, True) for i in range(9)]
    client = redis.Redis.from_url(redis_url)
    try:
        assert [json.loads(client.get(f"{p}:{k}")) for k in range(3)] == [{"seq": 6}, {"seq": 7}, {"seq": 8}]
    finally:
        client.close()


def _newest_per_key(redis_url: str, prefix: str, keys: int) -> list[Any]:
    client = redis.Redis.from_url(redis_url)
    try:
        return [json.loads(client.get(f"{prefix}:{k}"))["seq"] for k in range(keys)]
    finally:
        client.close()


def test_coalesced_upserts_of_a_hot_key_leave_every_row_and_the_store_at_the_newest(
    spark: Any, redis_url: str
) -> None:
    p = f"w{uuid.uuid4().hex[:8]}"
    rows = [(seq, 0 if seq % 3 else 1 + seq % 5, seq) for seq in range(600)]  # key 0: 2 in 3 rows
    df = spark.createDataFrame(rows, "seq long, order_id long, user_id long").repartition(3)
    write = RedisWrite(redis_url, p + ":{order_id}", fields=["seq"], version="seq", coalesce=True)
    metrics = AsyncWaitMetrics(spark)
    out = AsyncDataStream.key_ordered_wait(df, write, "order_id", order_by="seq", metrics=metrics).collect()
    assert sorted(r.seq for r in out) == list(range(600))
    outcomes = {r.seq: r.outcome for r in out}
    assert set(outcomes.values()) <= {"applied", "superseded"}  # never stale: sent newest-last
    assert all(r.applied == (r.outcome == "applied") for r in out)
    superseded = sum(o == "superseded" for o in outcomes.values())
    assert superseded > 0 and metrics.value["writes_superseded"] == superseded
    assert metrics.value["writes_applied"] == 600 - superseded
    newest = [max(seq for seq, k, _ in rows if k == key) for key in range(6)]
    assert all(outcomes[seq] == "applied" for seq in newest)  # a key's newest is always sent
    assert _newest_per_key(redis_url, p, 6) == newest


def test_sql_coalesces_a_write_that_asks_for_it(spark: Any, redis_url: str) -> None:
    import sql_ext
    from keyed_async_wait.spark.compat import pyspark_version

    if pyspark_version() < (4, 0):
        pytest.skip("sql_ext needs pyspark 4.0 (test_sql_versions checks the refusal)")
    p = f"w{uuid.uuid4().hex[:8]}"
    write = RedisWrite(redis_url, p + ":{order_id}", fields=["seq"], version="seq", coalesce=True)
    sql_ext.install(spark, {"store": write}, allow_writes=True)
    spark.createDataFrame(
        [(i, i % 2, i) for i in range(300)], "seq long, order_id long, user_id long"
    ).createOrReplaceTempView("coalesce_orders")
    rows = _stored_through_sql(spark, "coalesce_orders")
    outcomes = {r.seq: r.outcome for r in rows}
    assert sorted(outcomes) == list(range(300))
    assert "superseded" in outcomes.values() and outcomes[298] == outcomes[299] == "applied"
    assert _newest_per_key(redis_url, p, 2) == [298, 299]


def _stored_through_sql(spark: Any, view: str) -> list[Any]:
    """The rows of the key-ordered table function running ``store`` over ``view``."""
    spark.sql("SET `spark.sql.exec.async-lookup.output-mode`=ALLOW_UNORDERED")
    spark.sql("SET `spark.sql.exec.async-lookup.key-ordered-enabled`=true")
    try:
        return spark.sql(
            f"SELECT * FROM async_lookup(TABLE({view}), 'store', upsert_key => 'order_id', order_by => 'seq')"
        ).collect()
    finally:
        spark.sql("RESET `spark.sql.exec.async-lookup.output-mode`")
        spark.sql("RESET `spark.sql.exec.async-lookup.key-ordered-enabled`")

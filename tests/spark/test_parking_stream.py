"""key_ordered_stream: parked rows as keyed state across micro-batches, under faults.

Real local[2] Spark, the project's HTTP service on loopback, real processes for the crash."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from keyed_async_wait import AsyncDataStream, ConfigError, RetryStrategy
from keyed_async_wait.core.parking import DeferPolicy
from lookup import Field, HttpLookup

from ..processes import run_bounded
from .calls import per_key_calls

pytestmark = pytest.mark.spark

SCHEMA = "seq long, order_id long, user_id long"


def write_updates(folder: Path, rows: list[tuple[int, int, int]], files: int = 1) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        with open(folder / f"part-{f}.json", "w") as out:
            for seq, order_id, user_id in rows[f::files]:
                out.write(json.dumps({"seq": seq, "order_id": order_id, "user_id": user_id}) + "\n")


def logged_users(url: str) -> HttpLookup:
    return HttpLookup(
        url + "/users/{user_id}", params={"order": "{order_id}", "seq": "{seq}"}, fields=[Field("name")]
    )


def calls_keep_key_order(calls: list[Any]) -> bool:
    """Per order id, calls never overlap and start in seq order (retries of one seq allowed)."""
    return all(
        b[0] >= a[1] and b[2] >= a[2]
        for spans in per_key_calls(calls).values()
        for a, b in itertools.pairwise(spans)
    )


def updates_stream(spark: Any, url: str, work: Path, sink: Any, **options: Any) -> Any:
    """``key_ordered_stream`` of the updates in ``work/in`` (a file a micro-batch) through
    :func:`logged_users`, keyed by order in ``seq`` order, its checkpoint in ``work/cp``."""
    return AsyncDataStream.key_ordered_stream(
        spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(work / "in")),
        logged_users(url),
        "order_id",
        order_by="seq",
        sink=sink,
        checkpoint_location=str(work / "cp"),
        **options,
    )


def capped_stream(spark: Any, work: Path, fn: Any, sink: Any, **options: Any) -> Any:
    """``key_ordered_stream`` of the updates in ``work/in`` through ``fn`` (giving ``v``),
    keyed by order in ``seq`` order, with a time cap of 10 ms and a heartbeat."""
    return AsyncDataStream.key_ordered_stream(
        spark.readStream.schema(SCHEMA).json(str(work / "in")),
        fn,
        "order_id",
        order_by="seq",
        output_schema="v bigint",
        sink=sink,
        checkpoint_location=str(work / "cp"),
        time_cap=0.01,
        heartbeat=1,
        **options,
    )


def run_until(stream: Any, done: Any, trigger: str, bound: float) -> None:
    """``stream`` started at ``trigger`` until ``done(reports)`` (within ``bound`` s), then stopped."""
    query = stream.start(processingTime=trigger)
    try:
        assert stream.wait_until(done, bound)
    finally:
        query.stop()


class Sink:
    """An idempotent sink: per batch id, the rows (a re-run replaces them)."""

    def __init__(self) -> None:
        self.batches: dict[int, list[Any]] = {}

    def __call__(self, df: Any, batch_id: int) -> None:
        self.batches[batch_id] = df.collect()

    def rows(self) -> list[Any]:
        return [row for batch_id in sorted(self.batches) for row in self.batches[batch_id]]

    def per_key(self) -> dict[int, list[int]]:
        seqs: dict[int, list[int]] = defaultdict(list)
        for row in self.rows():
            seqs[row.order_id].append(row.seq)
        return seqs


def test_a_time_cap_far_below_the_latency_still_progresses_every_micro_batch(
    spark: Any, service: Any, tmp_path: Path
) -> None:
    url, state = service
    state.latency, state.record_calls = 0.2, True
    rows = [(seq, seq % 20, seq % 20) for seq in range(120)]
    write_updates(tmp_path / "in", rows)
    sink = Sink()
    # a time cap of a tenth of one lookup
    stream = updates_stream(spark, url, tmp_path, sink, time_cap=0.02, heartbeat=1, timeout=10.0)
    run_until(stream, lambda r: sum(x.rows_out for x in r) >= 120 and r[-1].parked == 0, "0.2 seconds", 150)
    reports = [r for r in stream.reports if r.rows_in or r.replayed]
    assert len(reports) >= 5  # it did take several micro-batches (6 here: a row of each key in each)
    assert all(r.rows_out > 0 for r in reports)  # and each made progress
    assert sorted(r.seq for r in sink.rows()) == list(range(120))  # nothing lost or repeated
    assert all(seqs == sorted(seqs) for seqs in sink.per_key().values())
    assert calls_keep_key_order(state.calls)


@pytest.mark.parametrize(
    "failures", [{"error_column": "_error"}, {"defer": DeferPolicy()}], ids=["error_column", "defer"]
)
def test_a_result_that_does_not_fit_is_an_error_row_of_the_stream_never_a_parked_retry(
    spark: Any, tmp_path: Path, failures: dict[str, Any]
) -> None:
    """A misfit is the service's answer, not an outage: retrying later cannot change it, so it
    is an error row at once (with ``defer`` too), and its key's later rows go on in order, also
    for rows that were parked by the time cap and finished in a later micro-batch."""

    async def fn(record: dict[str, Any]) -> dict[str, Any]:
        if record["seq"] % 10 == 0:
            await asyncio.sleep(0.05)  # far past the time cap: parked, finished in a later batch
        return {"v": 5.7 if record["seq"] % 7 == 0 else record["seq"]}

    rows = [(seq, seq % 6, seq % 6) for seq in range(60)]
    write_updates(tmp_path / "in", rows, files=3)
    sink = Sink()
    stream = capped_stream(spark, tmp_path, fn, sink, **failures)
    last = stream.run_available_now(drain_timeout=60)
    assert last is not None and last.parked == 0
    out = sink.rows()
    assert sorted(r.seq for r in out) == list(range(60))  # every row once, none dropped
    for r in out:
        if r.seq % 7 == 0:
            assert r.v is None and r._error.error_type == "ResultSchemaError", r
            assert "cannot hold 5.7" in r._error.error_message
            assert r._error.attempts == 1  # not retried: an answer that does not fit stays so
        else:
            assert r.v == r.seq and r._error is None, r
    assert all(seqs == sorted(seqs) for seqs in sink.per_key().values())
    assert any(r.seq % 10 == 0 and r.seq % 7 == 0 for r in out)  # a parked misfit was among them


def test_defer_parks_keys_through_an_outage_and_finishes_them_in_order(
    spark: Any, service: Any, tmp_path: Path
) -> None:
    """The outage lasts until the other keys are through and the two keys' rows were replayed
    and parked again twice (two deferrals, each after its retries), not for a set time."""
    url, state = service
    state.latency, state.record_calls = 0.01, True
    state.down_ids = {"3", "7"}  # the shard behind users 3 and 7 answers 503
    rows = [(seq, seq % 10, seq % 10) for seq in range(200)]
    write_updates(tmp_path / "in", rows)
    sink = Sink()
    stream = AsyncDataStream.key_ordered_stream(
        spark.readStream.schema(SCHEMA).json(str(tmp_path / "in")),
        logged_users(url),
        "order_id",
        order_by="seq",
        sink=sink,
        checkpoint_location=str(tmp_path / "cp"),
        defer=DeferPolicy(delay=1.0, max_delay=2.0),
        heartbeat=1,
        timeout=10.0,
        retry=RetryStrategy.fixed_delay(2, 0.05),
    )
    query = stream.start(processingTime="0.5 seconds")
    try:
        others = 160

        def others_done_and_parked_twice(reports: list[Any]) -> bool:
            done = sum(1 for r in sink.rows() if r.order_id not in (3, 7))
            return done >= others and sum(1 for r in reports if r.replayed and r.parked == 40) >= 2

        assert stream.wait_until(others_done_and_parked_twice, 90)
        # the other keys went through while the outage lasted; the two keys are parked whole
        assert stream.parked == 40
        assert not any(r.order_id in (3, 7) for r in sink.rows())
        state.down_ids.clear()  # the shard is back
        assert stream.wait_until(lambda r: sum(x.rows_out for x in r) >= 200 and r[-1].parked == 0, 120)
    finally:
        query.stop()
    assert sorted(r.seq for r in sink.rows()) == list(range(200))
    assert all(r.name == f"user-{r.user_id}" and r._error is None for r in sink.rows())
    assert all(seqs == sorted(seqs) for seqs in sink.per_key().values())
    assert calls_keep_key_order(state.calls)


@pytest.mark.compat_once
@pytest.mark.compat(
    "streaming: SIGKILL mid-micro-batch, restarted at another parallelism on the newest pyspark"
)
def test_killed_driver_restarted_with_other_partitions_loses_and_repeats_nothing(
    service: Any, tmp_path: Path
) -> None:
    """In the compatibility tier the restart runs on the newest pyspark (KAW_NEWEST_PYTHON): a
    checkpoint with parked state written by an older Spark is read by the newest."""
    url, state = service
    state.latency, state.jitter, state.record_calls = 0.15, 0.15, True
    rows = [(seq, seq % 20, seq % 20) for seq in range(400)]
    write_updates(tmp_path / "in", rows, files=4)
    job = Path(__file__).with_name("parking_job.py")
    args = [
        sys.executable, str(job), "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"),
        "--checkpoint", str(tmp_path / "cp"), "--url", url, "--expect", "400",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}

    first = subprocess.Popen(
        [*args, "--partitions", "3"], stdout=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    lines: queue.Queue[str] = queue.Queue()
    assert first.stdout is not None
    reader = threading.Thread(target=lambda: [lines.put(line) for line in first.stdout], daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        while True:  # the first micro-batch with results has committed
            line = lines.get(timeout=180)
            if line.startswith("batch") and " out 0 " not in line:
                break
        state.started.clear()
        assert state.started.wait(60)  # the next micro-batch has lookups in flight
        os.killpg(first.pid, signal.SIGKILL)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        first.wait(60)
        reader.join(30)
        first.stdout.close()
    assert first.returncode == -signal.SIGKILL

    newest = os.environ.get("KAW_NEWEST_PYTHON", sys.executable)
    second = run_bounded([newest, *args[1:], "--partitions", "5"], env=env, timeout=300)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-3000:]

    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "out").to_pylist()
    assert sorted(r["seq"] for r in table) == list(range(400))  # every input row exactly once
    per_key: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for r in table:
        per_key[r["order_id"]].append((r["batch_id"], r["pos"], r["seq"]))
    for key, seen in per_key.items():
        seqs = [seq for _, _, seq in sorted(seen)]
        assert seqs == sorted(seqs), f"order {key}: output order {seqs}"


def test_key_ordered_stream_checks_its_options(spark: Any, service: Any, tmp_path: Path) -> None:
    url, _ = service
    batch = spark.createDataFrame([(1, 1, 1)], SCHEMA)
    stream = spark.readStream.schema(SCHEMA).json(str(tmp_path))
    common = {"sink": lambda df, i: None, "checkpoint_location": str(tmp_path / "cp")}
    with pytest.raises(ConfigError, match="a streaming DataFrame"):
        AsyncDataStream.key_ordered_stream(batch, logged_users(url), "order_id", **common)
    with pytest.raises(ConfigError, match="time_cap=0"):
        AsyncDataStream.key_ordered_stream(stream, logged_users(url), "order_id", time_cap=0, **common)
    with pytest.raises(ConfigError, match=r"defer=1 .*a DeferPolicy"):
        AsyncDataStream.key_ordered_stream(stream, logged_users(url), "order_id", defer=1, **common)
    with pytest.raises(ConfigError, match="missing"):
        AsyncDataStream.key_ordered_stream(stream, logged_users(url), "nope", **common)
    with pytest.raises(ConfigError, match=r"assume_partitioned='yes' .*True or False"):
        AsyncDataStream.key_ordered_stream(
            stream, logged_users(url), "order_id", assume_partitioned="yes", **common
        )
    mapped = spark.readStream.schema("order_id map<string,int>, seq long").json(str(tmp_path))
    with pytest.raises(ConfigError, match=r"key column 'order_id'='map<string,int>' .*compares no MAP"):
        AsyncDataStream.key_ordered_stream(mapped, logged_users(url), "order_id", **common)


@pytest.mark.compat("streaming: the sink plans with the session's own settings")
def test_the_sink_plans_with_the_users_code_generation_and_adaptive_settings(
    spark: Any, service: Any, tmp_path: Path
) -> None:
    """The state's own plans run without whole-stage code generation, and the lookups of a
    micro-batch with nothing parked without adaptive execution (one Spark job, not one per
    stage); one that replays parked rows plans its lookups adaptively, as the session says.
    The user's sink sees the session's settings as Spark gives any ``foreachBatch`` function
    (as the user left them; before pyspark 4.1 Spark itself turns adaptive execution off in a
    stream's micro-batches, measured on 4.0.5 with a plain ``foreachBatch``), during every
    micro-batch, and the session has them back after the stream."""
    from keyed_async_wait.spark.compat import pyspark_version

    adaptive_in_streams = pyspark_version() >= (4, 1)
    url, state = service
    state.latency = 0.2
    keys = {"spark.sql.codegen.wholeStage": "true", "spark.sql.adaptive.enabled": "true"}
    rows = [(seq, seq % 5, seq % 5) for seq in range(40)]
    write_updates(tmp_path / "in", rows, files=2)
    seen: list[tuple[str, ...]] = []
    adaptive: dict[int, bool] = {}
    sink = Sink()

    def recording(df: Any, batch_id: int) -> None:
        seen.append(tuple(df.sparkSession.conf.get(key) for key in keys))
        adaptive[batch_id] = "AdaptiveSparkPlan" in df._jdf.queryExecution().executedPlan().toString()
        sink(df, batch_id)

    before = {key: spark.conf.get(key) for key in keys}
    for key, value in keys.items():
        spark.conf.set(key, value)
    try:
        # a time cap of a quarter of a lookup: rows park and are read back from the state
        stream = updates_stream(spark, url, tmp_path, recording, time_cap=0.05, heartbeat=1, timeout=10.0)
        run_until(
            stream, lambda r: sum(x.rows_out for x in r) >= 40 and r[-1].parked == 0, "0.2 seconds", 150
        )
        assert [spark.conf.get(key) for key in keys] == ["true", "true"]
    finally:
        for key, value in before.items():
            spark.conf.set(key, value)
    assert any(r.replayed for r in stream.reports)  # the state's plans ran
    assert seen and set(seen) == {("true", "true" if adaptive_in_streams else "false")}
    first = min(r.batch_id for r in stream.reports if r.rows_in)
    assert adaptive[first] is False  # nothing parked yet
    replaying = [adaptive[r.batch_id] for r in stream.reports if r.replayed]
    assert all(replaying) if adaptive_in_streams else not any(replaying)
    assert sorted(r.seq for r in sink.rows()) == list(range(40))


def test_a_source_partitioned_by_key_runs_where_it_is_and_parked_rows_still_go_by_key(
    spark: Any, service: Any, tmp_path: Path
) -> None:
    """``assume_partitioned``: a micro-batch with nothing parked runs its rows in the source's
    partitions (no shuffle before the lookups); one that replays parked rows repartitions them
    by key as always. Every row once, per key in order, never two calls of a key at once."""
    url, state = service
    state.latency, state.record_calls = 0.2, True
    rows = [(seq, seq % 8, seq % 8) for seq in range(40)]
    folder = tmp_path / "in"
    folder.mkdir()
    for parity in (0, 1):  # one file per partition, each with the keys of one parity
        with open(folder / f"part-{parity}.json", "w") as out:
            for seq, order_id, user_id in rows:
                if order_id % 2 == parity:
                    out.write(json.dumps({"seq": seq, "order_id": order_id, "user_id": user_id}) + "\n")
    sink, shuffled = Sink(), {}

    def recording(df: Any, batch_id: int) -> None:
        shuffled[batch_id] = "Exchange" in df._jdf.queryExecution().executedPlan().toString()
        sink(df, batch_id)

    stream = AsyncDataStream.key_ordered_stream(
        spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 2).json(str(folder)),
        logged_users(url),
        "order_id",
        order_by="seq",
        sink=recording,
        checkpoint_location=str(tmp_path / "cp"),
        assume_partitioned=True,
        time_cap=0.05,  # a quarter of a lookup: rows park and are replayed
        heartbeat=1,
        timeout=10.0,
    )
    run_until(stream, lambda r: sum(x.rows_out for x in r) >= 40 and r[-1].parked == 0, "0.2 seconds", 150)
    first = min(r.batch_id for r in stream.reports if r.rows_in)
    assert shuffled[first] is False  # nothing parked yet: the rows stayed where they were
    replaying = [r.batch_id for r in stream.reports if r.replayed]
    assert replaying and all(shuffled[b] for b in replaying)
    assert sorted(r.seq for r in sink.rows()) == list(range(40))
    assert all(seqs == sorted(seqs) for seqs in sink.per_key().values())
    assert calls_keep_key_order(state.calls)


@pytest.mark.compat("streaming: assume_partitioned checked")
def test_a_source_not_partitioned_by_key_fails_the_micro_batch_and_a_restart_without_the_option_runs_it(
    spark: Any, service: Any, tmp_path: Path
) -> None:
    """``assume_partitioned=True`` over a source whose partitions each hold rows of every key:
    the micro-batch fails naming a key, its partitions and the option, nothing of it is
    committed, and the same checkpoint run without the option gives every row, in key order."""
    url, state = service
    state.latency, state.record_calls = 0.02, True
    # two files, every key in both (seq 2k in one, 2k + 1 in the other)
    write_updates(tmp_path / "in", [(seq, seq // 2 % 8, seq // 2 % 8) for seq in range(40)], files=2)
    source = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 2).json(str(tmp_path / "in"))
    options = {"order_by": "seq", "checkpoint_location": str(tmp_path / "cp"), "timeout": 10.0}
    sink = Sink()
    wrong = AsyncDataStream.key_ordered_stream(
        source, logged_users(url), "order_id", sink=sink, assume_partitioned=True, **options
    )
    query = wrong.start(processingTime="0.2 seconds")
    try:
        pattern = r"assume_partitioned=True .*micro-batch 0 .*key \d in partitions \[0, 1\]"
        with pytest.raises(ConfigError, match=pattern):
            wrong.wait_until(lambda reports: False, 60)
    finally:
        query.stop()
    assert wrong.reports == []  # not committed
    state.calls.clear()
    sink = Sink()
    right = AsyncDataStream.key_ordered_stream(source, logged_users(url), "order_id", sink=sink, **options)
    run_until(right, lambda r: sum(x.rows_out for x in r) >= 40, "0.2 seconds", 120)
    assert right.reports[0].batch_id == 0  # the failed micro-batch ran again
    assert sorted(r.seq for r in sink.rows()) == list(range(40))
    assert all(seqs == sorted(seqs) for seqs in sink.per_key().values())
    assert calls_keep_key_order(state.calls)


@pytest.mark.parametrize("assume_partitioned", [False, True])
def test_a_sink_that_reads_part_of_its_micro_batch_loses_no_parked_row(
    spark: Any, tmp_path: Path, assume_partitioned: bool
) -> None:
    """The first micro-batch's sink reads one row (``limit``): by key, that is its first
    partition, the fast keys', alone, so the task of the slow keys, whose rows the time cap
    parks, never runs for it; their parked rows are still kept and finish later, in key order
    (the counts are taken again from the whole output when a task did not report them). In
    place, the file's one partition is computed whole (Spark caches a partition whole), and
    its counts stand. Either way every row not finished in the first micro-batch comes later,
    once."""
    placed = spark.createDataFrame([(k,) for k in range(6)], "order_id long").repartition(2, "order_id")
    slow = {r.order_id for r in placed.selectExpr("order_id", "spark_partition_id() AS p").collect() if r.p}
    assert slow and len(slow) < 6, slow  # both partitions hold keys (hash of 0..5 into 2)

    async def fn(record: dict[str, Any]) -> dict[str, Any]:
        if record["order_id"] in slow:
            await asyncio.sleep(0.05)  # far past the time cap: each slow key's first row
        return {"v": record["seq"]}  # runs over it, and the key's later rows are parked

    rows = [(seq, seq % 6, seq % 6) for seq in range(60)]
    write_updates(tmp_path / "in", rows)
    sink = Sink()

    def partial_first(df: Any, batch_id: int) -> None:
        sink.batches[batch_id] = df.limit(1).collect() if batch_id == 0 else df.collect()

    stream = capped_stream(spark, tmp_path, fn, partial_first, assume_partitioned=assume_partitioned)
    last = stream.run_available_now(drain_timeout=60)
    assert last is not None and last.parked == 0
    assert stream.reports[0].parked > 0, stream.reports[0]
    firsts = {min(seq for seq, key, _ in rows if key == k) for k in slow}  # finished in batch 0
    later = sorted(r.seq for b, out in sink.batches.items() if b > 0 for r in out)
    assert len(later) == len(set(later)) == len(rows) - stream.reports[0].rows_out, later
    parked = {seq for seq, key, _ in rows if key in slow and seq not in firsts}
    assert parked <= set(later), sorted(parked - set(later))
    assert all(seqs == sorted(seqs) for seqs in sink.per_key().values())

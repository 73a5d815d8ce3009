"""Parked state you can trust: damaged or missing versions are named before anything runs, there
is a tested way out, nothing is deleted early, memory stays bounded, and a backlog that stays
parked is not copied every micro-batch.

The crash scenarios run the streaming job in processes of their own (SIGKILL, then a restart);
every wait is bounded."""

from __future__ import annotations

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

from keyed_async_wait import AsyncDataStream, ConfigError
from keyed_async_wait.app import state_tool
from keyed_async_wait.core.parking import DeferPolicy

from ..processes import group, run_bounded
from .test_parking_stream import SCHEMA, Sink, logged_users, updates_stream, write_updates

pytestmark = pytest.mark.spark

WIDE = "repeat('x', 400) AS note"  # rows of a realistic width (about half a KiB)

ROOT = Path(__file__).parents[2]
JOB = Path(__file__).with_name("parking_job.py")


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _job_args(tmp_path: Path, url: str, rows: int) -> list[str]:
    return [
        sys.executable, str(JOB), "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"),
        "--checkpoint", str(tmp_path / "cp"), "--url", url, "--expect", str(rows), "--time-cap", "0.2",
    ]  # fmt: skip


def _run_and_kill(args: list[str], parked_batches: int) -> None:
    """Run the job until ``parked_batches`` micro-batches reported parked rows and one more
    began reporting (so the last of them committed), then SIGKILL it (and its whole process
    group: Spark's JVM and workers with it)."""
    with group(args, stdout=subprocess.PIPE, text=True, env=_env()) as proc:
        lines: queue.Queue[str] = queue.Queue()
        assert proc.stdout is not None
        stdout = proc.stdout
        reader = threading.Thread(target=lambda: [lines.put(line) for line in stdout], daemon=True)
        reader.start()
        seen = 0
        while seen <= parked_batches:
            line = lines.get(timeout=180)
            if line.startswith("batch") and (seen or not line.rstrip().endswith(" parked 0")):
                seen += 1
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(60)
        reader.join(30)


def _last_committed(checkpoint: Path) -> int:
    return max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())


def _manifest(checkpoint: Path, batch: int) -> tuple[Path, dict[str, Any]]:
    init = json.loads(_text(checkpoint / "async_state" / "init"))
    slot = checkpoint / "async_state" / "manifest" / f"{batch % (init['window'] + init['keep']):04d}"
    return slot, json.loads(_text(slot))


def _text(folder: Path) -> str:
    return "".join(p.read_text() for p in sorted(folder.glob("part-*")))


def _sink_rows(out: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return pq.read_table(out).to_pylist() if out.exists() else []


def _exactly_once_in_order(out: Path, rows: int, lost: set[int] = frozenset()) -> None:  # type: ignore[assignment]
    table = _sink_rows(out)
    assert sorted(r["seq"] for r in table) == sorted(set(range(rows)) - lost)
    per_key: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for r in table:
        per_key[r["order_id"]].append((r["batch_id"], r["pos"], r["seq"]))
    for key, seen in per_key.items():
        seqs = [seq for _, _, seq in sorted(seen)]
        assert seqs == sorted(seqs), f"order {key}: {seqs}"


def _tool(*args: str) -> subprocess.CompletedProcess[str]:
    """``kaw-state`` as a user runs it: a process (and a Spark session) of its own."""
    return run_bounded(
        [sys.executable, "-m", "keyed_async_wait.app.state_tool", *args], timeout=180, env=_env()
    )


def _tool_here(spark: Any, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """The same commands on the tests' session (a JVM start saved per call): (exit code, what
    it printed)."""
    capsys.readouterr()
    code = state_tool.run(spark, list(args))
    return code, capsys.readouterr().out


def test_a_missing_part_file_is_named_before_anything_runs_and_rewind_recovers(
    spark: Any, service: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, state = service
    state.latency, state.jitter = 0.05, 0.05
    rows = [(seq, seq % 20, seq % 20) for seq in range(200)]
    write_updates(tmp_path / "in", rows, files=4)
    args = _job_args(tmp_path, url, 200)
    _run_and_kill([*args, "--partitions", "3"], parked_batches=2)
    checkpoint = tmp_path / "cp"
    last = _last_committed(checkpoint)
    _, manifest = _manifest(checkpoint, last)
    assert manifest["rows"] > 0 and manifest["segments"]
    seg = manifest["segments"][-1]  # the segment only this version has: version last - 1 stays whole
    assert seg["batch"] == last
    init = json.loads(_text(checkpoint / "async_state" / "init"))
    folder = checkpoint / "async_state" / "seg" / f"{seg['batch'] % (init['window'] + init['keep']):04d}"
    (folder / seg["files"][0][0]).unlink()  # one part file of the version the restart reads
    outputs_before = (
        sorted(p.name for p in (tmp_path / "out").iterdir()) if (tmp_path / "out").exists() else []
    )
    calls_before = state.requests

    failed = run_bounded([*args, "--partitions", "5"], timeout=300, env=_env())
    assert failed.returncode != 0
    assert (
        "StateError" in failed.stderr
        and f"{seg['files'][0][0]} of version {last} is missing" in failed.stderr
    )
    assert f"micro-batch {last + 1}" in failed.stderr and str(folder) in failed.stderr
    assert state.requests == calls_before  # no lookup ran
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == outputs_before  # no sink call

    verify = _tool("verify", str(checkpoint))
    assert verify.returncode == 1 and f"version {last}: DAMAGED" in verify.stdout, (
        verify.stdout + verify.stderr
    )
    code, dry = _tool_here(spark, capsys, "rewind", str(checkpoint), "--to", str(last - 1))
    assert code == 0 and "nothing changed" in dry and "run again from the source" in dry, dry
    code, done = _tool_here(spark, capsys, "rewind", str(checkpoint), "--to", str(last - 1), "--yes")
    assert code == 0 and "done: start the query again" in done, done

    again = run_bounded([*args, "--partitions", "5"], timeout=300, env=_env())
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    _exactly_once_in_order(tmp_path / "out", 200)


def test_a_crash_between_the_state_write_and_sparks_commit_loses_nothing(
    service: Any, tmp_path: Path
) -> None:
    """Version n is written, the commit of n is not (removed after the kill): the re-run of n
    reads version n - 1, which nothing deleted."""
    url, state = service
    state.latency, state.jitter = 0.05, 0.05
    rows = [(seq, seq % 20, seq % 20) for seq in range(200)]
    write_updates(tmp_path / "in", rows, files=4)
    args = _job_args(tmp_path, url, 200)
    _run_and_kill([*args, "--partitions", "3"], parked_batches=2)
    checkpoint = tmp_path / "cp"
    last = _last_committed(checkpoint)
    (checkpoint / "commits" / str(last)).unlink()
    again = run_bounded([*args, "--partitions", "2"], timeout=300, env=_env())
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    _exactly_once_in_order(tmp_path / "out", 200)


# ---------------------------------------------------------------------- in one process


def _park_some(spark: Any, url: str, tmp_path: Path, rows: int = 120) -> tuple[Any, Sink]:
    """Run a stream with a tiny time cap until a micro-batch leaves rows parked; stop it."""
    write_updates(tmp_path / "in", [(seq, seq % 12, seq % 12) for seq in range(rows)])
    sink = Sink()
    stream = AsyncDataStream.key_ordered_stream(
        spark.readStream.schema(SCHEMA).json(str(tmp_path / "in")),
        logged_users(url),
        "order_id",
        order_by="seq",
        sink=sink,
        checkpoint_location=str(tmp_path / "cp"),
        time_cap=0.01,
        heartbeat=1,
        timeout=10.0,
    )
    query = stream.start(processingTime="0.5 seconds")
    try:  # three micro-batches: the first two have committed, and rows are still parked
        assert stream.wait_until(lambda r: len(r) >= 3 and r[-1].parked > 0, 120)
    finally:
        query.stop()
    return stream, sink


def _restart(spark: Any, url: str, tmp_path: Path, sink: Sink) -> Any:
    stream = AsyncDataStream.key_ordered_stream(
        spark.readStream.schema(SCHEMA).json(str(tmp_path / "in")),
        logged_users(url),
        "order_id",
        order_by="seq",
        sink=sink,
        checkpoint_location=str(tmp_path / "cp"),
        time_cap=0.01,
        heartbeat=1,
        timeout=10.0,
    )
    return stream, stream.start(processingTime="0.5 seconds")


def _failure(query: Any) -> str:
    try:
        query.awaitTermination(120)
    except Exception as exc:  # the query's own failure
        return str(exc)
    return str(query.exception())


def _parked_version(spark: Any, service: Any, tmp_path: Path) -> tuple[Sink, Path, int, dict[str, Any]]:
    """A stream stopped with rows parked: its sink, checkpoint, last committed micro-batch and
    that micro-batch's manifest."""
    url, state = service
    state.latency = 0.05
    _, sink = _park_some(spark, url, tmp_path)
    checkpoint = tmp_path / "cp"
    last = _last_committed(checkpoint)
    return sink, checkpoint, last, _manifest(checkpoint, last)[1]


def _seg_folder(checkpoint: Path, part: dict[str, Any]) -> Path:
    init = json.loads(_text(checkpoint / "async_state" / "init"))
    return checkpoint / "async_state" / "seg" / f"{part['batch'] % (init['window'] + init['keep']):04d}"


def test_a_missing_version_is_an_error_not_a_fallback_and_accept_loss_says_what_it_costs(
    spark: Any, service: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, state = service
    state.latency = 0.05
    _, sink = _park_some(spark, url, tmp_path)
    checkpoint = tmp_path / "cp"
    last = _last_committed(checkpoint)
    slot, manifest = _manifest(checkpoint, last)
    lost_rows = manifest["rows"]
    import shutil

    shutil.rmtree(slot)  # the whole version the restart reads
    delivered = len(sink.rows())
    restarted, query = _restart(spark, url, tmp_path, sink)
    message = _failure(query)
    assert f"version {last} is missing (no manifest)" in message and f"micro-batch {last + 1}" in message
    assert len(sink.rows()) == delivered
    code, dry = _tool_here(spark, capsys, "accept-loss", str(checkpoint))
    assert code == 0 and "how many is unknown" in dry and "nothing changed" in dry, dry
    code, done = _tool_here(spark, capsys, "accept-loss", str(checkpoint), "--yes")
    assert code == 0 and "done: start the query again" in done, done
    restarted, query = _restart(spark, url, tmp_path, sink)
    try:
        assert restarted.wait_until(lambda r: r[-1].parked == 0 and r[-1].rows_in == 0, 120)
    finally:
        query.stop()
    seqs = sorted(r.seq for r in sink.rows())
    assert len(seqs) == len(set(seqs)) == 120 - lost_rows  # the loss is exactly what the version held
    assert all(s == sorted(s) for s in sink.per_key().values())


@pytest.mark.compat("parked state: verified, carried, drained")
def test_a_truncated_part_file_is_named_before_any_lookup(spark: Any, service: Any, tmp_path: Path) -> None:
    url, state = service
    sink, checkpoint, last, manifest = _parked_version(spark, service, tmp_path)
    seg = manifest["segments"][0]
    part = _seg_folder(checkpoint, seg) / seg["files"][0][0]
    part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])
    calls, delivered = state.requests, len(sink.rows())
    _, query = _restart(spark, url, tmp_path, sink)
    message = _failure(query)
    assert "StateError" in message or "parked state at" in message
    assert f"version {last} cannot be read" in message and "kaw-state" in message
    assert state.requests == calls and len(sink.rows()) == delivered


def test_a_part_file_rewritten_whole_but_changed_is_named_before_any_lookup(
    spark: Any, service: Any, tmp_path: Path
) -> None:
    import pyarrow.parquet as pq

    url, state = service
    sink, checkpoint, last, manifest = _parked_version(spark, service, tmp_path)
    seg = manifest["segments"][-1]
    folder = _seg_folder(checkpoint, seg)
    # the manifest holds what the write counted: its rows, and its files' sizes as on disk
    assert seg["sized"] and seg["rows"] == pq.read_table(folder).num_rows
    assert {name: (folder / name).stat().st_size for name, _ in seg["files"]} == dict(seg["files"])
    name = seg["files"][0][0]
    table = pq.read_table(folder / name)
    pq.write_table(table, folder / name, compression="none")  # readable, the same rows, not the file written
    (folder / f".{name}.crc").unlink(missing_ok=True)  # (Hadoop's checksum of the file written)
    calls, delivered = state.requests, len(sink.rows())
    _, query = _restart(spark, url, tmp_path, sink)
    message = _failure(query)
    assert f"{name} of version {last} holds" in message and "bytes, not the" in message, message
    assert state.requests == calls and len(sink.rows()) == delivered


def test_keep_versions_below_two_is_refused_with_the_reason(spark: Any, tmp_path: Path) -> None:
    stream = spark.readStream.schema(SCHEMA).json(str(tmp_path))

    async def fn(row: dict) -> dict:
        return {"x": 1}

    with pytest.raises(ConfigError, match=r"keep_versions=1 .*>= 2.*crash between writing version n"):
        AsyncDataStream.key_ordered_stream(
            stream, fn, "order_id", sink=lambda df, i: None, checkpoint_location=str(tmp_path / "cp"),
            output_schema="x int", keep_versions=1,
        )  # fmt: skip


@pytest.mark.compat("parked state: verified, carried, drained")
def test_a_deferred_backlog_is_carried_not_rewritten_and_drains_after(
    spark: Any, service: Any, tmp_path: Path
) -> None:
    url, state = service
    state.latency = 0.01
    state.down_ids = {str(k) for k in range(10)}  # most keys' shard is down
    write_updates(tmp_path / "in", [(seq, seq % 12, seq % 12) for seq in range(240)])
    sink = Sink()
    stream = AsyncDataStream.key_ordered_stream(
        spark.readStream.schema(SCHEMA).json(str(tmp_path / "in")),
        logged_users(url),
        "order_id",
        order_by="seq",
        sink=sink,
        checkpoint_location=str(tmp_path / "cp"),
        defer=DeferPolicy(delay=3600.0),  # not due again within this test, until healed below
        heartbeat=1,
        timeout=10.0,
    )
    query = stream.start(processingTime="0.5 seconds")
    try:
        assert stream.wait_until(lambda r: len(r) >= 4 and r[-1].parked == 200, 120)
        quiet = stream.reports[-3:]  # heartbeat micro-batches while the backlog waits
        assert all(r.carried == 200 and r.replayed == 0 and r.written == 0 for r in quiet), quiet
    finally:
        query.stop()
    assert sorted({r.order_id for r in sink.rows()}) == [10, 11]


@pytest.mark.compat("parked state: verified, carried, drained")
def test_the_parked_state_follows_the_lookups_partitions_not_the_shuffle_partitions(
    spark: Any, service: Any, tmp_path: Path
) -> None:
    """At many shuffle partitions (200 by Spark's default) every part is still written as at
    most one file per lookup partition: the state's steps (due keys, carried keys, the rows
    parked behind them, the keys taken out) run at the lookups' partition count."""
    url, state = service
    state.latency = 0.02
    state.down_ids = {"3", "7"}  # deferred, not due again here: carried while others replay
    write_updates(tmp_path / "in", [(seq, seq % 12, seq % 12) for seq in range(120)], files=4)
    sink = Sink()
    shuffle_partitions = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "40")  # the stream's session copies it at start
    try:
        stream = updates_stream(
            spark,
            url,
            tmp_path,
            sink,
            time_cap=0.1,  # other keys park too, and are replayed the next micro-batch
            defer=DeferPolicy(delay=3600.0),
            heartbeat=1,
            timeout=10.0,
            num_partitions=2,
        )
        query = stream.start(processingTime="0.5 seconds")
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", shuffle_partitions)
    try:
        assert stream.wait_until(lambda r: sum(x.rows_out for x in r) >= 100 and r[-1].parked == 20, 120)
    finally:
        query.stop()
    state_dir = tmp_path / "cp" / "async_state"
    parts = {kind: [d for d in (state_dir / kind).iterdir() if d.is_dir()] for kind in ("seg", "rm")}
    assert parts["seg"] and parts["rm"], parts  # rows parked behind carried keys, keys taken out
    files = {str(d): len(list(d.glob("*.parquet"))) for folder in parts.values() for d in folder}
    assert all(1 <= n <= 2 for n in files.values()), files
    assert sorted({r.order_id for r in sink.rows()}) == [k for k in range(12) if k not in (3, 7)]


@pytest.mark.compat("parked state: verified, carried, drained")
def test_available_now_reports_what_stays_parked_or_drains_it(
    spark: Any, service: Any, tmp_path: Path, caplog: Any
) -> None:
    url, state = service
    state.latency = 0.05
    write_updates(tmp_path / "in", [(seq, seq % 12, seq % 12) for seq in range(120)])

    def stream_of(sink: Sink, heartbeat: float | None) -> Any:
        return AsyncDataStream.key_ordered_stream(
            spark.readStream.schema(SCHEMA).json(str(tmp_path / "in")),
            logged_users(url),
            "order_id",
            order_by="seq",
            sink=sink,
            checkpoint_location=str(tmp_path / "cp"),
            time_cap=0.01,
            heartbeat=heartbeat,
            timeout=10.0,
        )

    sink = Sink()
    with pytest.raises(ConfigError, match="drain_timeout"):
        stream_of(sink, None).run_available_now(drain_timeout=10)
    with caplog.at_level("WARNING", logger="keyed_async_wait.spark.stream"):
        last = stream_of(sink, 1).run_available_now()
    assert last is not None and last.parked > 0
    assert f"ended with {last.parked} rows parked" in caplog.text
    with pytest.raises(ConfigError, match=r"heartbeat=None .*a heartbeat, as when this checkpoint began"):
        stream_of(sink, None).start(availableNow=True)
    drained = stream_of(sink, 1).run_available_now(drain_timeout=120)
    assert drained is not None and drained.parked == 0
    assert sorted(r.seq for r in sink.rows()) == list(range(120))


def test_a_tasks_memory_is_flat_in_its_share_of_the_micro_batch(spark: Any, tmp_path: Path) -> None:
    """The rows of a task stream through: 200,000 rows add no more to a worker than 10,000."""

    async def echo(row: dict) -> dict:
        return {"v": row["seq"]}

    peaks = {}
    for rows in (10_000, 10_000, 200_000, 200_000):
        folder = tmp_path / f"in-{rows}-{len(peaks)}"
        spark.range(rows).selectExpr("id AS seq", "id % 5000 AS order_id", WIDE).write.parquet(str(folder))
        stream = AsyncDataStream.key_ordered_stream(
            spark.readStream.schema("seq long, order_id long, note string").parquet(str(folder)),
            echo,
            "order_id",
            order_by="seq",
            sink=lambda df, batch_id: df.write.format("noop").mode("overwrite").save(),
            checkpoint_location=str(tmp_path / f"cp-{rows}-{len(peaks)}"),
            output_schema="v long",
            num_partitions=1,  # one task takes the whole micro-batch
        )
        report = stream.run_available_now()
        assert report is not None and report.rows_out == rows
        peaks[(rows, len(peaks))] = report.peak_task_mib
    small = max(v for (rows, _), v in peaks.items() if rows == 10_000)
    large = [v for (rows, _), v in peaks.items() if rows == 200_000]
    assert min(large) <= small + 40, peaks  # before: about 1 KiB per row, 200 MiB and more
    assert max(large) < 150, peaks
    # the measurement itself: a task that holds its whole share, as the earlier store did
    assert _holding_peak_mib(spark, 200_000) > 100


def _holding_peak_mib(spark: Any, rows: int) -> float:
    def hold_all(batches: Any) -> Any:
        import pyarrow as pa

        from keyed_async_wait.spark.memory import PeakMemory

        memory = PeakMemory()
        held = [row for batch in batches for row in batch.to_pylist()]
        yield pa.RecordBatch.from_pylist([{"kib": memory.growth_kib(), "rows": len(held)}])

    df = spark.range(rows).selectExpr("id AS seq", "id % 5000 AS order_id", WIDE).repartition(1)
    (row,) = df.mapInArrow(hold_all, "kib long, rows long").collect()
    assert row.rows == rows
    return float(row.kib) / 1024

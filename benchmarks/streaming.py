"""What a key_ordered_stream costs per micro-batch, beside the batch job and a plain stream.

    ./run bench streaming [--rows N] [--per-batch 2500,25000] [--capacity C] [--batch-rounds R]
                          [--conf KEY=VALUE ...]
    ./run bench streaming --soak MINUTES [--rate R] [--soak-keys K] [--soak-hot SHARE]
                          [--conf KEY=VALUE ...]

The same 20 ms ``async def`` (no service CPU at all), 2,000 keys, a parquet file source of
files of ``per-batch`` rows each read with ``maxFilesPerTrigger=1`` and ``availableNow``,
``local[2]``, two shuffle partitions and no adaptive execution (``--conf`` changes any Spark
setting, in either mode: ``--conf spark.sql.shuffle.partitions=200 --conf
spark.sql.adaptive.enabled=true`` gives Spark's defaults), Spark's ``noop`` sink. Per
micro-batch size, in one run:

- ``key_ordered_wait`` as a batch job over all N rows (N: ``--rows``, at least ten
  micro-batches' worth; rows/s: the median of ``--batch-rounds`` runs, 3 by default, after
  one that warms the Python workers up);
- a plain stream: the same source into ``foreachBatch`` writing the rows to ``noop`` (Spark's
  own cost per micro-batch);
- ``key_ordered_stream`` with nothing parked (the common case);
- the same over a source whose files hold each micro-batch's rows already split by Spark's
  hash of the key (one file a task slot, read together), with ``assume_partitioned=True``:
  no shuffle before the lookups (as a Kafka topic partitioned by the key can run).

For the streams: sustained rows/s and the median seconds per micro-batch (Spark's
``triggerExecution``: planning, the micro-batch, its commit), over every micro-batch after the
first two (warm-up), and the floor the lookups alone set (rows over the tasks' capacity, times
20 ms). For ``key_ordered_stream``, where a micro-batch's seconds go: Spark's own work (its
``triggerExecution`` but for ``addBatch``, the ``foreachBatch`` function), our function, and
of it the sink (the lookups' Spark job and its planning); and the bound Spark's own work and
the fullest task's floor set together (the keys' split over the tasks, one per task slot, is
measured on the source). And where the stream's process tree spent its CPU, per micro-batch:
the JVM's threads grouped by their name (garbage collection, the JIT compilers, task threads, the stream's own
thread, Spark's scheduler, the rest; read from ``/proc``), the Python workers, the driver,
and the classes Spark's code generation compiled (a plan whose code it had not seen).

``--soak``: a long stream instead, as one runs in production: the rate source at R rows/s
(default 6,000) over K keys (default 200,000), an ``async def`` of 5 ms of which 1% of calls
fail into deferral (retried 5 s later, then 10 s, ...), ``time_cap=2``, ``heartbeat=1``, a 1 s
trigger, Spark's default driver heap (``spark.driver.memory``, 1 GB: in local mode the whole
job's heap); ``--conf`` sets any Spark setting for it; ``--soak-hot SHARE`` sends that share of
the rows to one key (skew: a key's rows run one at a time, so its rows wait behind each other).
Printed per minute: rows in and out per second (from the stream's reports), the micro-batches'
seconds (median and largest), rows parked, the JVM's CPU split with GC and JIT as a share of
it, and the classes generated; at the end the whole run's CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

import psutil
from pyspark.sql import DataFrame, SparkSession

from keyed_async_wait import AsyncDataStream
from keyed_async_wait.spark.session import key_partitions

sys.path.insert(0, os.path.dirname(__file__))
from cpu_meter import worker_cpu
from spark_throughput import calibration, largest_share, local_spark

KEYS = 2_000
SCHEMA = "seq long, order_id long"
DELAY = 0.02
WARM_UP = 2  # micro-batches left out of the figures
MEASURED = 8  # micro-batches measured at least (a few of 25,000 rows moved the figure by 10%)
# JVM thread names (as /proc shows them: 15 characters) -> what they do
THREADS = (
    ("GC", ("GC Thread", "G1 ", "VM Thread", "VM Periodic")),
    ("JIT", ("C1 CompilerThre", "C2 CompilerThre", "Sweeper thread")),
    ("tasks", ("Executor task", "stdout writer", "writer for ", "Worker Monitor")),
    ("stream", ("stream executio",)),
    ("driver calls", ("Thread-",)),  # py4j's threads: the driver's Python planning through them
    ("scheduler", ("dag-scheduler", "task-result-get", "dispatcher-even")),
)


async def enrich(row: dict[str, Any]) -> dict[str, Any]:
    await asyncio.sleep(DELAY)
    return {"v": row["seq"]}


class Sink:
    """Spark's ``noop`` sink, timing each write and taking a CPU sample at the first
    micro-batch after the warm-up (the sink runs in this process on a classic session; a
    sample reads ``/proc`` for every JVM thread, about 30 ms: taken once, not per micro-batch,
    so it stays out of the timings; later micro-batches bring the stream's thread up to date,
    one read)."""

    def __init__(self, split: CpuSplit) -> None:
        self.split, self.calls = split, 0
        self.seconds: list[float] = []  # each call's write: its planning and its Spark job

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        if self.calls == WARM_UP:
            self.split.sample()
        elif self.calls > WARM_UP:
            self.split.touch()
        self.calls += 1
        started = time.perf_counter()
        df.write.format("noop").mode("overwrite").save()
        self.seconds.append(time.perf_counter() - started)

    @property
    def steady(self) -> int:
        """Micro-batches since the sample."""
        return max(0, self.calls - WARM_UP)


# ---------------------------------------------------------------------- CPU, by process and thread


def jvm_pid(spark: SparkSession) -> int:
    return int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())  # type: ignore[union-attr]


def _thread(pid: int, tid: str) -> tuple[str, str, float] | None:
    """A JVM thread's name, start time (clock ticks since boot: a thread id the system reuses
    for a new thread is another thread) and CPU seconds (None: it has ended)."""
    try:
        stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    name, fields = stat[stat.index("(") + 1 : stat.rindex(")")], stat.rsplit(")", 1)[1].split()
    return name, fields[19], (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuSplit:
    """CPU seconds per micro-batch, per part of the process tree, between a sample taken after
    the warm-up and one at the end. Each JVM thread counts with its CPU when last seen: a
    thread that ends in between (the stream's, when the query stops) keeps what it had then,
    and :meth:`touch` brings the stream's thread up to date cheaply each micro-batch."""

    def __init__(self, spark: SparkSession) -> None:
        self.pid = jvm_pid(spark)
        self.samples: list[Counter[str]] = []
        # (tid, start time) -> (group, CPU seconds last seen)
        self._seen: dict[tuple[str, str], tuple[str, float]] = {}
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        self._codegen = jvm.org.apache.spark.metrics.source.CodegenMetrics

    def _look(self, tids: Any) -> None:
        for tid in tids:
            found = _thread(self.pid, tid)
            if found is not None:
                name, started, seconds = found
                group = next((g for g, prefixes in THREADS if name.startswith(prefixes)), "other")
                self._seen[tid, started] = (group, seconds)

    def touch(self) -> None:
        """Bring the stream's thread up to date (one small read)."""
        self._look([tid for (tid, _), (group, _) in self._seen.items() if group == "stream"])

    def generated(self) -> int:
        """Classes Spark's code generation compiled so far (a plan it had not seen before)."""
        return int(self._codegen.METRIC_COMPILATION_TIME().getCount())

    def _now(self) -> Counter[str]:
        self._look(os.listdir(f"/proc/{self.pid}/task"))
        now: Counter[str] = Counter()
        for group, seconds in self._seen.values():
            now[group] += seconds
        now["classes generated"] = self.generated()
        now["python workers"] = worker_cpu()
        me = psutil.Process().cpu_times()
        now["driver python"] = me.user + me.system
        return now

    def sample(self) -> None:
        self.samples.append(self._now())

    def per_batch(self, batches: int) -> dict[str, float]:
        """Between the first and the last sample, per micro-batch of the ``batches`` run then."""
        if len(self.samples) < 2 or batches < 1:
            return {}
        first, last = self.samples[0], self.samples[-1]
        return {k: round((last[k] - first.get(k, 0.0)) / batches, 3) for k in sorted(last)}


# ---------------------------------------------------------------------- the jobs


def write_source(spark: SparkSession, folder: Path, rows: int, per_batch: int, by_key: int = 0) -> None:
    """``rows`` rows in files of ``per_batch`` rows each, in arrival order; with ``by_key``,
    each micro-batch's rows in that many files instead, one per partition of Spark's hash of the
    key (the split a shuffle by key makes), older micro-batches' files older."""
    files = max(1, rows // per_batch)
    df = spark.range(files * per_batch, numPartitions=1).selectExpr("id AS seq", f"id % {KEYS} AS order_id")
    if not by_key:
        df.write.option("maxRecordsPerFile", per_batch).parquet(str(folder))
        return
    folder.mkdir(parents=True)
    for i in range(files):
        staging = folder.parent / f"staging-{i}"
        rows_of_batch = df.where(f"seq >= {i * per_batch} AND seq < {(i + 1) * per_batch}")
        rows_of_batch.repartition(by_key, "order_id").sortWithinPartitions("seq").write.parquet(str(staging))
        for j, path in enumerate(sorted(staging.glob("part-*.parquet"))):
            target = folder / f"{i:05d}-{j}.parquet"
            path.rename(target)
            os.utime(target, (1e9 + i, 1e9 + i))  # the source reads the oldest files first


def batch_job(spark: SparkSession, folder: Path, capacity: int, rounds: int) -> float:
    """The batch job's rows/s: the median of ``rounds`` runs after one to warm up (the session's
    first job also starts its Python workers), as the streams' figures leave out their first
    micro-batches."""
    df = spark.read.parquet(str(folder))
    rows = df.count()
    out = AsyncDataStream.key_ordered_wait(
        df, enrich, "order_id", order_by="seq", capacity=capacity, output_schema="v long"
    )
    rates = []
    for _ in range(rounds + 1):
        started = time.perf_counter()
        out.write.format("noop").mode("overwrite").save()
        rates.append(rows / (time.perf_counter() - started))
    return statistics.median(rates[1:])


def _stream_source(spark: SparkSession, folder: Path, files: int = 1) -> DataFrame:
    return spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", files).parquet(str(folder))


def _figures(progress: list[dict[str, Any]], split: CpuSplit, sink: Sink) -> dict[str, Any]:
    steady = [p for p in progress if p["numInputRows"]][WARM_UP:]
    rows = sum(p["numInputRows"] for p in steady)
    seconds = [p["durationMs"]["triggerExecution"] / 1000 for p in steady]
    # Spark's own work: the micro-batch but for the foreachBatch function (addBatch)
    spark_own = [(p["durationMs"]["triggerExecution"] - p["durationMs"]["addBatch"]) / 1000 for p in steady]
    return {
        "micro_batches": len(steady),
        "rows_per_s": round(rows / sum(seconds)) if seconds else 0,
        "seconds_per_batch": _median(seconds),
        "spark_own_seconds": _median(spark_own),
        "sink_seconds": _median(sink.seconds[WARM_UP:]),
        "cpu_per_batch": split.per_batch(sink.steady),
    }


def _median_round(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Of a stream's rounds, the one whose seconds a micro-batch are the median (the lower
    middle of an even count)."""
    return sorted(rounds, key=lambda r: r["seconds_per_batch"])[(len(rounds) - 1) // 2]


def _median(seconds: list[float]) -> float:
    return round(statistics.median(seconds), 3) if seconds else 0.0


def _foreach_stream(
    spark: SparkSession, folder: Path, checkpoint: Path, function: Callable[[Sink], Any]
) -> dict[str, Any]:
    """The figures of a stream over ``folder`` whose ``foreachBatch`` is ``function(sink)``."""
    split = CpuSplit(spark)
    sink = Sink(split)
    query = (
        _stream_source(spark, folder)
        .writeStream.foreachBatch(function(sink))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    split.sample()
    return _figures([json.loads(p.json) for p in query.recentProgress], split, sink)


def plain_stream(spark: SparkSession, folder: Path, work: Path) -> dict[str, Any]:
    return _foreach_stream(spark, folder, work / "cp-plain", lambda sink: sink)


def _pooled(capacity: int) -> Any:
    """A hand-written task body: the rows of each Arrow batch through ``enrich`` with at most
    ``capacity`` calls in flight (a semaphore, no key order), on an event loop of the task's
    own (uvloop, as ours runs with the ``fast`` extra)."""

    def run(batches: Any) -> Any:
        import pyarrow as pa
        import uvloop

        loop = uvloop.new_event_loop()

        async def calls(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
            gate = asyncio.Semaphore(capacity)

            async def one(row: dict[str, Any]) -> dict[str, Any]:
                async with gate:
                    return {**row, **await enrich(row)}

            return await asyncio.gather(*(one(r) for r in rows))

        try:
            for batch in batches:
                yield pa.RecordBatch.from_pylist(loop.run_until_complete(calls(batch.to_pylist())), OUT_ARROW)
        finally:
            loop.close()

    return run


OUT_SCHEMA = SCHEMA + ", v long"


def _arrow_out() -> Any:
    import pyarrow as pa

    return pa.schema([("seq", pa.int64()), ("order_id", pa.int64()), ("v", pa.int64())])


OUT_ARROW = _arrow_out()


def stage_stream(
    spark: SparkSession, folder: Path, work: Path, name: str, body: Any, schema: str
) -> dict[str, Any]:
    """A hand-written stream in the shape of key_ordered_stream's micro-batch with nothing
    parked: ``foreachBatch`` repartitions the rows by the key into the same partitions, sorts
    them, runs ``body`` in ``mapInArrow``, persists the output, writes it (filtered) to
    ``noop`` and unpersists it. With an identity body: what Spark's Python stage costs a
    micro-batch; with the calls in a plain pool: what a hand-written job pays for the same
    lookups (no key order, nothing kept for a restart)."""
    from pyspark import StorageLevel

    slots = key_partitions(spark)

    def each_of(sink: Sink) -> Callable[[DataFrame, int], None]:
        def each(batch: DataFrame, batch_id: int) -> None:
            staged = batch.repartition(slots, "order_id").sortWithinPartitions("seq").mapInArrow(body, schema)
            staged = staged.persist(StorageLevel.MEMORY_AND_DISK)
            try:
                sink(staged.where("seq IS NOT NULL"), batch_id)
            finally:
                staged.unpersist()

        return each

    return _foreach_stream(spark, folder, work / f"cp-{name}", each_of)


def _identity(batches: Any) -> Any:
    yield from batches


def keyed_stream(
    spark: SparkSession, folder: Path, work: Path, capacity: int, by_key: int = 0
) -> dict[str, Any]:
    """``key_ordered_stream``'s figures; ``by_key``: over a source written so (as many files
    a micro-batch, each a partition), with ``assume_partitioned=True``."""
    split = CpuSplit(spark)
    sink = Sink(split)
    stream = AsyncDataStream.key_ordered_stream(
        _stream_source(spark, folder, by_key or 1),
        enrich,
        "order_id",
        order_by="seq",
        sink=sink,
        checkpoint_location=str(work / ("cp-keyed-by-key" if by_key else "cp-keyed")),
        output_schema="v long",
        capacity=capacity,
        assume_partitioned=bool(by_key),
    )
    query = stream.start(availableNow=True)
    query.awaitTermination()
    split.sample()
    figures = _figures([json.loads(p.json) for p in query.recentProgress], split, sink)
    reports = stream.reports[WARM_UP:]
    assert all(r.parked == 0 for r in reports), "rows were left parked"
    figures["our_seconds_per_batch"] = _median([r.seconds for r in reports])
    return figures


# ---------------------------------------------------------------------- the soak

FAIL_SHARE = 0.01


class Down(Exception):
    """The service failed this call (retryable: the row is deferred)."""


async def flaky(row: dict[str, Any]) -> dict[str, Any]:
    import random

    await asyncio.sleep(0.005)
    if random.random() < FAIL_SHARE:
        raise Down(f"order {row['order_id']}")
    return {"v": row["seq"]}


def _progress(query: Any, seen: dict[int, dict[str, Any]]) -> None:
    for p in query.recentProgress:
        data = json.loads(p.json)
        seen[int(data["batchId"])] = data


def _minute_line(
    minute: int, batches: list[dict[str, Any]], reports: dict[int, Any], cpu: dict[str, float]
) -> str:
    """One minute of the soak (Spark's input counts count every scan of a micro-batch's input,
    and ours reads it more than once: the rows come from our reports)."""
    ours = [reports[b["batchId"]] for b in batches if b["batchId"] in reports]
    rows_in, rows_out = sum(r.rows_in for r in ours), sum(r.rows_out for r in ours)
    seconds = sorted(b["durationMs"]["triggerExecution"] / 1000 for b in batches) or [0.0]
    jvm = sum(v for k, v in cpu.items() if k not in ("python workers", "driver python", "classes generated"))
    shares = {k: cpu.get(k, 0.0) / jvm for k in ("GC", "JIT")} if jvm else {"GC": 0.0, "JIT": 0.0}
    parked = ours[-1].parked if ours else 0
    return (
        f"minute {minute}: {rows_in / 60:,.0f} rows/s in, {rows_out / 60:,.0f} out, {len(batches)} "
        f"micro-batches, {statistics.median(seconds):.2f} s median, {seconds[-1]:.2f} s largest, "
        f"{parked:,} parked; JVM {jvm / 60:.2f} cores (GC {shares['GC']:.0%}, JIT {shares['JIT']:.0%}), "
        f"Python workers {cpu.get('python workers', 0.0) / 60:.2f} cores; "
        f"{cpu.get('classes generated', 0):.0f} classes generated"
    )


def soak(
    minutes: float, rate: int, keys: int, capacity: int, conf: dict[str, str], hot: float = 0.0
) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from keyed_async_wait import DeferPolicy

    spark = local_spark(conf)
    split = CpuSplit(spark)
    value = F.col("value")
    # ``hot`` of the rows (picked by a hash of the row, so any share) go to key 0, the rest in turn
    key = F.when(F.pmod(F.hash(value), F.lit(10_000)) < int(hot * 10_000), F.lit(0)).otherwise(
        1 + value % (keys - 1)
    )
    source = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", rate)
        .load()
        .select(value.alias("seq"), (key if hot else value % keys).alias("order_id"))
    )
    seen: dict[int, dict[str, Any]] = {}
    lines, minute_cpu = [], []
    with tempfile.TemporaryDirectory(prefix="kaw-bench-soak-") as tmp:
        stream = AsyncDataStream.key_ordered_stream(
            source,
            flaky,
            "order_id",
            order_by="seq",
            sink=lambda df, batch_id: df.write.format("noop").mode("overwrite").save(),
            checkpoint_location=f"{tmp}/cp",
            output_schema="v long",
            capacity=capacity,
            defer=DeferPolicy(delay=5.0, max_delay=60.0),
            time_cap=2.0,
            heartbeat=1,
        )
        query = stream.start(processingTime="1 second")
        started = time.monotonic()
        try:
            before = split._now()
            for minute in range(1, int(minutes) + 1):
                time.sleep(max(0.0, started + 60 * minute - time.monotonic()))  # the minute measured
                if query.exception() is not None:
                    raise RuntimeError(f"the stream failed: {query.exception()}")
                _progress(query, seen)
                now = split._now()
                cpu = {k: now[k] - before.get(k, 0.0) for k in now}
                before = now
                minute_cpu.append(cpu)
                batches = [
                    b
                    for b in seen.values()
                    if started + 60 * (minute - 1) <= _ended(b) < started + 60 * minute
                ]
                reports = {r.batch_id: r for r in stream.reports}
                lines.append(_minute_line(minute, batches, reports, cpu))
                print(lines[-1], flush=True)
        finally:
            query.stop()
            stream.close()
    spark.stop()
    total: Counter[str] = Counter()
    for cpu in minute_cpu:
        total.update(cpu)
    reports = stream.reports
    return {"minutes": len(minute_cpu), "rows_out": sum(r.rows_out for r in reports), "cpu": dict(total)}


def _where_it_goes(keyed: dict[str, Any], per_batch: int, share: float, capacity: int, batch: float) -> str:
    """Where a key_ordered_stream micro-batch's seconds go (medians), and the rows/s a stream
    would make if it paid only Spark's own work and its fullest task's lookups."""
    larger = per_batch * share / capacity * DELAY  # the fullest task's floor
    ours, sink = keyed["our_seconds_per_batch"], keyed["sink_seconds"]
    spark_own = keyed["spark_own_seconds"]
    bound = per_batch / (spark_own + larger)
    return (
        f"  a micro-batch, medians: Spark's own work {spark_own:.2f} s; our function {ours:.2f} s, "
        f"of it the sink {sink:.2f} s (its planning and the lookups' Spark job) and {ours - sink:.2f} s "
        f"around it; the fullest task's floor {larger:.2f} s ({share:.1%} of the rows); Spark's own "
        f"work and that floor alone: {bound:,.0f} rows/s ({bound / batch:.2f}x the batch job)"
    )


def _beside_hand_written(
    plain: dict[str, Any], stage: dict[str, Any], pooled: dict[str, Any], keyed: dict[str, Any], batch: float
) -> str:
    """key_ordered_stream beside the same micro-batch written by hand: with an identity
    Python stage (Spark's own cost of the stage, no lookups) and with the calls in a plain
    pool (the lookups too, without key order or state)."""
    base = plain["seconds_per_batch"]

    def over(figures: dict[str, Any]) -> str:
        return f"{figures['seconds_per_batch']:.2f} s (plain + {figures['seconds_per_batch'] - base:.2f})"

    return (
        f"  written by hand, the same shuffle, sort, mapInArrow, persist and sink: an identity "
        f"stage {over(stage)}, the calls in a pool of the same capacity {over(pooled)}, "
        f"{pooled['rows_per_s']:,} rows/s ({pooled['rows_per_s'] / batch:.2f}x the batch job); "
        f"key_ordered_stream {keyed['seconds_per_batch'] / pooled['seconds_per_batch']:.2f}x the pool's "
        f"seconds a micro-batch"
    )


def _ended(progress: dict[str, Any]) -> float:
    """When a micro-batch ended, on this process's monotonic clock."""
    from datetime import datetime

    began = datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp()
    return time.monotonic() - (time.time() - began - progress["durationMs"]["triggerExecution"] / 1000)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--per-batch", default="2500,25000", help="rows per micro-batch, comma-separated")
    parser.add_argument("--capacity", type=int, default=200, help="records in flight per task")
    parser.add_argument("--batch-rounds", type=int, default=3, help="the batch job's runs (median)")
    parser.add_argument("--stream-rounds", type=int, default=3, help="each stream's runs, in turn (median)")
    parser.add_argument("--soak", type=float, default=0, help="minutes: run the soak instead")
    parser.add_argument("--rate", type=int, default=6_000, help="the soak's rows per second")
    parser.add_argument("--soak-keys", type=int, default=200_000)
    parser.add_argument("--soak-hot", type=float, default=0.0, help="share of the soak's rows on one key")
    parser.add_argument("--conf", action="append", default=[], help="KEY=VALUE: a Spark setting")
    args = parser.parse_args()
    print(f"calibration: {calibration():.2f} CPU s (the machine's speed now; lower is faster)")
    if args.soak:
        result = soak(
            args.soak,
            args.rate,
            args.soak_keys,
            args.capacity,
            dict(c.split("=", 1) for c in args.conf),
            args.soak_hot,
        )
        print(json.dumps(result, indent=2))
        return
    spark = local_spark(dict(c.split("=", 1) for c in args.conf))
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="kaw-bench-stream-") as tmp:
        for per_batch in (int(x) for x in args.per_batch.split(",")):
            work = Path(tmp) / str(per_batch)
            folder = work / "in"
            rows = max(args.rows, (WARM_UP + MEASURED) * per_batch)
            write_source(spark, folder, rows, per_batch)
            floor = per_batch / (2 * args.capacity) * DELAY
            slots = key_partitions(spark)
            # the keys' split over the tasks (one per task slot): the fullest sets the floor
            share = largest_share(spark.read.parquet(str(folder)), "order_id", slots)
            batch = batch_job(spark, folder, args.capacity, args.batch_rounds)
            # the streams in turn, ``--stream-rounds`` times (the JVM's JIT warms up over the first
            # minutes: a stream run first would pay for it): each one's figures from the round
            # with its median micro-batch
            rounds: dict[str, list[dict[str, Any]]] = {"plain": [], "identity": [], "pooled": [], "keyed": []}
            for r in range(args.stream_rounds):
                turn = work / f"r{r}"
                rounds["plain"].append(plain_stream(spark, folder, turn))
                rounds["identity"].append(stage_stream(spark, folder, turn, "identity", _identity, SCHEMA))
                pool = _pooled(args.capacity)
                rounds["pooled"].append(stage_stream(spark, folder, turn, "pooled", pool, OUT_SCHEMA))
                rounds["keyed"].append(keyed_stream(spark, folder, turn, args.capacity))
            plain, python_stage, pooled, keyed = (_median_round(rounds[k]) for k in rounds)
            write_source(spark, work / "by-key", rows, per_batch, by_key=slots)
            by_key = keyed_stream(spark, work / "by-key", work, args.capacity, by_key=slots)
            results[per_batch] = {
                "batch_rows_per_s": round(batch),
                "largest_partition_share": round(share, 4),
                "plain": plain,
                "python_stage": python_stage,
                "pooled": pooled,
                "keyed": keyed,
                "keyed_assume_partitioned": by_key,
            }
            print(
                f"{per_batch:,} rows a micro-batch: batch job {batch:,.0f} rows/s; plain stream "
                f"{plain['rows_per_s']:,} rows/s, {plain['seconds_per_batch']:.2f} s a micro-batch; "
                f"key_ordered_stream {keyed['rows_per_s']:,} rows/s "
                f"({keyed['rows_per_s'] / batch:.2f}x the batch job), "
                f"{keyed['seconds_per_batch']:.2f} s a micro-batch (plain + "
                f"{keyed['seconds_per_batch'] - plain['seconds_per_batch']:.2f} s; the lookups' floor "
                f"{floor:.2f} s)"
            )
            print(_where_it_goes(keyed, per_batch, share, args.capacity, batch))
            print(_beside_hand_written(plain, python_stage, pooled, keyed, batch))
            print(
                f"  over a source partitioned by key, assume_partitioned=True: {by_key['rows_per_s']:,} "
                f"rows/s ({by_key['rows_per_s'] / batch:.2f}x the batch job), "
                f"{by_key['seconds_per_batch']:.2f} s a micro-batch (plain + "
                f"{by_key['seconds_per_batch'] - plain['seconds_per_batch']:.2f} s)"
            )
            for name in ("plain", "keyed"):
                cpu = dict(results[per_batch][name]["cpu_per_batch"])
                classes = cpu.pop("classes generated", 0.0)
                print(
                    f"  CPU s a micro-batch, {name}: "
                    + ", ".join(f"{k} {v:.3f}" for k, v in cpu.items())
                    + f"; classes generated a micro-batch {classes:.1f}"
                )
    spark.stop()
    print(json.dumps(results, indent=2))
    print(f"calibration: {calibration():.2f} CPU s")


if __name__ == "__main__":
    main()

"""Whole Spark jobs (local[2]): the three waits next to the usual alternatives, in one run.

    ./run bench spark_throughput [--rows N] [--quick] [--json PATH] [--chart SVG]
                                 [--service python|nginx]
    ./run bench spark_throughput --service nginx --json benchmarks/results/throughput.json
                                 (the figures of the benchmarks page: then ./run bench report)

A 20 ms HTTP service runs in its own process (``--service nginx``: Debian's nginx with its
echo module, which costs next to nothing per request, so the figures are the library's cost;
see ``cheap_service.py``); each job enriches N rows (2,000 distinct keys)
with one GET per row and writes to Spark's ``noop`` sink, so every row is really produced.
Our runs have a 10 s timeout and 3 attempts (fixed 100 ms delay) switched on. Baselines:
(a) a Python UDF calling ``requests`` per row (on a small slice: it runs at ~80 rows/s),
(b) a hand-written mapInArrow with asyncio.gather over aiohttp, 100 concurrent,
(c) Spark's Arrow UDF concurrency (spark.sql.execution.pythonUDF.arrow.concurrency.level=100).
Then ``unordered_wait`` behind the shuffle key_ordered_wait makes (the same keys in the same
tasks, sorted, without key order: what the placement costs apart from the order),
key_ordered_wait with ``balance_keys=True`` (keys placed by their rows; the pass that counts
them is in its time), with maxRecordsPerBatch=100, and batched Redis lookups end to end.
The physical limit: what a client that costs nothing gets from the same service, measured with
``wrk`` (a C load generator) at 400 connections, the most the jobs keep in flight, and at
200, the hand-written job's 100 per task; each HTTP job is printed as a fraction of both.
Each main job's CPU per row is printed split by process (Spark's Python workers, its JVM, the
driver's Python; ``cpu_meter.py``). ``--chart SVG`` draws rows/s and CPU per row, the limits
as lines, into an SVG (``chart.py``, matplotlib from the ``bench`` extra).
``wrk`` is taken from PATH, else from Debian's package,
fetched with ``apt-get download`` (no root) into ~/.cache/keyed-async-wait/wrk; the figure is
left out, saying so, when neither works.
(d) PyFlink's AsyncDataStream, with --pyflink: the script makes an environment of its own for
it (.venv-pyflink: apache-flink pins pyarrow < 21 and pandas < 2.3) and runs
benchmarks/pyflink_job.py there, with separate Python workers and a file sink.
On an older pyspark the jobs it cannot carry are left out and named (the SQL functions before
4.0 and the scalar one before 4.2, (c) before 4.0); ``spark_versions`` runs this script on the
oldest and the newest supported pyspark side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import sql_ext
from keyed_async_wait import AsyncDataStream, RetryStrategy
from keyed_async_wait.app.embedded import redis_url_or_embedded
from keyed_async_wait.spark.compat import pyspark_version
from lookup import Field, HttpLookup, RedisLookup

sys.path.insert(0, os.path.dirname(__file__))
from cheap_service import SERVICES, lookup_service
from cpu_meter import Split, measure_split, split_text

KEYS = 2_000
RETRY = RetryStrategy.fixed_delay(3, 0.1)
SQL_SETTINGS = {  # the same options as the DataFrame jobs, as SQL settings
    "output-mode": "ALLOW_UNORDERED",
    "key-ordered-enabled": "true",
    "buffer-capacity": "200",
    "timeout": "10 s",
    "retry-strategy": "fixed_delay",
    "fixed-delay": "100 ms",
    "max-attempts": "3",
}


def calibration(loops: int = 5_000_000) -> float:
    """CPU seconds of a fixed pure-Python loop here: the machine's speed at the moment. On a
    shared virtual machine it moves with the host's load (the same loop took 0.35-0.49 s within
    an hour here), so CPU figures of different runs compare only through their ratios."""
    started = time.process_time()
    total = 0
    for i in range(loops):
        total += i * i % 7
    return time.process_time() - started


def local_spark(conf: dict[str, str] | None = None, master: str = "local[2]") -> SparkSession:
    """The benchmarks' session: local[2], two shuffle partitions, no adaptive coalescing
    (and ``conf``, which wins)."""
    builder = (
        SparkSession.builder.master(master)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def defaults_spark() -> SparkSession:
    """A ``local[2]`` session with Spark's default SQL settings (200 shuffle partitions, adaptive
    query execution on), without the UI and its progress bar: what a user gets first."""
    builder = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
    spark = builder.config("spark.ui.showConsoleProgress", "false").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def defaults_rate(url: str, n: int) -> float:
    """key_ordered_wait's rows/s on a session with Spark's default settings (200 shuffle
    partitions, adaptive query execution on) and no num_partitions: what a user gets first."""
    spark = defaults_spark()
    lookup = HttpLookup(url + "/users/{user_id}", fields=[Field("name")], max_connections=200)
    options = {"timeout": 10.0, "retry": RETRY, "capacity": 200}

    def job(m: int) -> DataFrame:
        return AsyncDataStream.key_ordered_wait(
            source(spark, m), lookup, key="order_id", order_by="seq", **options
        )

    job(2_000).write.format("noop").mode("overwrite").save()  # the workers up
    rate = rows_per_second(lambda: job(n), n)
    spark.stop()
    return rate


def defaults_in_a_process(url: str, n: int) -> float:
    """:func:`defaults_rate` in a process of its own (a process holds one SparkContext)."""
    done = subprocess.run(
        [sys.executable, __file__, "--defaults-job", f"{url},{n}"],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the run on Spark's defaults failed:\n{done.stderr[-3000:]}")
    return float(json.loads(done.stdout.strip().splitlines()[-1])["rows_per_s"])


def rows_per_second(build: Callable[[], DataFrame], n: int) -> float:
    start = time.perf_counter()
    build().write.format("noop").mode("overwrite").save()
    return n / (time.perf_counter() - start)


def source(spark: SparkSession, n: int) -> DataFrame:
    return spark.range(n).select(
        F.col("id").alias("seq"),
        (F.col("id") % KEYS).alias("order_id"),
        (F.col("id") % KEYS).alias("user_id"),
    )


KEY_PARTITIONS = 2  # the key-ordered jobs' partitions: one per task slot of local[2]


def largest_share(df: DataFrame, key: str, partitions: int) -> float:
    """The share of ``df``'s rows in the fullest of ``partitions`` partitions by ``key``, as a
    key-ordered wait spreads them (Spark's hash): that task's lookups set the job's length."""
    counts = [
        row[1] for row in df.repartition(partitions, key).groupBy(F.spark_partition_id()).count().collect()
    ]
    return max(counts) / sum(counts)


def hand_written(url: str, concurrency: int = 100) -> Callable[[Any], Any]:
    def run(batches: Any) -> Any:
        import asyncio
        import gc

        gc.set_threshold(700, 10, 10)  # Python's defaults, as in a fresh worker (ours tunes them)

        import aiohttp
        import pyarrow as pa

        async def enrich(rows: list[dict]) -> list[dict]:
            sem = asyncio.Semaphore(concurrency)
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:

                async def one(row: dict) -> dict:
                    async with sem, session.get(f"{url}/users/{row['user_id']}") as resp:
                        data = json.loads(await resp.read())
                    return {**row, "name": data["name"]}

                return await asyncio.gather(*(one(r) for r in rows))

        for batch in batches:
            yield pa.RecordBatch.from_pylist(asyncio.run(enrich(batch.to_pylist())))

    return run


def pyflink_python(path: Path) -> str:
    """The Python of a PyFlink environment, made on first use (about a minute, 900 MB)."""
    python = path / "bin" / "python"
    if not python.exists():
        print(f"making {path} for PyFlink (apache-flink, aiohttp) ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "apache-flink", "aiohttp"], check=True)
    return str(python)


def pyflink_rate(python: str, url: str, rows: int, mode: str, timeout: float) -> float:
    job = Path(__file__).with_name("pyflink_job.py")
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run(
            [python, str(job), url, str(rows), mode, str(timeout), out],
            capture_output=True,
            text=True,
            timeout=1800,
        )
    if done.returncode != 0:
        raise RuntimeError(f"PyFlink job failed:\n{done.stderr[-3000:]}")
    return float(json.loads(done.stdout.strip().splitlines()[-1])["rows_per_s"])


WRK_CACHE = Path.home() / ".cache" / "keyed-async-wait" / "wrk"


def wrk_command() -> tuple[list[str], dict[str, str]] | None:
    """wrk from PATH, else Debian's package unpacked into WRK_CACHE; None when neither works."""
    found = shutil.which("wrk")
    if found:
        return [found], dict(os.environ)
    binary, libs = WRK_CACHE / "usr" / "bin" / "wrk", WRK_CACHE / "usr" / "lib" / "x86_64-linux-gnu"
    if not binary.exists():
        WRK_CACHE.mkdir(parents=True, exist_ok=True)
        try:
            for package in ("wrk", "libluajit-5.1-2"):
                subprocess.run(
                    ["apt-get", "download", package], cwd=WRK_CACHE, check=True, capture_output=True
                )
            for deb in WRK_CACHE.glob("*.deb"):
                subprocess.run(["dpkg", "-x", str(deb), str(WRK_CACHE)], check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            print(f"  wrk: none on PATH and apt-get download failed ({exc}); limit left out")
            return None
    env = {**os.environ, "LD_LIBRARY_PATH": f"{libs}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
    return [str(binary)], env


def physical_limit(url: str, connections: int, seconds: int = 10) -> float | None:
    """Requests/s that wrk gets from the service at ``connections`` in flight, or None."""
    command = wrk_command()
    if command is None:
        return None
    argv, env = command
    out = subprocess.run(
        [*argv, "-t2", f"-c{connections}", f"-d{seconds}s", f"{url}/users/1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=seconds + 30,
    )
    match = re.search(r"Requests/sec:\s+([\d.]+)", out.stdout)
    if out.returncode != 0 or match is None:
        print(f"  wrk failed: {out.stderr.strip() or out.stdout.strip()}; limit left out")
        return None
    return float(match.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--quick", action="store_true", help="20,000 rows")
    parser.add_argument("--service", choices=SERVICES, default="python", help="what answers the lookups")
    parser.add_argument("--pyflink", action="store_true", help="also run PyFlink's AsyncDataStream (d)")
    parser.add_argument("--pyflink-env", type=Path, default=Path(__file__).parents[1] / ".venv-pyflink")
    parser.add_argument("--pyflink-rows", type=int, default=50_000, help="rows for the PyFlink jobs")
    parser.add_argument(
        "--json",
        type=Path,
        help="also write the figures (rows/s and CPU per row by job) here; the benchmarks page is written "
        "from benchmarks/results/throughput.json (./run bench report)",
    )
    parser.add_argument("--chart", type=Path, help="also draw them into this SVG file")
    parser.add_argument("--defaults-job", help=argparse.SUPPRESS)  # the child run on Spark's defaults
    args = parser.parse_args()
    import pyspark

    if args.defaults_job:  # url,rows: key_ordered_wait on a session with Spark's default settings
        url, rows = args.defaults_job.rsplit(",", 1)
        print(json.dumps({"rows_per_s": defaults_rate(url, int(rows))}))
        return

    before = calibration()
    print(f"pyspark {pyspark.__version__}; calibration loop before: {before:.3f} CPU s")
    n = 20_000 if args.quick else args.rows
    spark = local_spark()
    results: dict[str, float] = {}
    cpu: dict[str, Split] = {}

    def report(label: str, rate: float, base: str | None = None) -> None:
        results[label] = rate
        ratio = "".join(f"  {rate / results[b]:6.1f}x {b}" for b in ([base] if base else []) if b in results)
        print(f"  {label:<48} {rate:>9,.0f} rows/s{ratio}", flush=True)

    with lookup_service(args.service, 0.02) as url:
        print(f"{n:,} rows, {KEYS:,} keys, {args.service} HTTP service answering after 20 ms, local[2]")
        lookup = HttpLookup(url + "/users/{user_id}", fields=[Field("name")], max_connections=200)
        # capacity counts finished records not yet handed on, as Flink's does: 200 keeps about
        # 100 requests in flight, like the hand-written job's semaphore of 100
        options = {"timeout": 10.0, "retry": RETRY, "capacity": 200}

        import requests

        @F.udf("string")
        def blocking(user_id: int) -> str:
            return requests.get(f"{url}/users/{user_id}", timeout=10).json()["name"]

        slice_n = 2_000
        report(
            "(a) Python UDF, requests per row (2k slice)",
            rows_per_second(lambda: source(spark, slice_n).withColumn("name", blocking("user_id")), slice_n),
        )

        session_holder: dict[str, Any] = {}

        @F.udf("string", useArrow=True)
        def threaded(user_id: int) -> str:
            import threading

            local = session_holder.setdefault("local", threading.local())
            if not hasattr(local, "s"):
                local.s = requests.Session()
            return local.s.get(f"{url}/users/{user_id}", timeout=10).json()["name"]

        c_label = "(c) Arrow UDF, concurrency level 100 (20k)"
        if pyspark_version() >= (4, 0):  # the setting is 4.0's; 3.5 would ignore it silently
            spark.conf.set("spark.sql.execution.pythonUDF.arrow.concurrency.level", "100")
            c_n = min(n, 20_000)
            report(
                c_label,
                rows_per_second(lambda: source(spark, c_n).withColumn("name", threaded("user_id")), c_n),
            )
            spark.conf.unset("spark.sql.execution.pythonUDF.arrow.concurrency.level")
        else:
            print(f"  {c_label:<48} left out: pyspark {pyspark.__version__} has no such setting")

        pyflink_labels: list[str] = []
        if args.pyflink:
            python = pyflink_python(args.pyflink_env)
            for mode in ("unordered", "ordered"):
                label = f"(d) PyFlink {mode}_wait, 10 s timeout ({args.pyflink_rows // 1000}k)"
                report(label, pyflink_rate(python, url, args.pyflink_rows, mode, 10.0))
                pyflink_labels.append(label)

        schema = "seq long, order_id long, user_id long, name string"
        key_ordered = lambda m=n, **extra: AsyncDataStream.key_ordered_wait(  # noqa: E731
            source(spark, m),
            lookup,
            key="order_id",
            order_by="seq",
            num_partitions=KEY_PARTITIONS,
            **options,
            **extra,
        )
        if pyspark_version() >= (4, 0):  # sql_ext needs 4.0
            sql_ext.install(spark, {"users": lookup})
        for key, value in SQL_SETTINGS.items():
            spark.conf.set("spark.sql.exec.async-lookup." + key, value)

        def sql_job(query: str) -> Callable[[int], DataFrame]:
            def build(m: int) -> DataFrame:
                source(spark, m).createOrReplaceTempView("orders")
                return spark.sql(query)

            return build

        jobs: dict[str, Callable[[int], DataFrame]] = {
            "(b) hand-written mapInArrow + gather, 100": lambda m: source(spark, m).mapInArrow(
                hand_written(url, 100), schema
            ),
            "(b) hand-written mapInArrow + gather, 200": lambda m: source(spark, m).mapInArrow(
                hand_written(url, 200), schema
            ),
            "unordered_wait": lambda m: AsyncDataStream.unordered_wait(source(spark, m), lookup, **options),
            "ordered_wait": lambda m: AsyncDataStream.ordered_wait(source(spark, m), lookup, **options),
            "key_ordered_wait": key_ordered,
            # the same placement (a shuffle by the key into as many partitions, sorted), no key
            # order: what the placement costs, apart from the key order
            "unordered_wait behind the same shuffle": lambda m: AsyncDataStream.unordered_wait(
                source(spark, m).repartition(KEY_PARTITIONS, "order_id").sortWithinPartitions("seq"),
                lookup,
                **options,
            ),
            "key_ordered_wait, balance_keys=True": lambda m: key_ordered(m, balance_keys=True),
            "SQL scalar users(user_id)": sql_job(
                "SELECT seq, order_id, user_id, users(user_id).name AS name FROM orders"
            ),
            "SQL async_lookup, key-ordered": sql_job(
                "SELECT * FROM async_lookup(TABLE(orders), 'users', "
                "upsert_key => 'order_id', order_by => 'seq')"
            ),
        }
        carried = {"SQL scalar users(user_id)": (4, 2), "SQL async_lookup, key-ordered": (4, 0)}
        for label, needs in carried.items():
            if pyspark_version() < needs:
                del jobs[label]
                print(f"  {label:<48} left out: needs pyspark {'.'.join(map(str, needs))}")
        for job in jobs.values():  # warm the workers up, for everybody alike
            job(2_000).write.format("noop").mode("overwrite").save()
        for label, job in jobs.items():
            split = cpu[label] = measure_split(lambda job=job: job(n), n)
            report(label, split.rate)
            print(f"  {'':<48} CPU {split_text(split)}")
        best = max((k for k in results if k.startswith("(b)")), key=results.__getitem__)
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
        report(
            "key_ordered_wait, maxRecordsPerBatch=100", rows_per_second(key_ordered, n), "key_ordered_wait"
        )
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
        report(
            "key_ordered_wait, Spark's default settings",
            defaults_in_a_process(url, n),
            "key_ordered_wait",
        )
        print("ratios:")
        for ours in (
            "unordered_wait",
            "ordered_wait",
            "key_ordered_wait",
            "SQL scalar users(user_id)",
            "SQL async_lookup, key-ordered",
        ):
            if ours not in results:
                continue
            bases = ["(a) Python UDF, requests per row (2k slice)", c_label]
            for base in [b for b in [*bases, *pyflink_labels, best] if b in results]:
                print(f"  {ours:<18} {results[ours] / results[base]:7.2f}x {base}")
        ratio = results["key_ordered_wait"] / results["unordered_wait"]
        print(f"  key_ordered_wait   {ratio:7.2f}x unordered_wait")
        shuffled = results["unordered_wait behind the same shuffle"]
        behind = results["key_ordered_wait"] / shuffled
        print(f"  key_ordered_wait   {behind:7.2f}x unordered_wait behind its shuffle")
        balanced = results["key_ordered_wait, balance_keys=True"]
        label = "key_ordered_wait, balance_keys=True"
        print(f"  {label} {balanced / results['key_ordered_wait']:7.2f}x key_ordered_wait")
        for ours in ("SQL scalar users(user_id)", "SQL async_lookup, key-ordered"):
            if ours in results:  # the SQL forms against the DataFrame wait they stand for
                print(f"  {ours:<18} {results[ours] / results['key_ordered_wait']:7.2f}x key_ordered_wait")
        limit, half = physical_limit(url, 400), physical_limit(url, 200)
        if limit is not None and half is not None:
            results["wrk, 400 connections"], results["wrk, 200 connections"] = limit, half
            print(
                f"the physical limit: wrk, 400 connections, {limit:,.0f} requests/s; 200 connections,"
                f" {half:,.0f}; each job as a fraction of both (400 / 200):"
            )
            for label, rate in results.items():
                if not label.startswith(("(a)", "key_ordered_wait, Redis", "wrk")):
                    print(f"  {label:<48} {rate / limit:5.2f} / {rate / half:5.2f}")
            share = largest_share(source(spark, n), "order_id", KEY_PARTITIONS)
            print(
                f"  key_ordered_wait's fullest task holds {share:.1%} of the rows (its keys' split over "
                f"{KEY_PARTITIONS} tasks): at the same rate per task as an even split it makes "
                f"{1 / KEY_PARTITIONS / share:.2f}x of that"
            )

    with redis_url_or_embedded() as redis_url:
        import redis

        client = redis.Redis.from_url(redis_url)
        pipe = client.pipeline(transaction=False)
        for i in range(KEYS):
            pipe.set(f"price:{i}", json.dumps({"price": i / 10}))
        pipe.execute()
        redis_n = max(n, 200_000)
        prices = RedisLookup(redis_url, "price:{user_id}", fields=[Field("price", "float")])
        report(
            f"key_ordered_wait, Redis MGET batches ({redis_n // 1000}k rows)",
            rows_per_second(
                lambda: AsyncDataStream.key_ordered_wait(
                    source(spark, redis_n),
                    prices,
                    key="order_id",
                    num_partitions=KEY_PARTITIONS,
                    capacity=5000,
                    batch_size=500,
                    timeout=10.0,
                    retry=RETRY,
                ),
                redis_n,
            ),
        )
    spark.stop()
    after = calibration()
    print(f"calibration loop after: {after:.3f} CPU s (the machine's speed: lower is quieter)")
    figures = {
        "pyspark": pyspark.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "rows": n,
        "service": args.service,
        "calibration": [round(before, 3), round(after, 3)],
        "rows_per_s": results,
        "cpu_us_per_row": {
            label: {part: getattr(split, part) * 1000 for part in ("workers", "jvm", "driver")}
            for label, split in cpu.items()
        },
    }
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    if args.chart:
        import chart

        chart.draw(figures, args.chart)
        print(f"chart: {args.chart}")


if __name__ == "__main__":
    main()

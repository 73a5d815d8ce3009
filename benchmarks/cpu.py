"""CPU per row of the Python workers, ours against hand-written asyncio with the same client.

    ./run bench cpu [--rows N] [--redis-rows M] [--rounds R] [--paths http,http_batch,...]
                    [--service python|nginx]

``--service nginx``: the HTTP paths ask Debian's nginx with its echo module, which costs next
to nothing per request (``cheap_service.py``), instead of the project's Python test service;
it serves no batch endpoint, so ``http_batch`` needs the Python service.

Per path, our job and a hand-written ``mapInArrow`` + asyncio equivalent (same client library,
same concurrency, no ordering, capacity or retries) run interleaved (A B, A B, ...) for R
rounds, ``local[2]``, output consumed by the ``noop`` sink. Reported, as medians: wall rows/s,
and the CPU seconds per 1,000 rows of Spark's Python workers (user + system of every
``pyspark.daemon`` process and the workers it forked, reaped ones included, read with psutil
before and after the job), with ours over hand-written; and the median and range of the
rounds' own ratios (each round's two jobs ran back to back, so the machine's drift between
rounds cancels out of them). Under each path, each side's whole CPU per row split by process:
the Python workers, Spark's JVM and the driver's Python (medians, microseconds). A calibration
loop's CPU seconds are printed before and after the run: the machine's speed then (see
:func:`calibration`).

``--plain``: ours without the ``fast`` extra (asyncio's loop, the standard library's JSON,
the lean HTTP client on llhttp, a plain dependency now), as the default install runs; ``--python-gc``:
ours with Python's own collector settings (``KAW_GC=default``), to see what the tuning gives;
``--aiohttp``: ours with aiohttp's client instead of the lean one (``KAW_HTTP=aiohttp``).

Paths: ``http`` (a GET per row, 20 ms service in its own process, ``key_ordered_wait`` with
ordering and retries, capacity 100 as the hand-written job's 100 concurrent requests),
``http_200`` (the same, 200 in flight in each),
``http_batch`` (POST /users/batch, 100 keys a call),
``redis`` (a GET per row), ``redis_mget`` (MGET of 500 keys; ours with capacity 500, as the
hand-written job's 500 rows in flight), ``redis_mget_5000`` (the same, ours with capacity
5000: ten batches' worth admitted, as many in flight as the task's keys allow),
``redis_mget_backlog`` (MGET of 500, every row its own key, ours with ``backlog=True``: the
columnar path), ``sql`` (the SQL scalar function against the hand-written HTTP job),
``sql_table`` (the table function, key-ordered by ``order_id``, against the same).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Callable
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from pyspark.sql import DataFrame

from keyed_async_wait import AsyncDataStream
from keyed_async_wait.app.embedded import redis_url_or_embedded
from lookup import Field, HttpLookup, RedisLookup

sys.path.insert(0, os.path.dirname(__file__))
from cheap_service import SERVICES, lookup_service
from cpu_meter import Split, measure_split, split_text
from spark_throughput import KEYS, RETRY, SQL_SETTINGS, calibration, hand_written, local_spark, source

Job = Callable[[], DataFrame]


def measure(job: Job, rows: int) -> tuple[float, float]:
    """(rows/s, worker CPU seconds per 1,000 rows) of one run."""
    split = measure_split(job, rows)
    return split.rate, split.workers


def hand_http_batch(url: str, chunk: int = 100, concurrency: int = 100) -> Callable[[Any], Any]:
    def run(batches: Any) -> Any:
        import asyncio
        import gc

        gc.set_threshold(700, 10, 10)  # Python's defaults, as in a fresh worker (ours tunes them)

        import aiohttp
        import pyarrow as pa

        async def enrich(rows: list[dict]) -> list[dict]:
            sem = asyncio.Semaphore(concurrency)
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:

                async def one(part: list[dict]) -> list[dict]:
                    ids = sorted({r["user_id"] for r in part})
                    async with sem, session.post(f"{url}/users/batch", json=ids) as resp:
                        data = json.loads(await resp.read())
                    return [{**r, "name": data[str(r["user_id"])]["name"]} for r in part]

                parts = [rows[i : i + chunk] for i in range(0, len(rows), chunk)]
                return [r for done in await asyncio.gather(*(one(p) for p in parts)) for r in done]

        for batch in batches:
            yield pa.RecordBatch.from_pylist(asyncio.run(enrich(batch.to_pylist())))

    return run


def hand_redis(redis_url: str, mget: int | None, concurrency: int = 100) -> Callable[[Any], Any]:
    def run(batches: Any) -> Any:
        import asyncio
        import gc

        gc.set_threshold(700, 10, 10)  # Python's defaults, as in a fresh worker (ours tunes them)

        import pyarrow as pa
        import redis.asyncio as aredis

        async def enrich(rows: list[dict]) -> list[dict]:
            client = aredis.Redis.from_url(redis_url, max_connections=concurrency)
            try:
                if mget:
                    out = []
                    for i in range(0, len(rows), mget):
                        part = rows[i : i + mget]
                        values = await client.mget([f"price:{r['user_id']}" for r in part])
                        out += [
                            {**r, "price": json.loads(v)["price"]} for r, v in zip(part, values, strict=True)
                        ]
                    return out
                sem = asyncio.Semaphore(concurrency)

                async def one(row: dict) -> dict:
                    async with sem:
                        value = await client.get(f"price:{row['user_id']}")
                    return {**row, "price": json.loads(value)["price"]}

                return await asyncio.gather(*(one(r) for r in rows))
            finally:
                await client.aclose()

        for batch in batches:
            yield pa.RecordBatch.from_pylist(asyncio.run(enrich(batch.to_pylist())))

    return run


def seed_prices(redis_url: str, keys: int = KEYS) -> None:
    """``price:<i>`` for ``keys`` keys, as JSON."""
    import redis

    client = redis.Redis.from_url(redis_url)
    for start in range(0, keys, 10_000):
        pipe = client.pipeline(transaction=False)
        for i in range(start, min(keys, start + 10_000)):
            pipe.set(f"price:{i}", json.dumps({"price": i / 10}))
        pipe.execute()
    client.close()


def distinct_source(spark: Any, n: int) -> DataFrame:
    """As ``source``, but every row looks up a key of its own (``user_id`` = ``seq``)."""
    from pyspark.sql import functions as F

    return spark.range(n).select(
        F.col("id").alias("seq"), (F.col("id") % KEYS).alias("order_id"), F.col("id").alias("user_id")
    )


def pairs(
    spark: Any, url: str, redis_url: str, rows: int, redis_rows: int
) -> dict[str, tuple[Job, Job, int]]:
    """Per path: (ours, hand-written, rows)."""
    common: dict[str, Any] = {"num_partitions": 2, "timeout": 10.0, "retry": RETRY}
    users = HttpLookup(url + "/users/{user_id}", fields=[Field("name")], max_connections=200)
    batched = HttpLookup(
        url + "/users/{user_id}", batch_url=url + "/users/batch", fields=[Field("name")], max_connections=200
    )
    prices = RedisLookup(redis_url, "price:{user_id}", fields=[Field("price", "float")])
    http_schema = "seq long, order_id long, user_id long, name string"
    redis_schema = "seq long, order_id long, user_id long, price double"

    def hand(n: int, fn: Any, schema: str) -> Job:
        return lambda: source(spark, n).repartition(2).mapInArrow(fn, schema)

    def mget(capacity: int) -> tuple[Job, Job, int]:
        """MGETs of 500 (the hand-written job's one at a time), ours with ``capacity``."""
        return (
            lambda: AsyncDataStream.key_ordered_wait(
                source(spark, redis_rows), prices, "order_id", capacity=capacity, batch_size=500, **common
            ),
            hand(redis_rows, hand_redis(redis_url, 500), redis_schema),
            redis_rows,
        )

    def sql() -> DataFrame:
        source(spark, rows).repartition(2).createOrReplaceTempView("cpu_orders")
        return spark.sql("SELECT *, users(user_id) AS u FROM cpu_orders")

    def sql_table() -> DataFrame:
        source(spark, rows).repartition(2).createOrReplaceTempView("cpu_orders")
        return spark.sql(
            "SELECT * FROM async_lookup(TABLE(cpu_orders), 'users',"
            " upsert_key => 'order_id', order_by => 'seq')"
        )

    return {
        "http": (
            lambda: AsyncDataStream.key_ordered_wait(
                source(spark, rows), users, "order_id", capacity=100, **common
            ),
            hand(rows, hand_written(url, 100), http_schema),
            rows,
        ),
        "http_200": (
            lambda: AsyncDataStream.key_ordered_wait(
                source(spark, rows), users, "order_id", capacity=200, **common
            ),
            hand(rows, hand_written(url, 200), http_schema),
            rows,
        ),
        "http_batch": (
            lambda: AsyncDataStream.key_ordered_wait(
                source(spark, rows), batched, "order_id", capacity=2000, batch_size=100, **common
            ),
            hand(rows, hand_http_batch(url), http_schema),
            rows,
        ),
        "redis": (
            lambda: AsyncDataStream.key_ordered_wait(
                source(spark, redis_rows), prices, "order_id", capacity=100, batch_size=None, **common
            ),
            hand(redis_rows, hand_redis(redis_url, None), redis_schema),
            redis_rows,
        ),
        "redis_mget": mget(500),
        "redis_mget_5000": mget(5000),
        "redis_mget_backlog": (
            lambda: AsyncDataStream.key_ordered_wait(
                distinct_source(spark, redis_rows), prices, "order_id", batch_size=500, backlog=True, **common
            ),
            lambda: (
                distinct_source(spark, redis_rows)
                .repartition(2)
                .mapInArrow(hand_redis(redis_url, 500), redis_schema)
            ),
            redis_rows,
        ),
        "sql": (sql, hand(rows, hand_written(url, 100), http_schema), rows),
        "sql_table": (sql_table, hand(rows, hand_written(url, 100), http_schema), rows),
    }


def _split_text(runs: list[Split]) -> str:
    """The medians of a job's CPU per row by process, in microseconds."""
    medians = (statistics.median(getattr(r, name) for r in runs) for name in ("workers", "jvm", "driver"))
    return split_text(Split(0.0, *medians))


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--redis-rows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--paths",
        default="http,http_200,http_batch,redis,redis_mget,redis_mget_5000,redis_mget_backlog,sql,sql_table",
    )
    parser.add_argument("--plain", action="store_true", help="ours without the fast extra")
    parser.add_argument("--python-gc", action="store_true", help="ours with Python's collector settings")
    parser.add_argument(
        "--aiohttp", action="store_true", help="ours with aiohttp's client (KAW_HTTP=aiohttp)"
    )
    parser.add_argument("--service", choices=SERVICES, default="python", help="what answers HTTP lookups")
    args = parser.parse_args()
    if args.service == "nginx" and "http_batch" in args.paths.split(","):
        parser.error("--service nginx serves no batch endpoint: leave http_batch out of --paths")
    # read by the workers, whose environment is fixed when Spark starts
    if args.plain:
        os.environ.update(KAW_EVENT_LOOP="asyncio", KAW_JSON="json")
    if args.aiohttp:
        os.environ.update(KAW_HTTP="aiohttp")
    if args.python_gc:
        os.environ.update(KAW_GC="default")
    spark = local_spark()
    with lookup_service(args.service, 0.02) as url, redis_url_or_embedded() as redis_url:
        import sql_ext

        seed_prices(redis_url, max(KEYS, args.redis_rows))
        sql_ext.install(spark, {"users": HttpLookup(url + "/users/{user_id}", fields=[Field("name")])})
        for key, value in {**SQL_SETTINGS, "buffer-capacity": "100"}.items():  # as the hand-written's
            spark.conf.set("spark.sql.exec.async-lookup." + key, value)
        jobs = pairs(spark, url, redis_url, args.rows, args.redis_rows)
        kind = "without the fast extra" if args.plain else "with the fast extra (uvloop, orjson, httptools)"
        kind += ", Python's collector settings" if args.python_gc else ", collector tuned"
        kind += ", aiohttp's client" if args.aiohttp else ""
        print(
            f"local[2], medians of {args.rounds} interleaved rounds; CPU: Spark's Python workers; ours {kind}"
        )
        print(f"  calibration loop before: {calibration():.3f} CPU s")
        print(
            f"  {'path':<19} {'ours rows/s':>12} {'hand rows/s':>12} {'rows/s ratio':>12}"
            f" {'ours CPU':>9} {'hand CPU':>9}  CPU ratio  per pair: median (range)"
        )
        for path in args.paths.split(","):
            ours, hand, n = jobs[path]
            measure(ours, n), measure(hand, n)  # warm up both
            got: dict[str, list[Split]] = {"ours": [], "hand": []}
            for _ in range(args.rounds):
                got["ours"].append(measure_split(ours, n))
                got["hand"].append(measure_split(hand, n))
            rate = {k: statistics.median(s.rate for s in v) for k, v in got.items()}
            cpu = {k: statistics.median(s.workers for s in v) for k, v in got.items()}
            # each round's two jobs ran back to back: their ratio cancels the machine's drift
            paired = [o.workers / h.workers for o, h in zip(got["ours"], got["hand"], strict=True)]
            print(
                f"  {path:<19} {rate['ours']:>12,.0f} {rate['hand']:>12,.0f}"
                f" {rate['ours'] / rate['hand']:>11.2f}x {cpu['ours']:>8.4f}s "
                f"{cpu['hand']:>8.4f}s  {cpu['ours'] / cpu['hand']:5.2f}x"
                f"  {statistics.median(paired):5.2f}x ({min(paired):.2f}-{max(paired):.2f})"
                f"   (CPU s per 1,000 rows; {n:,} rows)"
            )
            print("  " + "; ".join(f"{side}: {_split_text(got[side])}" for side in ("ours", "hand")))
        print(f"  calibration loop after: {calibration():.3f} CPU s")
    spark.stop()


if __name__ == "__main__":
    main()

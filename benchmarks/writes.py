"""Fenced writes against hand-written unfenced ones, in one run: rows/s and CPU per row.

    ./run bench writes [--rows N] [--rounds R] [--http-rows M]

Redis: ``key_ordered_wait`` with a ``RedisWrite`` (SET of two fields, fenced by ``seq`` in one
Lua script per write, batches of 500 pipelined; capacity 5000), and the same through
``unordered_wait`` (no repartition, sort or key order; still fenced), against a hand-written
``mapInArrow`` that pipelines plain SETs of the same JSON, 500 at a time (no ordering, no
fencing, no retries). HTTP: ``key_ordered_wait`` with an ``HttpWrite`` (PUT with the version
headers, capacity 200) against a hand-written ``mapInArrow`` + aiohttp PUT loop, 200 in flight,
to the service's fenced ``/records`` (20 ms). ``local[2]``, 2,000 keys, rows in seq order, the
jobs interleaved for R rounds, medians; CPU is Spark's Python workers' (as ``cpu.py``). Each
round writes into fresh keys, so every fenced write is applied (the work a first run does).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import uuid
from collections.abc import Callable
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from pyspark.sql import DataFrame

from keyed_async_wait import AsyncDataStream
from keyed_async_wait.app.embedded import redis_url_or_embedded
from lookup import HttpWrite, RedisWrite

sys.path.insert(0, os.path.dirname(__file__))
from cpu import measure
from lookup_throughput import service_process
from spark_throughput import local_spark, source

SCHEMA = "seq long, order_id long, user_id long"


def hand_redis_sets(redis_url: str, prefix: str, chunk: int = 500) -> Callable[[Any], Any]:
    def run(batches: Any) -> Any:
        import asyncio

        import redis.asyncio as aredis

        async def write(rows: list[dict]) -> None:
            client = aredis.Redis.from_url(redis_url)
            try:
                for i in range(0, len(rows), chunk):
                    async with client.pipeline(transaction=False) as pipe:
                        for r in rows[i : i + chunk]:
                            pipe.set(
                                f"{prefix}:{r['order_id']}",
                                json.dumps({"seq": r["seq"], "user_id": r["user_id"]}),
                            )
                        await pipe.execute()
            finally:
                await client.aclose()

        for batch in batches:
            asyncio.run(write(batch.to_pylist()))
            yield batch

    return run


def hand_http_puts(url: str, concurrency: int = 200) -> Callable[[Any], Any]:
    def run(batches: Any) -> Any:
        import asyncio

        import aiohttp

        async def write(rows: list[dict]) -> None:
            sem = asyncio.Semaphore(concurrency)
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:

                async def one(r: dict) -> None:
                    async with (
                        sem,
                        session.put(f"{url}/records/{r['order_id']}", json={"seq": r["seq"]}) as resp,
                    ):
                        await resp.read()

                await asyncio.gather(*(one(r) for r in rows))

        for batch in batches:
            asyncio.run(write(batch.to_pylist()))
            yield batch

    return run


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--http-rows", type=int, default=40_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    spark = local_spark()
    figures: dict[str, list[tuple[float, float]]] = {}

    def pair(
        label: str, ours: Callable[[str], DataFrame], hand: Callable[[str], DataFrame], rows: int
    ) -> None:
        for _ in range(args.rounds):
            for name, job in ((f"{label}: ours", ours), (f"{label}: hand-written", hand)):
                prefix = f"b{uuid.uuid4().hex[:8]}"
                figures.setdefault(name, []).append(measure(lambda job=job, prefix=prefix: job(prefix), rows))

    with redis_url_or_embedded() as redis_url:
        n = args.rows

        def redis_ours(prefix: str) -> DataFrame:
            write = RedisWrite(redis_url, prefix + ":{order_id}", fields=["seq", "user_id"], version="seq")
            return AsyncDataStream.key_ordered_wait(
                source(spark, n), write, "order_id", order_by="seq", num_partitions=2, capacity=5000,
                batch_size=500,
            )  # fmt: skip

        def redis_hand(prefix: str) -> DataFrame:
            return source(spark, n).repartition(2).mapInArrow(hand_redis_sets(redis_url, prefix), SCHEMA)

        def redis_unordered(prefix: str) -> DataFrame:
            write = RedisWrite(redis_url, prefix + ":{order_id}", fields=["seq", "user_id"], version="seq")
            return AsyncDataStream.unordered_wait(source(spark, n), write, capacity=5000, batch_size=500)

        pair("Redis SET", redis_ours, redis_hand, n)
        pair("Redis SET, unordered_wait", redis_unordered, redis_hand, n)
    with service_process(0.02) as url:
        m = args.http_rows

        def http_ours(prefix: str) -> DataFrame:
            write = HttpWrite(url + "/records/" + prefix + "-{order_id}", fields=["seq"], version="seq")
            return AsyncDataStream.key_ordered_wait(
                source(spark, m), write, "order_id", order_by="seq", num_partitions=2, capacity=200
            )

        def http_hand(prefix: str) -> DataFrame:
            return source(spark, m).repartition(2).mapInArrow(hand_http_puts(url), SCHEMA)

        pair("HTTP PUT", http_ours, http_hand, m)
    spark.stop()
    print(f"{'job':<40} {'rows/s':>10} {'CPU s/1k':>9}")
    for name, runs in figures.items():
        rate, cpu = statistics.median(r for r, _ in runs), statistics.median(c for _, c in runs)
        print(f"{name:<40} {rate:>10,.0f} {cpu:>9.3f}")
    for label in ("Redis SET", "Redis SET, unordered_wait", "HTTP PUT"):
        ours, hand = figures[f"{label}: ours"], figures[f"{label}: hand-written"]
        rate = statistics.median(r for r, _ in ours) / statistics.median(r for r, _ in hand)
        cpu = statistics.median(c for _, c in ours) / statistics.median(c for _, c in hand)
        print(f"{label}: ours {rate:.2f}x the hand-written rows/s at {cpu:.2f}x its CPU per row")


if __name__ == "__main__":
    main()

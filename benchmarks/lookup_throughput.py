"""Lookups against real services, next to hand-written asyncio loops making the same calls.

    ./run bench lookup_throughput [--quick]

Redis (REDIS_URL, or the embedded redis-server): one GET per record vs MGET batches.
HTTP (the project's service in a separate process, 20 ms latency): one GET per record vs a
batch POST. And cache hits. Each connector runs through the operator; each baseline is a plain
asyncio loop with the same client library, concurrency and batch size.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import aiohttp
import pyarrow as pa
import redis
import redis.asyncio as aioredis

from keyed_async_wait.app.embedded import redis_url_or_embedded
from keyed_async_wait.app.service import free_port
from keyed_async_wait.operator import KeyedAsyncWaitOperator
from lookup import HttpLookup, PartialCache, RedisLookup


def timed(n: int, body: Callable[[], Awaitable[int]]) -> float:
    # inputs are built before timing; keep the collector from walking them again and again,
    # for the baseline and the connector alike
    gc.collect()
    gc.freeze()
    start = time.perf_counter()
    count = asyncio.run(body())  # type: ignore[arg-type]
    elapsed = time.perf_counter() - start
    gc.unfreeze()
    assert count == n, (count, n)
    return n / elapsed


def median_timed(n: int, body: Callable[[], Awaitable[int]], runs: int = 3) -> float:
    """The median of ``runs`` timings: the batched Redis rows vary by +-15% run to run."""
    return sorted(timed(n, body) for _ in range(runs))[runs // 2]


def row(label: str, rate: float, base: float | None = None) -> None:
    ratio = f"{rate / base:6.2f}x" if base else ""
    print(f"  {label:<52} {rate:>12,.0f} /s {ratio}")


async def through_operator(fn: Any, records: list[dict], **kw: Any) -> int:
    op = KeyedAsyncWaitOperator(fn, mode="unordered", key="id", output="pairs", **kw)
    count = 0
    try:
        async for chunk in op.process_batches(
            [records[i : i + 10_000] for i in range(0, len(records), 10_000)]
        ):
            count += len(chunk)
    finally:
        await fn.aclose()
    return count


def bench_redis(url: str, n: int) -> None:
    client = redis.Redis.from_url(url)
    pipe = client.pipeline(transaction=False)
    for i in range(n):
        pipe.set(f"item:{i}", json.dumps({"id": i, "price": i * 0.5}))
    pipe.execute()
    keys = [f"item:{i}" for i in range(n)]
    records = [{"id": i} for i in range(n)]
    id_batches = [  # the columnar path's input, built before timing like the others'
        pa.RecordBatch.from_arrays([pa.array(range(i, min(n, i + 10_000)))], ["id"])
        for i in range(0, n, 10_000)
    ]
    print(f"\nRedis, {n:,} lookups of distinct keys ({url})")

    async def hand_get() -> int:
        r = aioredis.from_url(url, max_connections=100)
        sem = asyncio.Semaphore(100)

        async def one(k: str) -> Any:
            async with sem:
                return json.loads(await r.get(k))

        try:
            return len(await asyncio.gather(*(one(k) for k in keys)))
        finally:
            await r.aclose()

    async def hand_mget() -> int:
        r = aioredis.from_url(url)
        done = 0
        try:
            for i in range(0, n, 500):
                done += len([json.loads(v) for v in await r.mget(keys[i : i + 500])])
        finally:
            await r.aclose()
        return done

    base = timed(n, hand_get)
    row("hand-written: GET per key, 100 concurrent", base)
    rate = timed(
        n, lambda: through_operator(RedisLookup(url, "item:{id}"), records, capacity=100, batch_size=None)
    )
    row("RedisLookup: GET per record, capacity 100", rate, base)
    base = median_timed(n, hand_mget)
    row("hand-written: MGET of 500 keys (median of 3)", base)
    rate = median_timed(
        n, lambda: through_operator(RedisLookup(url, "item:{id}"), records, capacity=500, batch_size=500)
    )
    row("RedisLookup: MGET batches of 500, capacity 500", rate, base)
    rate = median_timed(
        n, lambda: through_operator(RedisLookup(url, "item:{id}"), records, capacity=5000, batch_size=500)
    )
    row("RedisLookup: MGET batches of 500, capacity 5000", rate, base)
    rate = median_timed(
        n, lambda: columnar(RedisLookup(url, "item:{id}"), id_batches, chunk=500, concurrency=1)
    )
    row("RedisLookup columnar (backlog path): MGET of 500, 1 at a time", rate, base)
    rate = median_timed(
        n, lambda: columnar(RedisLookup(url, "item:{id}"), id_batches, chunk=500, concurrency=8)
    )
    row("RedisLookup columnar (backlog path): MGET of 500, 8 at a time", rate, base)
    client.close()


async def columnar(lookup: Any, batches: list[Any], chunk: int, concurrency: int) -> int:
    """The backlog gear's columnar path: Arrow batches of ids in, result lists per key out."""
    path = lookup.columnar()
    done = 0
    try:
        for batch in batches:
            keys = path.column_keys(batch)
            results = await path.results_for_keys(list(dict.fromkeys(keys)), chunk, concurrency)
            done += len(results)
    finally:
        await lookup.aclose()
    return done


@contextlib.contextmanager
def service_process(latency: float, max_concurrent: int | None = None) -> Iterator[str]:
    port = free_port()
    cap = ["--max-concurrent", str(max_concurrent)] if max_concurrent is not None else []
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "keyed_async_wait.app.service",
            "--port",
            str(port),
            "--latency",
            str(latency),
            *cap,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "serving" not in line:
            raise RuntimeError(f"service did not start: {line!r}")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def bench_http(n_get: int, n_batch: int) -> None:
    with service_process(0.02) as url:
        print(f"\nHTTP, service answering after 20 ms (separate process, {url})")
        records = [{"id": i} for i in range(n_get)]

        async def hand_get() -> int:
            sem = asyncio.Semaphore(100)
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=100)) as session:

                async def one(i: int) -> Any:
                    async with sem, session.get(f"{url}/users/{i}") as resp:
                        return json.loads(await resp.read())

                return len(await asyncio.gather(*(one(r["id"]) for r in records)))

        base = timed(n_get, hand_get)
        row(f"hand-written: GET per record, 100 concurrent ({n_get:,})", base)
        fn = HttpLookup(url + "/users/{id}", max_connections=100)
        rate = timed(n_get, lambda: through_operator(fn, records, capacity=100, batch_size=None))
        row("HttpLookup: GET per record, capacity 100", rate, base)

        records = [{"id": i} for i in range(n_batch)]

        async def hand_batch() -> int:
            sem = asyncio.Semaphore(10)
            async with aiohttp.ClientSession() as session:

                async def one(ids: list[int]) -> int:
                    async with sem, session.post(f"{url}/users/batch", json=ids) as resp:
                        return len(json.loads(await resp.read()))

                chunks = [list(range(i, min(i + 100, n_batch))) for i in range(0, n_batch, 100)]
                return sum(await asyncio.gather(*(one(c) for c in chunks)))

        base = timed(n_batch, hand_batch)
        row(f"hand-written: POST of 100 ids, 10 concurrent ({n_batch:,})", base)
        fn = HttpLookup(url + "/users/{id}", batch_url=url + "/users/batch")
        rate = timed(n_batch, lambda: through_operator(fn, records, capacity=1000, batch_size=100))
        row("HttpLookup: batch POST of 100, capacity 1000", rate, base)


def bench_cache(n: int) -> None:
    print(f"\nCache hits, {n:,} lookups over 1,000 cached keys (no service call)")
    records = [{"id": i % 1000} for i in range(n)]
    fn = HttpLookup(
        "http://127.0.0.1:1/users/{id}",
        batch_url="http://127.0.0.1:1/users/batch",
        cache=PartialCache(10_000),
    )
    for i in range(1000):
        fn.cache.put(str(i), {"id": i})  # type: ignore[union-attr]

    async def direct() -> int:
        out = await fn.invoke_batch(records)
        return len(out)

    row("HttpLookup.invoke_batch, all hits", timed(n, direct))
    rate = timed(n, lambda: through_operator(fn, records, capacity=10_000, batch_size=10_000))
    row("through the operator (process_batches), all hits", rate)

    async def per_record() -> int:
        op = KeyedAsyncWaitOperator(fn, mode="unordered", key="id", batch_size=None, capacity=1000)
        return len([x async for x in op.process(records)])

    row("through the operator, per record (eager: no task per hit)", timed(n, per_record))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smaller runs")
    args = parser.parse_args()
    scale = 5 if args.quick else 1
    with redis_url_or_embedded() as url:
        bench_redis(url, 200_000 // scale)
    bench_http(10_000 // scale, 100_000 // scale)
    bench_cache(1_000_000 // scale)


if __name__ == "__main__":
    main()

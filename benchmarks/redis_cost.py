"""CPU per row of ``RedisLookup``'s batches beside a pipelined redis-py loop, in one process.

    ./run bench redis_cost [--rows N] [--batch 500] [--rounds 5] [--json PATH]

Redis (REDIS_URL, or the embedded redis-server): N keys holding a JSON value each, looked up
once each, in batches of ``--batch``:

- the baselines, plain asyncio with redis-py: a pipeline of GETs per batch, and an MGET per
  batch, each value parsed with ``json.loads``, one batch at a time;
- ``RedisLookup(batch_size=B)`` through the operator (unordered, capacity B: one batch in
  flight), records as dicts in and out: the record path;
- the same lookup's columnar path (``backlog=True`` in Spark): Arrow batches of keys in, a
  result per key out, one batch at a time.

The figure is this process's CPU (user + system) per row, medians over ``--rounds``
interleaved rounds, and each one's ratio against the pipelined loop of the same round. Redis's
own CPU is the server's, the same for all, and not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pyarrow as pa
import redis
import redis.asyncio as aioredis

from keyed_async_wait.app.embedded import redis_url_or_embedded
from keyed_async_wait.operator import KeyedAsyncWaitOperator
from lookup import RedisLookup

Job = Callable[[], Awaitable[int]]


def jobs(url: str, rows: int, batch: int) -> dict[str, Job]:
    keys = [f"item:{i}" for i in range(rows)]
    records = [{"id": i} for i in range(rows)]
    columns = [
        pa.RecordBatch.from_arrays([pa.array(range(i, min(rows, i + batch)))], ["id"])
        for i in range(0, rows, batch)
    ]

    async def pipelined() -> int:
        client = aioredis.from_url(url)
        done = 0
        try:
            for i in range(0, rows, batch):
                pipe = client.pipeline(transaction=False)
                for key in keys[i : i + batch]:
                    pipe.get(key)
                done += len([json.loads(v) for v in await pipe.execute()])
        finally:
            await client.aclose()
        return done

    async def mget() -> int:
        client = aioredis.from_url(url)
        done = 0
        try:
            for i in range(0, rows, batch):
                done += len([json.loads(v) for v in await client.mget(keys[i : i + batch])])
        finally:
            await client.aclose()
        return done

    async def record_path() -> int:
        lookup = RedisLookup(url, "item:{id}")
        op = KeyedAsyncWaitOperator(
            lookup, mode="unordered", key="id", output="pairs", capacity=batch, batch_size=batch
        )
        done = 0
        try:
            async for chunk in op.process_batches([records[i : i + 10_000] for i in range(0, rows, 10_000)]):
                done += len(chunk)
        finally:
            await lookup.aclose()
        return done

    async def columnar() -> int:
        lookup = RedisLookup(url, "item:{id}")
        path = lookup.columnar()
        done = 0
        try:
            for keys_batch in columns:
                wanted = list(dict.fromkeys(path.column_keys(keys_batch)))
                done += len(await path.results_for_keys(wanted, batch, 1))
        finally:
            await lookup.aclose()
        return done

    return {
        "redis-py, a pipeline of GETs a batch": pipelined,
        "redis-py, an MGET a batch": mget,
        "RedisLookup, record path (operator)": record_path,
        "RedisLookup, columnar path": columnar,
    }


def cpu_of(job: Job, rows: int) -> float:
    """CPU seconds of this process per row over one run of ``job``."""
    gc.collect()
    started = time.process_time()
    count = asyncio.run(job())  # type: ignore[arg-type]
    spent = time.process_time() - started
    if count != rows:
        raise SystemExit(f"{count} of {rows} rows came back")
    return spent / rows


def fill(url: str, rows: int) -> None:
    client = redis.Redis.from_url(url)
    try:
        for start in range(0, rows, 1_000):
            pipe = client.pipeline(transaction=False)
            for i in range(start, min(rows, start + 1_000)):
                pipe.set(f"item:{i}", json.dumps({"id": i, "name": f"item-{i}", "price": i * 0.5}))
            pipe.execute()
    finally:
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    with redis_url_or_embedded() as url:
        fill(url, args.rows)
        found = jobs(url, args.rows, args.batch)
        per_row: dict[str, list[float]] = {name: [] for name in found}
        ratios: dict[str, list[float]] = {name: [] for name in found}
        for _ in range(args.rounds):  # interleaved: a slow spell of the machine falls on all alike
            this = {name: cpu_of(job, args.rows) for name, job in found.items()}
            base = this["redis-py, a pipeline of GETs a batch"]
            for name, seconds in this.items():
                per_row[name].append(seconds)
                ratios[name].append(seconds / base)
    print(f"{args.rows:,} keys, batches of {args.batch}, medians of {args.rounds} rounds; CPU per row:")
    figures = {}
    for name in found:
        us, ratio = statistics.median(per_row[name]) * 1e6, statistics.median(ratios[name])
        figures[name] = {"cpu_us_per_row": us, "of_pipelined": ratio}
        print(f"  {name:<40} {us:>6.1f} us  {ratio:.2f}x the pipelined loop")
    if args.json:
        args.json.write_text(
            json.dumps({"rows": args.rows, "batch": args.batch, "figures": figures}, indent=1)
        )


if __name__ == "__main__":
    main()

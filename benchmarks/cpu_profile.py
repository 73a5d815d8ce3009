"""One Spark task's Python work in this process, ours against hand-written, with a profile.

    ./run bench cpu_profile [--rows N] [--path http|http_batch|redis|redis_mget]
                            [--rounds R] [--keys K] [--capacity C] [--profile ours|hand] [--top K]
                            [--only ours|hand] [--cycles] [--service python|nginx]

What ``benchmarks/cpu.py`` measures inside Spark's workers, without Spark around it: the
``mapInArrow`` function of our ``key_ordered_wait`` (taken from the DataFrame call as Spark
would get it) and the hand-written one are run here on the same Arrow batches (10,000 rows
each, as Spark's ``maxRecordsPerBatch``), and their CPU time (this thread's) per 1,000 rows is
printed, interleaved, medians. The service runs in its own process, so the time is the client's.
``--profile`` runs one side under cProfile and prints the top functions by own time: this is
the tool for finding what our task pays that a hand-written loop does not. Per side it also
prints the garbage collections per task (young/middle/full) and their time; ``--cycles`` counts
the objects a task leaves in reference cycles; ``--capacity`` sets ours' capacity on the
``redis_mget`` path (500 by default, as ``benchmarks/cpu.py``; 5000 as its ``redis_mget_5000``);
``taskset -c 0`` in front pins the script and the Redis server it starts to one core, so
that neither side's CPU seconds include the other core's work running beside it (steadier
figures here); ``KAW_GC=default`` in the environment runs ours
without its collector tuning; ``--only`` runs one side, for a sampling profiler around the script
(``py-spy record -- .venv/bin/python benchmarks/cpu_profile.py --only ours``); ``--service nginx``
asks the nearly free nginx service of ``cheap_service.py`` on the ``http`` path.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

sys.path.insert(0, os.path.dirname(__file__))
from cheap_service import SERVICES, lookup_service
from cpu import hand_http_batch, hand_redis, seed_prices
from spark_throughput import KEYS, RETRY, hand_written, local_spark, source

from keyed_async_wait import AsyncDataStream
from keyed_async_wait.app.embedded import redis_url_or_embedded
from keyed_async_wait.spark.worker import CollectorWatch
from lookup import Field, HttpLookup, RedisLookup

TaskFn = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]


def task_function(df: Any, build: Callable[[], Any]) -> TaskFn:
    """The function our wait hands to ``mapInArrow`` (captured, not run by Spark)."""
    DataFrame = type(df)  # the session's DataFrame class (classic or Connect)
    got: list[TaskFn] = []
    original = DataFrame.mapInArrow

    def capture(self: Any, fn: TaskFn, schema: Any, *args: Any, **kwargs: Any) -> Any:
        got.append(fn)
        return original(self, fn, schema, *args, **kwargs)

    DataFrame.mapInArrow = capture  # type: ignore[method-assign]
    try:
        build()
    finally:
        DataFrame.mapInArrow = original  # type: ignore[method-assign]
    return got[0]


def input_batches(rows: int, keys_in_task: int, size: int = 10_000) -> list[pa.RecordBatch]:
    """A task's input: ``keys_in_task`` distinct keys taking turns (even numbers, as a task of
    Spark's hash partitioning over two partitions gets about half of the job's keys)."""
    seq = list(range(rows))
    keys = [(i % keys_in_task) * 2 for i in seq]
    table = pa.table({"seq": seq, "order_id": keys, "user_id": keys}, schema=schema_of())
    return table.to_batches(max_chunksize=size)


def schema_of() -> pa.Schema:
    return pa.schema([("seq", pa.int64()), ("order_id", pa.int64()), ("user_id", pa.int64())])


def run_once(fn: TaskFn, batches: list[pa.RecordBatch]) -> tuple[float, int]:
    """(CPU seconds of this thread, rows out) of one task."""
    start = time.thread_time()
    out = sum(b.num_rows for b in fn(iter(batches)))
    return time.thread_time() - start, out


def cycles(ours: TaskFn, hand: TaskFn, batches: list[pa.RecordBatch]) -> None:
    """Per side, the objects one task leaves in reference cycles (only the collector frees them),
    by type."""
    import collections
    import gc

    for name, fn in (("ours", ours), ("hand", hand)):
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            run_once(fn, batches)
            gc.collect()
            kinds = collections.Counter(type(o).__qualname__ for o in gc.garbage)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
        print(f"  {name}: {sum(kinds.values()):,} objects in cycles; {kinds.most_common(12)}")


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--path", default="http")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--keys", type=int, default=KEYS // 2, help="distinct keys in the task (a Spark task of cpu.py: half)"
    )
    parser.add_argument(
        "--capacity", type=int, default=500, help="ours' capacity on redis_mget (as in benchmarks/cpu.py)"
    )
    parser.add_argument("--profile", choices=["ours", "hand"], default=None)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--only", choices=["ours", "hand"], default=None, help="run one side (for py-spy)")
    parser.add_argument("--cycles", action="store_true", help="count the objects left in cycles")
    parser.add_argument("--service", choices=SERVICES, default="python", help="who answers the HTTP path")
    args = parser.parse_args()
    spark = local_spark()
    with lookup_service(args.service, 0.02) as url, redis_url_or_embedded() as redis_url:
        seed_prices(redis_url, max(KEYS, 2 * args.keys))
        common: dict[str, Any] = {"num_partitions": 2, "timeout": 10.0, "retry": RETRY}
        users = HttpLookup(url + "/users/{user_id}", fields=[Field("name")], max_connections=200)
        batched = HttpLookup(
            url + "/users/{user_id}",
            batch_url=url + "/users/batch",
            fields=[Field("name")],
            max_connections=200,
        )
        prices = RedisLookup(redis_url, "price:{user_id}", fields=[Field("price", "float")])
        df = source(spark, args.rows)
        kow = AsyncDataStream.key_ordered_wait
        jobs: dict[str, tuple[Callable[[], Any], TaskFn]] = {
            "http": (lambda: kow(df, users, "order_id", capacity=100, **common), hand_written(url, 100)),
            "http_batch": (
                lambda: kow(df, batched, "order_id", capacity=2000, batch_size=100, **common),
                hand_http_batch(url),
            ),
            "redis": (
                lambda: kow(df, prices, "order_id", capacity=100, batch_size=None, **common),
                hand_redis(redis_url, None),
            ),
            "redis_mget": (
                lambda: kow(df, prices, "order_id", capacity=args.capacity, batch_size=500, **common),
                hand_redis(redis_url, 500),
            ),
        }
        build, hand = jobs[args.path]
        ours = task_function(df, build)
        batches = input_batches(args.rows, args.keys)
        for fn in (ours, hand):  # warm up: the worker's loop, clients and connections
            run_once(fn, batches)
        if args.cycles:
            cycles(ours, hand, batches)
        if args.profile:
            profile = cProfile.Profile()
            profile.runcall(run_once, ours if args.profile == "ours" else hand, batches)
            pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)
        got: dict[str, list[float]] = {"ours": [], "hand": []}
        watch = CollectorWatch()  # the workers' own count of collections
        collected = {"ours": [0.0] * 4, "hand": [0.0] * 4}
        for _ in range(args.rounds):
            for name, fn in (("ours", ours), ("hand", hand)):
                if args.only not in (None, name):
                    got[name].append(1.0)
                    continue
                before = watch.sample()
                cpu, out = run_once(fn, batches)
                collected[name] = [
                    t + a - b for t, a, b in zip(collected[name], watch.sample(), before, strict=True)
                ]
                assert out == args.rows, (name, out)
                got[name].append(cpu / args.rows * 1000)
        med = {k: statistics.median(v) for k, v in got.items()}
        print(
            f"{args.path}: {args.rows:,} rows, CPU s per 1,000 rows (medians of {args.rounds}): "
            f"ours {med['ours']:.4f}  hand {med['hand']:.4f}  ratio {med['ours'] / med['hand']:.2f}x"
        )
        watch.close()
        for name, (young, middle, full, seconds) in collected.items():
            print(
                f"  {name}: garbage collections per task (young/middle/full) "
                f"{young / args.rounds:.1f}/{middle / args.rounds:.1f}/{full / args.rounds:.1f}, "
                f"{seconds / args.rounds * 1000:.1f} ms"
            )
    spark.stop()


if __name__ == "__main__":
    main()

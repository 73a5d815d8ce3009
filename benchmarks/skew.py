"""Key order at production shapes: hot keys, side by side in one run.

    ./run bench skew [--rows N] [--quick]

``key_ordered_wait`` (local[2], capacity 200, every other option at its default) over an
``async def`` that takes 20 ms and returns when it finished, for N rows (100,000) of:
uniform keys (2,000); one key holding 2% and one holding 10% of the rows (the others uniform
over 2,000); Zipf 1.1 over 100,000 keys (the top key about 13% of the rows). For each: the other
keys' p50 / p99 finish (seconds from the start of the job to a key's last record), the hot
key's finish against its serial floor (its records one after another, 20 ms each), the slowest
key against the later of its own floor and the uniform run's p99, both counted from the job's
first call (Spark's shuffle before it is the same for every key; the target: at most 1.1x), the
rows set aside on local disk, and the peak memory (RSS) of the Python workers. Then 2,000 fenced
HTTP upserts of one key (``HttpWrite``, the service answering after 20 ms), with and without
``coalesce=True``: wall time, writes sent, and whether the store ends at the newest version.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

import psutil

from keyed_async_wait import AsyncDataStream
from keyed_async_wait.app.service import ServiceState, run_service
from keyed_async_wait.operator import KeyedAsyncWaitOperator
from lookup import HttpWrite

sys.path.insert(0, os.path.dirname(__file__))
from spark_throughput import calibration, local_spark

LATENCY = 0.02


async def slow(record: dict) -> dict:
    """The service: 20 ms, then when it finished."""
    await asyncio.sleep(LATENCY)
    return {"done": time.time()}


def uniform(n: int, keys: int = 2_000) -> list[int]:
    return [i % keys for i in range(n)]


def one_hot(n: int, share: float, keys: int = 2_000) -> list[int]:
    """Key 0 holds ``share`` of the rows, spread through the input; the rest uniform."""
    rng = random.Random(7)
    return [0 if rng.random() < share else 1 + i % (keys - 1) for i in range(n)]


def zipf(n: int, keys: int = 100_000, s: float = 1.1) -> list[int]:
    rng = random.Random(7)
    weights = [1 / (k + 1) ** s for k in range(keys)]
    return rng.choices(range(keys), weights=weights, k=n)


@contextmanager
def worker_memory() -> Iterator[dict[str, float]]:
    """The peak RSS (MB) of any one Python worker and of all of them together, sampled every
    0.2 s while the block runs."""
    peak = {"one": 0.0, "all": 0.0}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.2):
            sizes = []
            for proc in psutil.process_iter(["cmdline", "memory_info"]):
                line = " ".join(proc.info["cmdline"] or [])
                if "pyspark.daemon" in line or "pyspark.worker" in line:
                    sizes.append(proc.info["memory_info"].rss / 2**20)
            if sizes:
                peak["one"] = max(peak["one"], max(sizes))
                peak["all"] = max(peak["all"], sum(sizes))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield peak
    finally:
        stop.set()
        thread.join(5)


def run_case(spark: Any, label: str, keys: list[int], floor_p99: float | None) -> float:
    """One input through key_ordered_wait; prints its line; the other keys' p99 finish counted
    from the first call (the reference of the later cases)."""
    rows = [(seq, key) for seq, key in enumerate(keys)]
    df = spark.createDataFrame(rows, "seq long, k long")
    counts = Counter(keys)
    hot = counts.most_common(1)[0][0]
    with worker_memory() as memory:
        started = time.time()
        out = AsyncDataStream.key_ordered_wait(
            df, slow, "k", order_by="seq", capacity=200, output_schema="done double"
        ).collect()
        wall = time.time() - started
    last: dict[int, float] = defaultdict(float)
    for row in out:
        last[row.k] = max(last[row.k], row.done - started)
    # the first call started about LATENCY before the first answer: before it Spark ran the
    # shuffle's map side, a constant no key's floor holds
    first_call = min(row.done for row in out) - started - LATENCY
    others = sorted(t for k, t in last.items() if k != hot)
    p50, p99 = statistics.median(others), others[int(0.99 * (len(others) - 1))]
    hot_floor = counts[hot] * LATENCY
    reference = floor_p99 if floor_p99 is not None else p99 - first_call
    worst = max((last[k] - first_call) / max(counts[k] * LATENCY, reference) for k in last)
    print(
        f"  {label:<34} rows {len(out):>7,}  others p50 {p50:6.1f} s  p99 {p99:6.1f} s  "
        f"hot key ({counts[hot]:,} rows) {last[hot]:6.1f} s / floor {hot_floor:6.1f} s  "
        f"slowest key {worst:4.2f}x  job {wall:6.1f} s  worker RSS peak {memory['one']:5.0f} MB "
        f"(all {memory['all']:5.0f} MB)",
        flush=True,
    )
    return p99 - first_call


async def upserts(url: str, coalesce: bool, n: int) -> tuple[float, int]:
    write = HttpWrite(url + "/records/{id}", fields=["v"], version="v", coalesce=coalesce)
    op = KeyedAsyncWaitOperator(write, mode="key_ordered", key="id", output="pairs", capacity=200)
    started = time.perf_counter()
    out = [pair async for pair in op.process({"id": 1, "v": v} for v in range(n))]
    wall = time.perf_counter() - started
    await write.aclose()
    assert len(out) == n
    return wall, write.stats.requests


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--quick", action="store_true", help="20,000 rows")
    parser.add_argument("--upserts", type=int, default=2_000)
    args = parser.parse_args()
    n = 20_000 if args.quick else args.rows
    print(f"calibration loop before: {calibration():.3f} CPU s")
    spark = local_spark()
    print(f"{n:,} rows, an async def taking 20 ms, key_ordered_wait, local[2], capacity 200:")
    # the Python workers started and warm (the first wait of a session pays seconds for it,
    # which would count against the uniform case every other case is measured by)
    warm = spark.createDataFrame([(i, i % 100) for i in range(2_000)], "seq long, k long")
    AsyncDataStream.key_ordered_wait(warm, slow, "k", order_by="seq", output_schema="done double").collect()
    uniform_p99 = run_case(spark, "uniform, 2,000 keys", uniform(n), None)
    run_case(spark, "one key 2% of the rows", one_hot(n, 0.02), uniform_p99)
    run_case(spark, "one key 10% of the rows", one_hot(n, 0.10), uniform_p99)
    run_case(spark, "Zipf 1.1 over 100,000 keys", zipf(n), uniform_p99)
    spark.stop()
    print(f"{args.upserts:,} fenced HTTP upserts of one key, the service answering after 20 ms:")
    with run_service(ServiceState(latency=LATENCY)) as (url, state):
        for coalesce in (False, True):
            state.records.clear()
            wall, sent = asyncio.run(upserts(url, coalesce, args.upserts))
            newest = state.records["1"][1] == {"v": args.upserts - 1}
            print(
                f"  coalesce={coalesce!s:<5}  {wall:7.2f} s  writes sent {sent:>5,}  "
                f"store at the newest version: {newest}",
                flush=True,
            )
    print(f"calibration loop after: {calibration():.3f} CPU s (the machine's speed: lower is quieter)")


if __name__ == "__main__":
    main()

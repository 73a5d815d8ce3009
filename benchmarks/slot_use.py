"""How busy the operator keeps its places when every call takes the same time, beside a plain
pool of coroutines in the same run.

    ./run bench slot_use [--records N] [--capacity C] [--latency-ms MS] [--repeats R]

A call that sleeps MS milliseconds (a service with a fixed latency that costs nothing, as the
throughput benchmarks' echo service), N records over 2,000 keys in chunks of 10,000 through
``process_batches`` (as a Spark task feeds it), on uvloop (as the workers run) and on asyncio.
Printed per output mode and for the pool: rows/s, the run's time against the floor (N / C
rounds of MS), and the share of the places busy (the calls' own time over C times the run's).
The pool is C coroutines each taking the next record as its call ends: nothing between a call
and the next but the loop. The gap between the two is what the operator's own turns cost a
call that finished (handing its result out, freeing its place, admitting the next record),
not CPU alone: the calls of one round end in the same millisecond, and ``process_batches``
takes their results in groups (up to 25) and refills their places a group at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable, Coroutine
from typing import Any

import uvloop

from keyed_async_wait.operator import KeyedAsyncWaitOperator, OutputMode

KEYS = 2_000
CHUNK = 10_000


class Timed:
    """The call: sleeps ``latency`` seconds and adds its own time up."""

    def __init__(self, latency: float) -> None:
        self.latency, self.busy = latency, 0.0

    async def __call__(self, record: dict[str, Any]) -> dict[str, Any]:
        started = time.perf_counter()
        await asyncio.sleep(self.latency)
        self.busy += time.perf_counter() - started
        return {"v": record["v"]}


async def through_operator(mode: OutputMode, call: Timed, rows: list[dict[str, Any]], capacity: int) -> int:
    op = KeyedAsyncWaitOperator(call, mode=mode, key="k", capacity=capacity, output="pairs")
    chunks = [rows[i : i + CHUNK] for i in range(0, len(rows), CHUNK)]
    count = 0
    async for out in op.process_batches(iter(chunks)):
        count += len(out)
    return count


async def through_pool(call: Timed, rows: list[dict[str, Any]], capacity: int) -> int:
    source = iter(rows)
    done = 0

    async def worker() -> None:
        nonlocal done
        for record in source:
            await call(record)
            done += 1

    await asyncio.gather(*(worker() for _ in range(capacity)))
    return done


def measured(
    body: Callable[[Timed], Coroutine[Any, Any, int]], latency: float, n: int, capacity: int, loop: str
) -> tuple[float, float]:
    """(the run's time over the floor, the share of places busy) of one run."""
    call = Timed(latency)
    runner = uvloop.run if loop == "uvloop" else asyncio.run
    started = time.perf_counter()
    count = runner(body(call))
    wall = time.perf_counter() - started
    assert count == n, (count, n)
    return wall / (n / capacity * latency), call.busy / (capacity * wall)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=12_500)
    parser.add_argument("--capacity", type=int, default=200)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    n, capacity, latency = args.records, args.capacity, args.latency_ms / 1000
    rows = [{"k": i % KEYS, "v": i} for i in range(n)]
    jobs: dict[str, Callable[[Timed], Coroutine[Any, Any, int]]] = {
        "pool of coroutines": lambda call: through_pool(call, rows, capacity)
    }
    for mode in (OutputMode.KEY_ORDERED, OutputMode.UNORDERED, OutputMode.ORDERED):
        jobs[f"operator, {mode.name.lower()}"] = lambda call, mode=mode: through_operator(
            mode, call, rows, capacity
        )
    shape = f"{n:,} records, {KEYS:,} keys, capacity {capacity}, calls of {args.latency_ms:g} ms"
    print(f"{shape}; median of {args.repeats} runs")
    print(f"{'job':<24} {'loop':<8} {'x floor':>8} {'places busy':>12}")
    for loop in ("uvloop", "asyncio"):
        for label, job in jobs.items():
            runs = [measured(job, latency, n, capacity, loop) for _ in range(args.repeats)]
            over, busy = (statistics.median(column) for column in zip(*runs, strict=True))
            print(f"{label:<24} {loop:<8} {over:>8.3f} {busy:>12.3f}")


if __name__ == "__main__":
    main()

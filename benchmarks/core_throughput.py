"""Records per second through the operator, next to a bare asyncio.gather in the same run.

    ./run bench core_throughput [--records N]

For each mode, with 1 and 10,000 distinct keys: a no-op action that finishes at once, and one
that yields to the event loop once (as any real I/O does). Then a batching no-op action
through process_batches. Prints figures and ratios against gather over one coroutine per record.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
from collections.abc import Callable, Coroutine
from typing import Any

from keyed_async_wait import AsyncFunction
from keyed_async_wait.operator import KeyedAsyncWaitOperator, OutputMode


async def noop(record: dict) -> dict:
    return record


async def yielding(record: dict) -> dict:
    await asyncio.sleep(0)
    return record


class BatchNoop(AsyncFunction[dict, dict]):
    async def invoke(self, record: dict) -> list[dict]:
        return [record]

    async def invoke_batch(self, records: list[dict]) -> list[list[dict]]:
        return [[r] for r in records]


def best_rate(n: int, body: Callable[[], Coroutine[Any, Any, int]], repeats: int) -> float:
    rates = []
    for _ in range(repeats):
        # the inputs are built before timing; keep the collector from walking them again and
        # again, for the baseline and the operator alike (a Spark worker holds one batch at a time)
        gc.collect()
        gc.freeze()
        start = time.perf_counter()
        count = asyncio.run(body())
        elapsed = time.perf_counter() - start
        gc.unfreeze()
        assert count == n, (count, n)
        rates.append(n / elapsed)
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    n = args.records

    def records(keys: int) -> list[dict]:
        return [{"k": i % keys, "v": i} for i in range(n)]

    Body = Callable[[], Coroutine[Any, Any, int]]

    def gather_of(action: Callable[[dict], Coroutine[Any, Any, dict]]) -> Body:
        data = records(10_000)

        async def body() -> int:
            return len(await asyncio.gather(*(action(r) for r in data)))

        return body

    def operator_of(action: Any, mode: OutputMode, keys: int, eager: bool, capacity: int = 100) -> Body:
        data = records(keys)

        async def body() -> int:
            op = KeyedAsyncWaitOperator(action, mode=mode, key="k", capacity=capacity, eager_start=eager)
            count = 0
            async for _ in op.process(data):
                count += 1
            return count

        return body

    print(f"records per run: {n:,}; median of {args.repeats} runs; capacity 100 (Flink's default)")
    variants = (
        ("no-op action, a task per record (default)", noop, False),
        ("no-op action, eager_start=True (a task only if it suspends)", noop, True),
        ("action that yields once, a task per record (default)", yielding, False),
    )
    for label, action, eager in variants:
        base = best_rate(n, gather_of(action), args.repeats)
        print(f"\n{label}: bare asyncio.gather, one coroutine per record: {base:,.0f} rec/s")
        print(f"{'mode':<12} {'keys':>6} {'rec/s':>12} {'x gather':>9}")
        for mode in OutputMode:
            for keys in (1, 10_000):
                rate = best_rate(n, operator_of(action, mode, keys, eager), args.repeats)
                print(f"{mode.name:<12} {keys:>6} {rate:>12,.0f} {rate / base:>8.2f}x")

    batch_n = n * 5
    data = [{"k": i % 10_000, "v": i} for i in range(batch_n)]
    chunks = [data[i : i + 10_000] for i in range(0, batch_n, 10_000)]
    base = best_rate(n, gather_of(noop), args.repeats)
    print(f"\nbatching no-op action (invoke_batch), process_batches, {batch_n:,} records in chunks of 10,000")
    print(f"{'mode':<12} {'keys':>6} {'rec/s':>12} {'x gather':>9}")
    for mode in OutputMode:

        async def body(mode: OutputMode = mode) -> int:
            op = KeyedAsyncWaitOperator(BatchNoop(), mode=mode, key="k", capacity=10_000, batch_size=10_000)
            count = 0
            async for chunk in op.process_batches(chunks):
                count += len(chunk)
            return count

        rate = best_rate(batch_n, body, args.repeats)
        print(f"{mode.name:<12} {10_000:>6} {rate:>12,.0f} {rate / base:>8.2f}x")


if __name__ == "__main__":
    main()

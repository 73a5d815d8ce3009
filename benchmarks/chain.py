"""A two-step chain against two waits one after the other, and against one async function
doing both calls; then the calls a crash repeats.

    ./run bench chain [--rows N] [--rounds R] [--crash-records M]

1. Throughput (Spark, local[2], a 20 ms HTTP service in its own process, 2,000 keys): per
   record, the customer (``/users/{user_id}``), then the customer's boss (``/users/{boss}``,
   a field of the first answer), key-ordered by ``order_id``:
   - ``Chain(Step("customer", ...), Step("boss", ...))`` in one ``key_ordered_wait``;
   - the same chain with the second step through the service's batch endpoint
     (``linger=0.005``: the records that reach it within 5 ms are one call);
   - two ``key_ordered_wait`` calls, the second over the first's output;
   - one ``async def`` awaiting both lookups.
   Interleaved for R rounds (A B C, A B C, ...); medians and ratios against the one function.
2. A crash (the operator, with the service in this process logging calls): M records run, a
   snapshot is taken halfway through the output (as a checkpoint would), the operator is
   dropped with records in flight, and a new one restored from the snapshot bytes finishes.
   Reported: calls repeated per step, and finished steps called again: for the chain, the
   steps its snapshot records as done (0 expected: at-least-once only for the step in
   flight); for the one function, which has no steps, calls the service had answered before
   the crash (an upper bound: an answer may still have been on its way).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from contextlib import aclosing
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from pyspark.sql import DataFrame

from keyed_async_wait import AsyncDataStream, Chain, Step
from keyed_async_wait.app.service import ServiceState, run_service
from keyed_async_wait.core.chain import ChainProgress
from keyed_async_wait.operator import KeyedAsyncWaitOperator, OperatorSnapshot
from lookup import Field, HttpLookup

sys.path.insert(0, os.path.dirname(__file__))
from lookup_throughput import service_process
from spark_throughput import RETRY, local_spark, rows_per_second, source

OUT = "name string, boss int, boss_name string"


def customer(url: str) -> HttpLookup:
    fields = [Field("name"), Field("boss", "int", path="id")]
    return HttpLookup(url + "/users/{user_id}", params={"step": "customer", "seq": "{seq}"}, fields=fields)


def batched_boss(url: str) -> HttpLookup:
    """The second step through the service's batch endpoint (one POST for many records)."""
    fields = [Field("boss_name", path="name")]
    return HttpLookup(
        url + "/users/{boss}", batch_url=url + "/users/batch", fields=fields, max_connections=200
    )


def boss(url: str) -> HttpLookup:
    return HttpLookup(
        url + "/users/{boss}",
        params={"step": "boss", "seq": "{seq}"},
        fields=[Field("boss_name", path="name")],
    )


class BothCalls:
    """One async function doing both calls (the usual hand-written way): a restart re-runs it."""

    def __init__(self, url: str) -> None:
        self.first, self.second = customer(url), boss(url)

    async def invoke(self, record: dict[str, Any]) -> list[dict[str, Any]]:
        found = await self.first.invoke(record)
        if not found:
            return []
        more = await self.second.invoke({**record, **found[0]})
        return [{**found[0], **(more[0] if more else {"boss_name": None})}]

    async def close(self) -> None:
        await self.first.aclose()
        await self.second.aclose()


def throughput(rows: int, rounds: int) -> None:
    spark = local_spark()
    with service_process(0.02) as url:
        common: dict[str, Any] = {"order_by": "seq", "num_partitions": 2, "timeout": 10.0, "retry": RETRY}
        common["capacity"] = 200
        jobs: dict[str, Callable[[int], DataFrame]] = {
            "chain of two steps": lambda m: AsyncDataStream.key_ordered_wait(
                source(spark, m),
                Chain(Step("customer", customer(url)), Step("boss", boss(url))),
                "order_id",
                **common,
            ),
            "chain, second step batched": lambda m: AsyncDataStream.key_ordered_wait(
                source(spark, m),
                Chain(Step("customer", customer(url)), Step("boss", batched_boss(url)), linger=0.005),
                "order_id",
                **common,
            ),
            "two waits, one after the other": lambda m: AsyncDataStream.key_ordered_wait(
                AsyncDataStream.key_ordered_wait(source(spark, m), customer(url), "order_id", **common),
                boss(url),
                "order_id",
                **common,
            ),
            "one async def, both calls": lambda m: AsyncDataStream.key_ordered_wait(
                source(spark, m), BothCalls(url), "order_id", output_schema=OUT, **common
            ),
        }
        for job in jobs.values():  # warm the workers up, for everybody alike
            job(2_000).write.format("noop").mode("overwrite").save()
        rates: dict[str, list[float]] = {label: [] for label in jobs}
        for _ in range(rounds):
            for label, job in jobs.items():
                rates[label].append(rows_per_second(lambda job=job: job(rows), rows))
    spark.stop()
    print(
        f"{rows:,} rows, 2,000 keys, two 20 ms calls per row, local[2], median of {rounds} interleaved rounds"
    )
    median = {label: statistics.median(values) for label, values in rates.items()}
    base = median["one async def, both calls"]
    for label, rate in median.items():
        print(f"  {label:<32} {rate:>8,.0f} rows/s  {rate / base:5.2f}x the one function")


def crash(records: int) -> None:
    print(f"a crash halfway through {records:,} records (snapshot, drop, restore), 20 ms per call")
    for label in ("chain", "one async def"):
        with run_service(ServiceState(latency=0.02, record_calls=True)) as (url, state):
            rows = [{"seq": i, "order_id": i % 200, "user_id": i % 1000} for i in range(records)]

            def make(url: str = url, label: str = label) -> Any:
                if label == "chain":
                    return Chain(Step("customer", customer(url)), Step("boss", boss(url)))
                return BothCalls(url)

            out, crashed, done = asyncio.run(_run_crash(make, rows))
            log = [(q["step"], q["seq"], start, end) for _, start, end, q in state.calls if "step" in q]
            calls = Counter((step, seq) for step, seq, _, _ in log)
            repeated = {
                s: sum(n - 1 for (step, _), n in calls.items() if step == s) for s in ("customer", "boss")
            }
            after = Counter((step, seq) for step, seq, start, _ in log if start > crashed)
            answered = {(step, seq) for step, seq, _, end in log if end <= crashed}
            finished_again = (  # the chain: steps its snapshot says were done; else: answered ones
                sum(after[(step, str(seq))] for seq, steps in done.items() for step in steps)
                if label == "chain"
                else sum(n for call, n in after.items() if call in answered)
            )
            print(
                f"  {label:<14} rows out {out:>6,}  calls {len(log):>6,}  repeated: customer "
                f"{repeated['customer']:>3}, boss {repeated['boss']:>3}  finished steps called again "
                f"{finished_again:>3}"
            )


async def _run_crash(
    make: Callable[[], Any], rows: list[dict[str, Any]]
) -> tuple[int, float, dict[int, list[str]]]:
    """Rows out, the monotonic time of the checkpoint, and per record in it the steps done."""
    source = iter(rows)
    first = KeyedAsyncWaitOperator(make(), mode="key_ordered", key="order_id", capacity=100, output="pairs")
    out = 0
    async with aclosing(first.process(source)) as outputs:
        async for _ in outputs:
            out += 1
            if out >= len(rows) // 2:
                break
        data = first.snapshot().to_bytes()  # the checkpoint, with records in flight
        crashed = time.monotonic()
    snap = OperatorSnapshot.from_bytes(data)
    done = {
        r.record["seq"]: list(ChainProgress.of(r.record).done)
        for group in snap.key_groups.values()
        for r in group
    }
    second = KeyedAsyncWaitOperator(make(), mode="key_ordered", key="order_id", capacity=100, output="pairs")
    second.restore(snap)
    async with aclosing(second.process(source)) as outputs:
        async for _ in outputs:
            out += 1
    return out, crashed, done


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--crash-records", type=int, default=2_000)
    args = parser.parse_args()
    crash(args.crash_records)
    throughput(args.rows, args.rounds)


if __name__ == "__main__":
    main()

"""A small, self-contained run of the core operator: ``python -m keyed_async_wait.app.demo``.

A stream of order updates (several per order id) is enriched by a slow asynchronous service,
in each output mode, and the run checks what each mode promises. No network, no Spark: the
service is simulated in the event loop with random latency.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections import defaultdict
from typing import Any

from ..core.elements import OutputMode
from ..core.retry import RetryStrategy
from ..runtime.operator import KeyedAsyncWaitOperator


def order_updates(n: int, orders: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    version: dict[int, int] = defaultdict(int)
    rows = []
    for seq in range(n):
        order_id = rng.randrange(orders)
        version[order_id] += 1
        rows.append({"seq": seq, "order_id": order_id, "version": version[order_id]})
    return rows


class SlowService:
    """An async lookup with random latency that remembers, per order, what ran concurrently."""

    def __init__(self, mean_latency: float, seed: int) -> None:
        self.rng = random.Random(seed)
        self.mean = mean_latency
        self.running: dict[int, int] = defaultdict(int)
        self.overlaps = 0
        self.calls = 0

    async def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        self.running[row["order_id"]] += 1
        if self.running[row["order_id"]] > 1:
            self.overlaps += 1
        try:
            await asyncio.sleep(self.rng.expovariate(1 / self.mean))
            return {**row, "status": f"v{row['version']}"}
        finally:
            self.running[row["order_id"]] -= 1


def in_order_per_key(rows: list[dict[str, Any]]) -> bool:
    last: dict[int, int] = {}
    for row in rows:
        if row["version"] <= last.get(row["order_id"], 0):
            return False
        last[row["order_id"]] = row["version"]
    return True


async def run_mode(mode: OutputMode, rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    service = SlowService(args.latency, args.seed)
    op = KeyedAsyncWaitOperator(
        service,
        mode=mode,
        key="order_id",
        capacity=args.capacity,
        timeout=10.0,
        retry=RetryStrategy.exponential_backoff(3, 0.01, 0.1),
    )
    start = time.perf_counter()
    out = [row async for row in op.process(rows)]
    wall = time.perf_counter() - start
    print(
        f"{mode.name:<12} rows={len(out):>6} wall={wall:6.2f}s rows/s={len(out) / wall:>8,.0f} "
        f"same-key overlaps={service.overlaps:>4} per-key order held={in_order_per_key(out)!s:<5} "
        f"input order held={[r['seq'] for r in out] == [r['seq'] for r in rows]}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m keyed_async_wait.app.demo", description=__doc__)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--orders", type=int, default=500, help="distinct order ids")
    parser.add_argument("--latency", type=float, default=0.02, help="mean service latency, s")
    parser.add_argument("--capacity", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    rows = order_updates(args.rows, args.orders, args.seed)
    print(
        f"{args.rows:,} updates of {args.orders} orders, service latency ~{args.latency * 1000:.0f} ms, "
        f"capacity {args.capacity}"
    )
    for mode in OutputMode:
        asyncio.run(run_mode(mode, rows, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

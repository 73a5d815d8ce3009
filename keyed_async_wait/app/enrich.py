"""kaw-enrich: enrich rows with lookups (HTTP or Redis) through Spark, in key order if you like.

On your own data (--input PATH or --table NAME): each row is looked up with the --http-url or
--redis-key template over its columns, the answer's --field values become new columns, and
the rows are written to --output; batch, or with --stream every file in a folder (the ones that
came since the last run too). All flags are checked before Spark starts.

Without --input or --table, the demo: order updates (JSON lines: order_id, seq, version,
customer_id, sku, quantity), generated, are read as a Structured Streaming source, each is
enriched with the customer's profile (HTTP) and the sku's price (Redis) through
``key_ordered_wait`` on the order id, and written to parquet with a checkpoint; its embedded
HTTP service and Redis are started unless --http-url (a base URL) and --redis-url name others.
Several updates of one order are looked up one at a time in ``seq`` order; different orders
concurrently. At the end a summary checks that every row was enriched and that, per order,
the lookups ran in input order.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from ..core.exceptions import RecordFailedError
from ..core.retry import RetryStrategy
from ..runtime.function import AsyncFunction
from . import own_data, own_job
from .spark_session import new_session

SCHEMA = "order_id long, seq long, version int, customer_id long, sku long, quantity int"
RESULT_SCHEMA = "customer_name string, tier string, price double, enriched_at double"


class OrderEnricher(AsyncFunction[dict, dict]):
    """Customer profile over HTTP and price from Redis, looked up concurrently per update."""

    def __init__(self, http_url: str, redis_url: str, timeout: float, shared_ttl: float = 0.0) -> None:
        from lookup import Field, HttpLookup, PartialCache, RedisLookup, SharedCache

        # profiles kept in Redis for every worker and for a re-run (named: a new lookup object
        # in each run finds them)
        shared = (
            SharedCache(redis_url, expire_after_write=shared_ttl, name="kaw-enrich-customers")
            if shared_ttl > 0
            else None
        )
        self.customers = HttpLookup(
            http_url.rstrip("/") + "/users/{customer_id}",
            fields=[Field("name"), Field("tier")],
            request_timeout=timeout,
            shared_cache=shared,
        )
        self.prices = RedisLookup(
            redis_url,
            "price:{sku}",
            fields=[Field("price", "float")],
            cache=PartialCache(10_000, expire_after_write=60),
        )

    async def invoke(self, record: dict) -> list[dict]:
        customer, price = await asyncio.gather(self.customers.invoke(record), self.prices.invoke(record))
        profile = customer[0] if customer else {"name": None, "tier": None}
        return [
            {
                "customer_name": profile["name"],
                "tier": profile["tier"],
                "price": price[0]["price"] if price else None,
                "enriched_at": time.time(),
            }
        ]

    async def close(self) -> None:
        await self.customers.aclose()
        await self.prices.aclose()

    def counters(self) -> dict[str, int]:
        """Both lookups' counts, summed (the backend protocol: the Spark layer reads them per task)."""
        total = self.customers.counters()
        for name, value in self.prices.counters().items():
            total[name] = total.get(name, 0) + value
        return total


# ---------------------------------------------------------------------- embedded defaults


def write_demo_input(folder: Path, rows: int, orders: int, files: int, seed: int = 7) -> None:
    """Order updates as JSON lines, several updates per order, spread over ``files`` files."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    version: dict[int, int] = {}
    per_file = max(1, rows // files)
    for f in range(files):
        lines = []
        for seq in range(f * per_file, rows if f == files - 1 else (f + 1) * per_file):
            order = rng.randrange(orders)
            version[order] = version.get(order, 0) + 1
            lines.append(
                json.dumps(
                    {
                        "order_id": order,
                        "seq": seq,
                        "version": version[order],
                        "customer_id": order % 5000,
                        "sku": rng.randrange(1000),
                        "quantity": rng.randint(1, 5),
                    }
                )
            )
        path = folder / f"updates-{f:03d}.json"
        path.write_text("\n".join(lines) + "\n")
        # the file source reads the oldest file first: one second apart, files arrive in seq order
        stamp = time.time() - files + f
        os.utime(path, (stamp, stamp))


@contextmanager
def embedded_services(args: argparse.Namespace) -> Iterator[tuple[str, str, Any]]:
    """The HTTP service and Redis the options did not name, started here and stopped after."""
    with ExitStack() as stack:
        state = None
        http_url = args.http_url
        if http_url is None:
            from keyed_async_wait.app.service import ServiceState, run_service

            http_url, state = stack.enter_context(
                run_service(ServiceState(latency=args.latency, jitter=args.latency))
            )
            state.record_calls = True
        redis_url = args.redis_url
        if redis_url is None:
            import redis

            from keyed_async_wait.app.embedded import embedded_redis

            redis_url = stack.enter_context(embedded_redis())
            client = redis.Redis.from_url(redis_url)
            pipe = client.pipeline(transaction=False)
            for sku in range(1000):
                pipe.set(f"price:{sku}", json.dumps({"price": round(1 + sku * 0.37, 2)}))
            pipe.execute()
            client.close()
        yield http_url, redis_url, state


# ---------------------------------------------------------------------- the job


class Progress:
    """Live progress while the query runs: rows finished, lookups, peak in flight, and the rate
    over the last few seconds (not an average that decays while a micro-batch runs).

    Fed by the job's :class:`AsyncWaitMetrics`: on a classic session its accumulators grow as
    each task ends (the demo input comes in small micro-batches, a few tasks each); on Spark
    Connect the observed metrics grow per micro-batch. A bar (tqdm) on a terminal, one plain
    line every few seconds otherwise.
    """

    WINDOW = 5.0  # seconds the rate is taken over

    def __init__(self, metrics: Any, total: int | None, tty: bool | None = None) -> None:
        self.metrics, self.total = metrics, total
        self.tty = sys.stderr.isatty() if tty is None else tty
        self.stop = threading.Event()
        self.samples: list[tuple[float, int]] = [(time.monotonic(), 0)]
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.bar: Any = None

    def sample(self) -> dict[str, Any]:
        m = self.metrics.value
        now, rows = time.monotonic(), int(m["rows_out"])
        self.samples.append((now, rows))
        while len(self.samples) > 2 and self.samples[1][0] < now - self.WINDOW:
            self.samples.pop(0)
        then, before = self.samples[0]
        rate = (rows - before) / (now - then) if now > then else 0.0
        return {"rows": rows, "rate": rate, "lookups": m["lookups"], "in_flight": m["peak_in_flight"]}

    def line(self, s: dict[str, Any]) -> str:
        of = f"/{self.total:,}" if self.total else ""
        return (
            f"rows {s['rows']:,}{of}  {s['rate']:,.0f} rows/s (last {self.WINDOW:.0f} s)  "
            f"lookups {s['lookups']:,}  peak in flight {s['in_flight']}"
        )

    def _draw(self) -> None:
        s = self.sample()
        if self.bar is not None:
            self.bar.n = s["rows"]
            self.bar.set_postfix(lookups=s["lookups"], in_flight=s["in_flight"], refresh=False)
            self.bar.refresh()
        else:
            print(self.line(s), file=sys.stderr, flush=True)

    def _run(self) -> None:
        while not self.stop.wait(0.5 if self.bar is not None else 3.0):
            self._draw()

    def __enter__(self) -> Progress:
        if self.tty:
            try:
                from tqdm import tqdm  # type: ignore[import-untyped]

                self.bar = tqdm(total=self.total, unit="rows", file=sys.stderr, dynamic_ncols=True)
            except ImportError:  # plain lines, then
                self.bar = None
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join(5)
        self._draw()
        if self.bar is not None:
            self.bar.close()


def settle(metrics: Any, rows: int, timeout: float = 30.0) -> None:
    """Observed metrics come with the query's progress, which may reach the client after the
    query ended: wait (bounded) until they count every row written, so the summary is whole."""
    deadline, pause = time.monotonic() + timeout, 0.05
    while metrics.observed and metrics.value["rows_out"] < rows and time.monotonic() < deadline:
        time.sleep(pause)  # each look asks the server for the progress: back off, up to 1 s
        pause = min(1.0, pause * 2)


def order_check(rows: list[Any]) -> tuple[int, int]:
    """Per order, sorted by seq, the lookups must have finished in that order.

    Returns (orders checked, orders out of order)."""
    by_order: dict[int, list[tuple[int, float]]] = {}
    for r in rows:
        by_order.setdefault(r.order_id, []).append((r.seq, r.enriched_at))
    bad = 0
    for updates in by_order.values():
        updates.sort()
        times = [t for _, t in updates]
        bad += any(b < a for a, b in itertools.pairwise(times))
    return len(by_order), bad


def session(args: argparse.Namespace) -> Any:
    """A classic session on ``--master``, or a Spark Connect client of ``--remote``."""
    return new_session(args.master, args.remote, args.partitions)


def run(args: argparse.Namespace) -> dict[str, Any]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from ..spark.api import AsyncDataStream
    from ..spark.metrics import AsyncWaitMetrics

    work = Path(args.workdir or tempfile.mkdtemp(prefix="kaw-enrich-"))
    source = Path(args.input) if args.input else work / "input"
    output = Path(args.output) if args.output else work / "output"
    checkpoint = Path(args.checkpoint) if args.checkpoint else work / "checkpoint"
    if not args.input:
        write_demo_input(source, args.rows, args.orders, files=8)  # 8 micro-batches
    started = time.monotonic()
    with embedded_services(args) as (http_url, redis_url, _state):
        spark = session(args)
        metrics = AsyncWaitMetrics(spark)  # accumulators, or observed metrics on Spark Connect
        updates = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(source))
        fn = OrderEnricher(http_url, redis_url, args.timeout, args.shared_cache_ttl)
        options: dict[str, Any] = {
            "output_schema": RESULT_SCHEMA,
            "capacity": args.capacity,
            "timeout": args.timeout,
            "retry": RetryStrategy.exponential_backoff(3, 0.1, 2.0),
            "metrics": metrics,
        }
        if args.mode == "key_ordered":
            enriched = AsyncDataStream.key_ordered_wait(
                updates, fn, key="order_id", order_by="seq", **options
            )
        elif args.mode == "ordered":
            enriched = AsyncDataStream.ordered_wait(updates, fn, **options)
        else:
            enriched = AsyncDataStream.unordered_wait(updates, fn, **options)
        query = (
            enriched.writeStream.format("parquet")
            .option("path", str(output))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        metrics.track(query)
        with Progress(metrics, None if args.input else args.rows):
            query.awaitTermination()
            if query.exception() is not None:
                raise RuntimeError(f"the query failed: {query.exception()}")
            wall = time.monotonic() - started
            rows = spark.read.parquet(str(output)).collect()
            settle(metrics, len(rows))
        m = metrics.value
        orders, out_of_order = order_check(rows)
        summary = {
            "rows": len(rows),
            "enriched": sum(1 for r in rows if r.customer_name is not None and r.price is not None),
            "wall_s": round(wall, 2),
            "rows_per_s": round(len(rows) / wall, 1) if wall else None,
            "lookups": m["lookups"],
            "cache_hits": m["cache_hits"],  # in each worker (L1)
            "shared_cache_hits": m["shared_cache_hits"],  # in Redis, for every worker (L2)
            "retries": m["retries"],
            "rejected_429": m["rejected_429"],
            "short_circuited": m["short_circuited"],
            "orders": orders,
            "orders_out_of_order": out_of_order,
            "latency_p50_s": m["latency_p50_s"],
            "latency_p99_s": m["latency_p99_s"],
            "output": str(output),
        }
        spark.stop()
    return summary


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kaw-enrich",
        description=__doc__,
        epilog=own_data.EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = p.add_mutually_exclusive_group()
    source.add_argument(
        "--input", metavar="PATH", help="your own data: a parquet, CSV or JSON-lines file or folder"
    )
    source.add_argument("--table", metavar="NAME", help="your own data: a table of the session's catalog")
    p.add_argument("--output", metavar="PATH", help="where the rows go (demo default: under --workdir)")
    p.add_argument(
        "--checkpoint", metavar="PATH", help="the stream's checkpoint (demo default: under --workdir)"
    )
    p.add_argument(
        "--http-url",
        metavar="URL",
        help="your own data: a URL template, e.g. http://host/users/{user_id}; "
        "the demo: a customer service base URL (GET {url}/users/{customer_id}; default: embedded)",
    )
    p.add_argument(
        "--redis-url",
        metavar="URL",
        help="your own data: the Redis of --redis-key; the demo: one with price:{sku} JSON values "
        "(default: embedded redis-server)",
    )
    p.add_argument(
        "--mode",
        choices=own_data.MODES,
        help="key_ordered (the demo's, and the default with --key), ordered, or unordered",
    )
    p.add_argument(
        "--capacity",
        type=own_data.positive_int,
        default=100,
        help="rows in flight per Spark task at most (default 100)",
    )
    p.add_argument(
        "--timeout",
        type=own_data.positive_seconds,
        default=10.0,
        help="seconds per row, retries included (default 10)",
    )
    p.add_argument(
        "--retries",
        type=own_data.positive_int,
        default=3,
        help="attempts per row in all: 0.1 s apart, then doubling up to 2 s (default 3)",
    )
    spark = p.add_mutually_exclusive_group()
    spark.add_argument("--master", help="Spark master (default local[*])")
    spark.add_argument("--remote", help="a Spark Connect server (sc://host:15002) instead of --master")
    p.add_argument(
        "--partitions",
        type=own_data.positive_int,
        default=4,
        help="spark.sql.shuffle.partitions of the session it starts (default 4); a key-ordered wait "
        "runs in one partition per task slot whatever this is",
    )
    own_data.add_arguments(p)
    demo = p.add_argument_group("the demo only (without --input or --table)")
    demo.add_argument("--workdir", help="where defaults go (default: a new temporary folder)")
    demo.add_argument("--rows", type=int, help="demo input rows (default 20,000)")
    demo.add_argument("--orders", type=int, help="distinct order ids in the demo input (default 2,000)")
    demo.add_argument("--latency", type=float, help="embedded service latency, s (default 0.02)")
    demo.add_argument(
        "--shared-cache-ttl",
        type=float,
        help="seconds customer profiles stay in Redis's shared cache (0: none; default 600)",
    )
    return p


def demo_flags(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The demo's defaults filled in; a flag of your own data only is an error naming it."""
    for dest in own_data.OWN_DATA_ONLY:
        if getattr(args, dest) not in (None, False):
            flag = "--" + dest.replace("_", "-")
            p.error(
                f"{flag}: given without --input or --table; {flag} only with --input PATH or --table NAME"
            )
    if args.http_url is not None and "{" in args.http_url:
        p.error(
            f"--http-url: a template {args.http_url!r} without --input or --table; "
            "the demo takes a base URL (templates are for --input PATH or --table NAME)"
        )
    defaults = dict(rows=20_000, orders=2_000, latency=0.02, shared_cache_ttl=600.0)
    for dest, value in {**defaults, "mode": "key_ordered", "master": "local[*]"}.items():
        if getattr(args, dest) is None:
            setattr(args, dest, value)


def enrich_own_data(p: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``kaw-enrich --input/--table ...``: flags checked (exit 2 naming one), the job, its summary."""
    try:
        summary = own_job.run(own_data.check(args))
    except own_data.UsageError as exc:
        p.error(str(exc))
    except Exception as exc:  # noqa: BLE001 - reported with its cause, and a non-zero exit
        print(f"kaw-enrich failed: {failure(exc)}", file=sys.stderr)
        if "RecordFailedError" in str(exc) or isinstance(exc, RecordFailedError):
            print(
                "(--error-column NAME keeps such rows, with their error, and the job going)", file=sys.stderr
            )
        return 1
    print(json.dumps(summary, indent=2))
    return 0


def failure(exc: BaseException) -> str:
    """What failed, in one line: a record's error from inside Spark's wrapping (a worker's
    traceback), else the exception's own first line."""
    text = str(exc)
    ours = [line.strip() for line in text.splitlines() if line.strip().startswith("keyed_async_wait.")]
    ours += [line.strip() for line in text.splitlines() if line.strip().startswith("RecordFailedError:")]
    if ours:
        return ours[-1].removeprefix("keyed_async_wait.core.exceptions.")
    first = next((line for line in text.splitlines() if line.strip()), "")
    return f"{type(exc).__name__}: {first}"


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.input is not None or args.table is not None:
        return enrich_own_data(p, args)
    demo_flags(p, args)
    try:
        summary = run(args)
    except Exception as exc:  # noqa: BLE001 - reported with its cause, and a non-zero exit
        print(f"kaw-enrich failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=2))
    ok = summary["rows"] > 0 and summary["enriched"] == summary["rows"]
    if args.mode == "key_ordered":
        ok = ok and summary["orders_out_of_order"] == 0
    if args.mode == "key_ordered" and summary["orders_out_of_order"]:
        print(f"per-order order was NOT held for {summary['orders_out_of_order']} orders", file=sys.stderr)
    return 0 if ok else 2


if __name__ == "__main__":
    raise SystemExit(main())

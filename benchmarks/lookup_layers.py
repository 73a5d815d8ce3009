"""What an ``HttpLookup`` costs over its HTTP client: CPU per request of each layer, one process.

    ./run bench lookup_layers [--requests N] [--in-flight K] [--rounds R] [--service python|nginx]

Three ways of asking the same service for the same keys, K at a time, in one uvloop loop with
the workers' collector settings, interleaved round by round: ``client`` (the lookup's HTTP
client alone: ``request`` on a URL already parsed), ``fetch`` (the lookup's service call: the
request built from the key, the answer's status checked and its JSON decoded) and ``invoke``
(what the engine calls per record: the key rendered from the record, deduplication, the
fields mapped). Printed: the medians of the rounds after the first, CPU seconds of this
process per request, and each over ``client``'s. The ratios are the figure to compare across
changes on a machine whose speed varies: the client's own cost is the same in each.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import uvloop

sys.path.insert(0, os.path.dirname(__file__))
from cheap_service import SERVICES, lookup_service

from keyed_async_wait.spark.worker import tune_collector
from lookup import Field, HttpLookup
from lookup.http_client import wire_url

KEYS = 1_000
Call = Callable[[int], Awaitable[Any]]


async def asked(call: Call, requests: int, in_flight: int) -> None:
    """``requests`` calls of ``call`` (keys taking turns), ``in_flight`` at a time."""
    turns: Iterator[int] = iter(range(requests))

    async def worker() -> None:
        for i in turns:
            await call(i % KEYS)

    await asyncio.gather(*(worker() for _ in range(in_flight)))


def layers(lookup: HttpLookup, base: str) -> dict[str, Call]:
    """The three ways of asking (see the module), over the client of the running loop."""
    client = lookup.client()
    urls = [f"{base}/users/{i}" for i in range(KEYS)]
    parsed = [wire_url(url) for url in urls]
    records = [{"user_id": i} for i in range(KEYS)]
    return {
        "client": lambda i: client.request("GET", parsed[i], None, None, None),
        "fetch": lambda i: lookup.fetch(urls[i]),
        "invoke": lambda i: lookup.invoke(records[i]),
    }


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--requests", type=int, default=30_000)
    parser.add_argument("--in-flight", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--service", choices=SERVICES, default="nginx", help="who answers")
    args = parser.parse_args()
    with lookup_service(args.service, 0.02) as base:
        lookup = HttpLookup(base + "/users/{user_id}", fields=[Field("name")], max_connections=args.in_flight)
        loop = uvloop.new_event_loop()
        try:

            async def made() -> dict[str, Call]:
                return layers(lookup, base)

            calls = loop.run_until_complete(made())
            tune_collector()  # as in Spark's workers
            gc.collect()
            gc.freeze()
            spent: dict[str, list[float]] = {name: [] for name in calls}
            for round_ in range(args.rounds + 1):  # the first warms connections and caches
                for name, call in calls.items():
                    start = time.process_time()
                    loop.run_until_complete(asked(call, args.requests, args.in_flight))
                    if round_:
                        spent[name].append((time.process_time() - start) / args.requests)
            loop.run_until_complete(lookup.aclose())
        finally:
            loop.close()
    base_us = statistics.median(spent["client"]) * 1e6
    print(f"{args.requests:,} requests a round, {args.in_flight} in flight, medians of {args.rounds} rounds:")
    for name, seconds in spent.items():
        median = statistics.median(seconds) * 1e6
        print(f"  {name:<7} {median:6.1f} us a request  {median / base_us:.2f}x the client's")


if __name__ == "__main__":
    main()

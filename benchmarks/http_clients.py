"""HTTP client candidates side by side: CPU per request and requests/s, in one run.

    ./run bench http_clients [--requests N] [--in-flight K] [--rounds R] [--install]

Each candidate sends N GETs with K in flight from one asyncio process to the 20 ms service
(its own process) and decodes each JSON answer; the rounds interleave the candidates and the
medians are printed, with CPU seconds per 1,000 requests (``time.process_time``: this process
only, the Rust or C threads of a candidate included) and each over aiohttp's. Candidates:
``aiohttp`` tuned as ``KAW_HTTP=aiohttp`` runs it (one session, no cookie jar, the proxy
looked up once per origin), ``aiohttp trust_env`` (the same with aiohttp's own ``trust_env``,
which looks the proxy up in a thread per request),
``lean`` (this library's client on llhttp, the default), and maintained fast clients from
PyPI: ``pyreqwest`` (Rust's reqwest) and ``curl_cffi`` (libcurl). The last two are no
dependency of the library: ``--install`` puts them into ~/.cache/keyed-async-wait/http-clients;
one that cannot be imported is left out, saying so. The feature table that goes with these
figures is in docs/http-clients.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
from lookup_throughput import service_process

CANDIDATES_DIR = Path.home() / ".cache" / "keyed-async-wait" / "http-clients"
Get = Callable[[str], Awaitable[Any]]


async def with_aiohttp(urls: list[str], in_flight: int, *, trust_env: bool = False) -> None:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=in_flight)
    async with aiohttp.ClientSession(
        connector=connector, trust_env=trust_env, cookie_jar=aiohttp.DummyCookieJar()
    ) as session:

        async def get(url: str) -> Any:
            async with session.get(url) as resp:
                return json.loads(await resp.read())

        await gather_bounded(get, urls, in_flight)


async def with_lean(urls: list[str], in_flight: int) -> None:
    import yarl

    from lookup.http_lean import LeanTransport

    transport = LeanTransport(in_flight, 10.0)
    try:

        async def get(url: str) -> Any:
            answer = await transport.request("GET", yarl.URL(url), None, None, None)
            return json.loads(answer.body)

        await gather_bounded(get, urls, in_flight)
    finally:
        await transport.aclose()


async def with_pyreqwest(urls: list[str], in_flight: int) -> None:
    from pyreqwest.client import ClientBuilder

    async with ClientBuilder().max_connections(in_flight).build() as client:

        async def get(url: str) -> Any:
            resp = await client.get(url).build().send()
            return json.loads(bytes(await resp.bytes()))

        await gather_bounded(get, urls, in_flight)


async def with_curl_cffi(urls: list[str], in_flight: int) -> None:
    from curl_cffi.requests import AsyncSession

    async with AsyncSession(max_clients=in_flight) as session:

        async def get(url: str) -> Any:
            resp = await session.get(url)
            return json.loads(resp.content)

        await gather_bounded(get, urls, in_flight)


async def gather_bounded(get: Get, urls: list[str], in_flight: int) -> None:
    slots = asyncio.Semaphore(in_flight)

    async def one(url: str) -> Any:
        async with slots:
            return await get(url)

    answers = await asyncio.gather(*(one(u) for u in urls))
    assert all(isinstance(a, dict) for a in answers)


CANDIDATES: dict[str, Callable[[list[str], int], Awaitable[None]]] = {
    "aiohttp": with_aiohttp,
    "aiohttp trust_env": partial(with_aiohttp, trust_env=True),
    "lean": with_lean,
    "pyreqwest": with_pyreqwest,
    "curl_cffi": with_curl_cffi,
}
MODULES = {"pyreqwest": "pyreqwest", "curl_cffi": "curl_cffi"}


def available() -> list[str]:
    names = []
    for name in CANDIDATES:
        module = MODULES.get(name)
        if module is not None:
            try:
                __import__(module)
            except ImportError:
                print(f"  {name:<18} left out: not installed (--install)")
                continue
        names.append(name)
    return names


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--in-flight", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--install", action="store_true", help="pip install the candidates into a cache")
    args = parser.parse_args()
    if args.install:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--target",
                str(CANDIDATES_DIR),
                "pyreqwest",
                "curl-cffi",
            ],
            check=True,
        )
    if CANDIDATES_DIR.exists():
        sys.path.append(str(CANDIDATES_DIR))
    names = available()
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    with service_process(0.02) as url:
        urls = [f"{url}/users/{i % 2000}" for i in range(args.requests)]
        print(f"{args.requests:,} GETs, {args.in_flight} in flight, service answering after 20 ms")
        for _ in range(args.rounds):
            for name in names:
                wall, cpu = time.perf_counter(), time.process_time()
                asyncio.run(CANDIDATES[name](urls, args.in_flight))
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                figures[name].append((args.requests / wall, cpu * 1000 / args.requests))
    base_rate = statistics.median(r for r, _ in figures["aiohttp"])
    base_cpu = statistics.median(c for _, c in figures["aiohttp"])
    print(f"{'client':<18} {'requests/s':>11} {'CPU s/1k':>9}  over aiohttp: rate, CPU")
    for name in names:
        rate = statistics.median(r for r, _ in figures[name])
        cpu = statistics.median(c for _, c in figures[name])
        print(f"{name:<18} {rate:>11,.0f} {cpu:>9.3f}  {rate / base_rate:5.2f}x {cpu / base_cpu:5.2f}x")


if __name__ == "__main__":
    main()

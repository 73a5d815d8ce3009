"""A quota in every form a service states it, followed by a job-wide budget with no rate given.

    ./run bench quota_forms [--calls N] [--forms x-ratelimit,ietf,retry-after] [--windows 1,2,10]
                            [--rates 30,60,120] [--processes 2] [--double-after S] [--trace]

The service (the project's test service, 20 ms an answer) admits ``rate`` calls a second's
worth per window (at 60 a second: 60 per 1 s window, 120 per 2 s, 600 per 10 s), refuses the
rest with 429 and ``Retry-After`` (whole seconds to the window's end), and states what is left
in one form: ``X-RateLimit-*`` (an epoch reset, no window), the IETF ``RateLimit-Policy`` /
``RateLimit``, or nothing but ``Retry-After``. Worker OS processes (two, as two executors)
share ``Budget(in_flight=40)`` and make N calls together through ``HttpLookup``, retrying a
refused call. Printed per case: the calls refused, and the share of the quota used while
calling (admitted calls over the quota from the first admitted call to the last).

``--double-after S`` doubles the quota S seconds into each case, and also prints the share of
the new quota used from 10 s after the change to the last call (the budget has to find the
higher quota by itself when the service states nothing but ``Retry-After``). ``--trace`` also
prints, per window of the service's clock, the calls it admitted and where in the window each
refusal fell.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import threading
import time
import uuid
from typing import Any

from keyed_async_wait import RetryStrategy
from keyed_async_wait.app.embedded import redis_url_or_embedded
from keyed_async_wait.app.quota import Quota
from keyed_async_wait.app.service import ServiceState, run_service
from keyed_async_wait.operator import KeyedAsyncWaitOperator
from lookup import Budget, Field, HttpLookup, Limits

RETRY = RetryStrategy.fixed_delay(40, 0.05)


async def calls(url: str, budget: Budget, start: int, count: int) -> None:
    fn = HttpLookup(
        f"{url}/users/{{user_id}}",
        params={"seq": "{seq}"},
        fields=[Field("name")],
        limits=Limits(budget=budget),
    )
    op = KeyedAsyncWaitOperator(fn, mode="unordered", capacity=50, retry=RETRY, timeout=600)
    try:
        async for _ in op.process({"seq": n, "user_id": n % 500} for n in range(start, start + count)):
            pass
    finally:
        await fn.aclose()


def worker(url: str, budget: Budget, start: int, count: int) -> None:
    """One worker process's share of the calls (as one executor's tasks would make them)."""
    asyncio.run(calls(url, budget, start, count))


def traced(quota: Quota) -> list[tuple[float, bool]]:
    """Every answer of ``quota`` from now on as (monotonic seconds, admitted), for ``--trace``."""
    answers: list[tuple[float, bool]] = []
    admit = quota.admit

    def admit_and_note(units: float, now: float | None = None) -> tuple[bool, dict[str, str]]:
        ok, headers = admit(units, now)
        answers.append((time.monotonic(), ok))
        return ok, headers

    quota.admit = admit_and_note  # type: ignore[method-assign]
    return answers


def by_window(answers: list[tuple[float, bool]], window: float) -> str:
    """Admitted per window of the service's clock, and where in it each refusal fell (0-1)."""
    counts: dict[int, list[Any]] = {}
    for at, ok in answers:
        cell = counts.setdefault(int(at // window), [0, []])
        if ok:
            cell[0] += 1
        else:
            cell[1].append(f"{at / window % 1:.2f}")
    return " ".join(f"{a}/{','.join(r)}" if r else str(a) for _, (a, r) in sorted(counts.items()))


def used_after(state: ServiceState, quota: Quota, since: float) -> float | None:
    """The share of the quota in force used by the calls admitted from ``since`` on."""
    starts = sorted(start for _, start, _, _ in state.calls if start >= since)
    if len(starts) < 2 or quota.calls is None:
        return None
    return (len(starts) - 1) / (quota.calls / quota.window * (starts[-1] - starts[0]))


def one(url: str, redis_url: str, state: ServiceState, case: tuple[str, float, float], args: Any) -> str:
    form, window, rate = case
    per_window = round(rate * window)
    total = max(args.calls, round(3.5 * per_window))
    quota = state.quota = Quota(calls=per_window, window=window, form=form)
    state.calls.clear()
    state.record_calls = True
    answers = traced(quota) if args.trace else []
    budget = Budget(redis_url, f"q{uuid.uuid4().hex[:8]}", in_flight=40)
    spawn = multiprocessing.get_context("spawn")
    share = total // args.processes
    workers = [
        spawn.Process(target=worker, args=(url, budget, i * share, share)) for i in range(args.processes)
    ]
    started = time.monotonic()
    doubled: list[float] = []

    def double() -> None:
        quota.calls = 2 * per_window
        doubled.append(time.monotonic())

    timer = threading.Timer(args.double_after, double) if args.double_after else None
    for process in workers:
        process.start()
    if timer is not None:
        timer.start()
    try:
        for process in workers:
            process.join(900)
    finally:
        if timer is not None:
            timer.cancel()
        for process in workers:
            if process.is_alive():
                process.kill()
    asked = quota.admitted + quota.rejected
    line = (
        f"{form:<12} {window:>5g} s {rate:>6g}/s {quota.rejected:>5} of {asked:<6} "
        f"{quota.rejected / max(1, asked):>7.2%} {quota.used():>10.2f} {time.monotonic() - started:>7.1f}"
    )
    if doubled:
        after = used_after(state, quota, doubled[0] + 10)
        line += f"   doubled: {'-' if after is None else f'{after:.2f}'} of the new quota from 10 s on"
    if args.trace:
        line += f"\n  admitted/refused a window: {by_window(answers, window)}"
    state.quota = None
    state.record_calls = False
    return line


def main(argv: Any = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1_000)
    parser.add_argument("--forms", default="x-ratelimit,ietf,retry-after")
    parser.add_argument("--windows", default="1,2,10")
    parser.add_argument("--rates", default="30", help="the quota, calls a second (default 30)")
    parser.add_argument("--processes", type=int, default=2, help="worker OS processes sharing the budget")
    parser.add_argument("--double-after", type=float, default=0.0, help="double the quota after S seconds")
    parser.add_argument("--trace", action="store_true", help="print admitted/refused per window")
    args = parser.parse_args(argv)
    columns = ("form", 12), ("window", 7), ("quota", 8), ("refused", 14), ("share", 7), ("quota used", 10)
    heads = [f"{name:<{width}}" if name == "form" else f"{name:>{width}}" for name, width in columns]
    print(" ".join(heads), "wall s")
    with redis_url_or_embedded() as redis_url, run_service(ServiceState()) as (url, state):
        for form in args.forms.split(","):
            for window in (float(w) for w in args.windows.split(",")):
                for rate in (float(r) for r in args.rates.split(",")):
                    print(one(url, redis_url, state, (form, window, rate), args), flush=True)


if __name__ == "__main__":
    main()

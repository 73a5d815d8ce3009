"""A quota in every form a service states it, followed by a job-wide budget with no rate given.

    ./run bench quota_forms [--calls N] [--forms x-ratelimit,ietf,retry-after] [--windows 1,2,10]

The service (the project's test service, 20 ms an answer) admits 30 calls a second's worth per
window (30 per 1 s window, 60 per 2 s, 300 per 10 s), refuses the rest with 429 and
``Retry-After``, and states what is left in one form: ``X-RateLimit-*`` (an epoch reset, no
window), the IETF ``RateLimit-Policy`` / ``RateLimit``, or nothing but ``Retry-After``. Two
event loops (as two worker processes would) share ``Budget(in_flight=40)`` and make N calls
together through ``HttpLookup``, retrying a refused call. Printed per form and window: the
calls refused, and the share of the quota used while calling (admitted calls over the quota
from the first admitted call to the last).
"""

from __future__ import annotations

import argparse
import asyncio
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

RETRY = RetryStrategy.fixed_delay(20, 0.05)


async def calls(url: str, budget: Budget, start: int, count: int) -> None:
    fn = HttpLookup(
        f"{url}/users/{{user_id}}",
        params={"seq": "{seq}"},
        fields=[Field("name")],
        limits=Limits(budget=budget),
    )
    op = KeyedAsyncWaitOperator(fn, mode="unordered", capacity=50, retry=RETRY)
    try:
        async for _ in op.process({"seq": n, "user_id": n % 500} for n in range(start, start + count)):
            pass
    finally:
        await fn.aclose()


def one(url: str, redis_url: str, state: ServiceState, form: str, window: float, total: int) -> str:
    per_window = round(30 * window)
    total = max(total, round(3.5 * per_window))
    quota = state.quota = Quota(calls=per_window, window=window, form=form)
    budget = Budget(redis_url, f"q{uuid.uuid4().hex[:8]}", in_flight=40)
    loops = [
        threading.Thread(target=asyncio.run, args=(calls(url, budget, i * total // 2, total // 2),))
        for i in range(2)
    ]
    started = time.monotonic()
    for loop in loops:
        loop.start()
    for loop in loops:
        loop.join(600)
    asked = quota.admitted + quota.rejected
    state.quota = None
    return (
        f"{form:<12} {window:>6g} s {quota.rejected:>5} of {asked:<6} {quota.rejected / max(1, asked):>7.2%}"
        f" {quota.used():>10.2f} {time.monotonic() - started:>7.1f}"
    )


def main(argv: Any = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1_000)
    parser.add_argument("--forms", default="x-ratelimit,ietf,retry-after")
    parser.add_argument("--windows", default="1,2,10")
    args = parser.parse_args(argv)
    print(f"{'form':<12} {'window':>8} {'refused':>14} {'share':>7} {'quota used':>10} {'wall s':>7}")
    with redis_url_or_embedded() as redis_url, run_service(ServiceState()) as (url, state):
        for form in args.forms.split(","):
            for window in (float(w) for w in args.windows.split(",")):
                print(one(url, redis_url, state, form, window, args.calls), flush=True)


if __name__ == "__main__":
    main()

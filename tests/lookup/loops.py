"""Several event loops at once, each in a thread of its own (as worker processes would be)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


def in_threads(count: int, work: Callable[[int], Any], bound: float = 60) -> list[Any]:
    """``work(i)`` in ``count`` threads started together (each its own event loop, as worker
    processes would be); their results."""
    results: list[Any] = [None] * count
    failures: list[BaseException] = []
    go = threading.Barrier(count, timeout=30)

    def body(i: int) -> None:
        go.wait()
        try:
            results[i] = work(i)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(bound)
    assert not any(thread.is_alive() for thread in threads), "a worker did not finish in time"
    if failures:
        raise failures[0]
    return results


# The service takes a call's time when the request reaches its handler, which on a loaded
# machine may run late and then take several waiting requests at once (seen: 13 calls within
# 11.5 ms of its clock, 5 ms apart when sent; 24 within 56 ms across two loops on a CI run), so
# a window of calls may look up to 100 ms shorter than it was when they were sent.
SERVICE_CLOCK_SLACK = 0.1


def assert_rate_held(
    starts: list[float], rate: float, burst: float, slack: float = SERVICE_CLOCK_SLACK
) -> None:
    """Every window of the (sorted) call times holds at most ``burst + rate * (T + slack)`` calls:
    no limit, or one per loop where one for the job was asked (twice the rate), still breaks it
    at windows longer than the slack (the callers' duration bounds catch the rest)."""
    for i, first in enumerate(starts):
        for j in range(i, len(starts)):
            calls, allowed = j - i + 1, burst + rate * (starts[j] - first + slack)
            assert calls <= allowed, f"{calls} calls within {starts[j] - first:.4f} s: at most {allowed:.1f}"

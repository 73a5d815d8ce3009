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

"""Start awaitables eagerly: run them up to their first real suspension without a task.

An action that finishes without suspending (a cache hit, a no-op) then costs no task and no
event-loop round trip; one that suspends is handed to a task exactly where it stopped. This is
what ``asyncio.eager_task_factory`` does from Python 3.12 on, done by hand for 3.11.
"""

from __future__ import annotations

import types
from collections.abc import Awaitable, Coroutine
from typing import Any

__all__ = ["Resumed", "start"]

_CoroutineType = types.CoroutineType


def start(awaitable: Awaitable[Any]) -> tuple[Any, Any]:
    """Run ``awaitable`` to its first suspension.

    Returns ``(iterator, yielded)`` when it suspended (wrap both in :class:`Resumed`); raises
    ``StopIteration`` carrying the value when it finished, or whatever it raised.
    """
    iterator: Any = awaitable if type(awaitable) is _CoroutineType else awaitable.__await__()
    return iterator, iterator.send(None)


class Resumed(Coroutine[Any, Any, Any]):
    """A coroutine that continues an eagerly started iterator, for a task or an ``await``.

    Its first step hands the event loop the future the iterator stopped on; every later step,
    and any exception thrown in (a cancellation, even one before the first step), goes into
    the iterator, so the action's ``finally`` and ``except CancelledError`` run as under a
    plain task.
    """

    __slots__ = ("_first", "_iterator", "_started")

    def __init__(self, iterator: Any, first: Any) -> None:
        self._iterator = iterator
        self._first = first
        self._started = False

    def send(self, value: Any) -> Any:
        if not self._started:
            self._started = True
            return self._first
        return self._iterator.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        self._started = True
        if val is None and tb is None:
            return self._iterator.throw(typ)
        return self._iterator.throw(typ, val, tb)  # pragma: no cover - legacy signature

    def close(self) -> None:
        self._iterator.close()

    def __await__(self) -> Resumed:
        return self

    def __iter__(self) -> Resumed:
        return self

    def __next__(self) -> Any:
        return self.send(None)

"""Start awaitables eagerly: run them up to their first real suspension without a task.

An action that finishes without suspending (a cache hit, a no-op) then costs no task and no
event-loop round trip; one that suspends is handed to a task exactly where it stopped. This is
what ``asyncio.eager_task_factory`` does from Python 3.12 on, done by hand for 3.11.
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import Awaitable, Coroutine
from typing import Any

__all__ = ["NOT_YET", "Resumed", "Settling", "prepare", "start"]

_CoroutineType = types.CoroutineType


def start(awaitable: Awaitable[Any]) -> tuple[Any, Any]:
    """Run ``awaitable`` to its first suspension.

    Returns ``(iterator, yielded)`` when it suspended (wrap both in :class:`Resumed`); raises
    ``StopIteration`` carrying the value when it finished, or whatever it raised.
    """
    iterator: Any = awaitable if type(awaitable) is _CoroutineType else awaitable.__await__()
    return iterator, iterator.send(None)


class _Driven(Coroutine[Any, Any, Any]):
    """What both drivers share: a coroutine object over an iterator of the action's."""

    __slots__ = ("_iterator",)

    _iterator: Any

    def close(self) -> None:
        if self._iterator is not None:
            self._iterator.close()

    def __await__(self) -> _Driven:
        return self

    def __iter__(self) -> _Driven:
        return self

    def __next__(self) -> Any:
        return self.send(None)


class Resumed(_Driven):
    """A coroutine that continues an eagerly started iterator, for a task or an ``await``.

    Its first step hands the event loop the future the iterator stopped on; every later step,
    and any exception thrown in (a cancellation, even one before the first step), goes into
    the iterator, so the action's ``finally`` and ``except CancelledError`` run as under a
    plain task.
    """

    __slots__ = ("_first", "_started")

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


_NOT_YET: Any = object()
NOT_YET: Any = _NOT_YET  # what an action that was not started eagerly has yielded: nothing yet


class Settling(_Driven):
    """A coroutine for a task that runs actions and reports each outcome in the same step.

    ``report(value, failure)`` is called right where an action finishes (no done callback, no
    extra loop turn). It may hand back the next action to run in this same task, as
    ``(iterator, first, report, is_ours)``: a chain of records (the next of a key) then runs in
    one task. A cancellation for which ``is_ours()`` is true (a timeout or a close) is not
    reported: it ends the task. Every ``send`` and ``throw`` goes into the running action, even a
    cancellation before the first step, so its cleanup runs and it is never "never awaited".

    When nothing follows, ``park(self)`` may hand back a future: the task then waits on it,
    holding nothing of the last action, until :meth:`resume` gives it the next one (a task
    reused costs a fraction of a new one's making and registering). A cancellation while parked
    ends the task; one after :meth:`resume` goes into the new action, as for a new task.
    """

    __slots__ = ("_first", "_is_ours", "_park", "_parked", "_report", "task")

    def __init__(self, iterator: Any, first: Any, report: Any, is_ours: Any, park: Any = None) -> None:
        self._iterator = iterator
        self._first = first  # what an eager start already got from it, or _NOT_YET
        self._report = report
        self._is_ours = is_ours
        self._park = park
        self._parked: asyncio.Future[None] | None = None  # waited on while idle
        self.task: asyncio.Future[Any] | None = None  # the task running this, set by its maker

    @property
    def idle(self) -> bool:
        """Parked and not cancelled: :meth:`resume` may hand it an action."""
        parked = self._parked
        return parked is not None and not parked.done()

    def resume(self, iterator: Any, first: Any, report: Any, is_ours: Any) -> asyncio.Future[Any]:
        """Run this action next (only while :attr:`idle`), from the loop's next turn; the task."""
        self._iterator, self._first, self._report, self._is_ours = iterator, first, report, is_ours
        parked, self._parked = self._parked, None
        assert parked is not None and self.task is not None  # idle: parked, not yet ended
        parked.set_result(None)
        return self.task

    def send(self, value: Any) -> Any:
        first = self._first
        if first is not _NOT_YET:
            self._first = _NOT_YET
            return first
        return self._step(value, None)

    def __next__(self) -> Any:
        # what a task's step calls (``send(None)`` goes to ``__next__`` for an object that is
        # no native coroutine): the same as send, without a second call per step
        first = self._first
        if first is not _NOT_YET:
            self._first = _NOT_YET
            return first
        return self._step(None, None)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        self._first = _NOT_YET
        exc = typ if val is None and isinstance(typ, BaseException) else (val if val is not None else typ())
        if self._parked is not None:  # cancelled while idle: no action to tell
            self.task = None
            raise exc
        return self._step(None, exc)

    def _step(self, value: Any, exc: BaseException | None) -> Any:
        while True:
            try:
                if exc is None:
                    return self._iterator.send(value)
                return self._iterator.throw(exc)
            except StopIteration as done:
                nxt = self._report(done.value, None)
            except asyncio.CancelledError:
                if self._is_ours():
                    self.task = None
                    raise
                nxt = self._report(None, asyncio.CancelledError())
            except Exception as failure:  # noqa: BLE001 - the outcome of the action
                nxt = self._report(None, failure)
            if nxt is None:
                return self._idle()
            self._iterator, first, self._report, self._is_ours = nxt
            if first is not _NOT_YET:
                return first  # it was started eagerly and is waiting on this
            value, exc = None, None

    def _idle(self) -> Any:
        """Nothing follows: wait on a future from ``park``, or end the task."""
        parked = self._park(self) if self._park is not None else None
        if parked is None:
            self.task = None
            raise StopIteration
        self._iterator = self._report = self._is_ours = None  # the last action and its record go
        self._parked = parked
        return parked


def prepare(call: Any, argument: Any, eager: bool, name: str) -> tuple[Any, Any]:
    """Call the action: ``(iterator, first yielded or _NOT_YET)`` to drive in a task, or
    ``(future, None)`` to wait on; raises StopIteration carrying an instant value.

    A coroutine runs in a task of its own (so ``asyncio.current_task()`` is right inside it),
    except that an eager action first runs up to its first suspension here.
    """
    awaitable = call(argument)
    if type(awaitable) is _CoroutineType:
        if not eager:
            return awaitable, _NOT_YET
        return start(awaitable)
    if isinstance(awaitable, asyncio.Future):
        return awaitable, None
    if hasattr(awaitable, "__await__"):
        return awaitable.__await__(), _NOT_YET
    from ..core.exceptions import ResultTypeError

    raise ResultTypeError(
        f"{name}(record) must return an awaitable (use async def), got {type(awaitable).__name__}"
    )

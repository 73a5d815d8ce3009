"""Carrying out what the pure outcome unit decides (:mod:`keyed_async_wait.core.outcome`).

The runtime never decides here whether to retry, park, fail or emit: it asks the
:class:`OutcomePolicy` and does what the decision says. The success path of a record without
result predicates is the hot path: no decision object is made for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..core.entry import Entry, State
from ..core.exceptions import ResultTypeError
from ..core.outcome import Done, Emit, Expire, Fail, Keep, OutcomePolicy, Park, Retry
from .run import Run
from .timers import Timers

__all__ = ["Outcomes"]


def _unwired(entry: Entry) -> None:  # pragma: no cover - the runtime wires every callback
    raise RuntimeError("dispatch not wired")


class Outcomes:
    """What happens after an attempt: results, an error, a timeout (see the module doc)."""

    __slots__ = ("dispatch", "fn", "policy", "result_retry", "run", "timers", "wall")

    def __init__(self, run: Run, timers: Timers) -> None:
        settings = run.settings
        self.run = run
        self.fn = run.fn
        self.timers = timers
        self.policy = OutcomePolicy(
            settings.retry, settings.on_error, settings.defer, settings.timeout, run.fn.describe
        )
        self.result_retry = self.policy.retry_results
        defer = settings.defer
        self.wall: Callable[[], float] = defer.clock if defer is not None else time.time
        self.dispatch: Callable[[Entry], None] = _unwired  # the next entry of a key may start

    def value(self, entry: Entry, value: Any) -> None:
        """An attempt returned ``value``."""
        try:
            results = self.fn.to_results(value)
        except ResultTypeError as exc:
            self.apply(entry, self.policy.failed(entry, exc, self.wall()))
            return
        if self.result_retry:
            decision = self.policy.after_results(entry, results, self.run.loop.time(), self.run.holding)
            if type(decision) is not Done:
                self.apply(entry, decision)
                return
        self.succeed(entry, results)

    def error(self, entry: Entry, exc: BaseException) -> None:
        """An attempt raised ``exc``."""
        run = self.run
        self.apply(entry, self.policy.after_error(entry, exc, run.loop.time(), self.wall(), run.holding))

    def timed_out(self, entry: Entry) -> None:
        """``entry``'s time ran out (whatever ran it is already stopped): the function's fallback,
        or the timeout error under the error policy."""
        self.run.counters.timeouts += 1
        fallback = self.fn.fallback
        if fallback is None:
            self.apply(entry, self.policy.expired(entry, self.wall()))
            return
        try:
            results = self.fn.to_results(fallback(entry.record))
        except Exception as exc:  # noqa: BLE001 - the record fails with it
            self.apply(entry, self.policy.failed(entry, exc, self.wall()))
        else:
            self.succeed(entry, results)

    def apply(self, entry: Entry, decision: Any) -> None:
        kind = type(decision)
        if kind is Retry:
            self.timers.schedule_retry(entry, decision.delay)
        elif kind is Done:
            self.succeed(entry, decision.results)
        elif kind is Expire:
            self.timed_out(entry)
        elif kind is Keep:  # held: no new attempt; kept, with its attempts, for the leftover
            entry.state = State.READY
            self.timers.disarm(entry)
        elif kind is Park:
            self._park(entry, decision)
        elif kind is Emit:
            self.run.counters.failures += 1
            self.run.plain_output = False
            entry.failure = decision.failed
            self.succeed(entry, [])
        elif kind is Fail:
            self.run.counters.failures += 1
            self.timers.disarm(entry)
            self.run.set_failure(decision.error)
        else:  # pragma: no cover - the policy returns one of the above
            raise AssertionError(f"unknown decision {decision!r}")

    def _park(self, entry: Entry, decision: Park) -> None:
        run = self.run
        self.timers.disarm(entry)
        run.counters.deferred += 1
        run.plain_output = False
        run.ctl.park(entry, decision.info)
        run.notify()

    def succeed(self, entry: Entry, results: list[Any]) -> None:
        run = self.run
        if entry.timer is not None:
            self.timers.disarm(entry)
        entry.results = results
        if run.latency is not None:
            run.latency.add(run.loop.time() - entry.started)
        nxt = run.ctl.finish(entry)
        if nxt is not None:
            self.dispatch(nxt)
        run.notify()

    def succeed_many(self, done: list[Entry]) -> list[Entry]:
        """Entries whose results are set and state DONE (a batch's fast path): the next entries
        of their keys, now ready."""
        run = self.run
        if run.latency is not None:
            now = run.loop.time()
            run.latency.add_many(now - entry.started for entry in done)
        nxt = run.ctl.finish_many(done, marked=True)
        run.notify()
        return nxt

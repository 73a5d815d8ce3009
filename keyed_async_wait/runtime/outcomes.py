"""Carrying out what the pure outcome unit decides (:mod:`keyed_async_wait.core.outcome`).

The runtime never decides here whether to retry, park, fail or emit: it asks the
:class:`OutcomePolicy` and does what the decision says. A record that finishes lets the next
record of its key start: that one is put in the ready queue, which the dispatcher drains after
every settlement. The success path of a record without result predicates is the hot path: no
decision object is made for it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ..core.entry import Entry, State
from ..core.exceptions import ResultTypeError
from ..core.outcome import Done, Emit, Expire, Fail, Keep, OutcomePolicy, Park, Retry
from .run import Run
from .timers import Timers

__all__ = ["Outcomes"]


class Outcomes:
    """What happens after an attempt: results, an error, a timeout (see the module doc)."""

    __slots__ = ("fn", "policy", "ready", "result_retry", "run", "timers", "wall")

    def __init__(self, run: Run, timers: Timers, ready: deque[Entry]) -> None:
        spec = run.spec
        self.run = run
        self.fn = run.fn
        self.timers = timers
        self.ready = ready  # the dispatcher's: entries that may start now
        self.policy = OutcomePolicy(spec.retry, spec.on_error, spec.defer, spec.timeout, run.fn.describe)
        self.result_retry = self.policy.retry_results
        defer = spec.defer
        self.wall: Callable[[], float] = defer.clock if defer is not None else time.time

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
            self.ready.append(nxt)
        if run.prompt and len(run.ctl.out) >= run.prompt:
            run.take_finished()
        run.notify()

    def supersede(self) -> None:
        """Records the controller found superseded (coalescing: a newer one of their key runs
        instead): their results, as the function gives them for such a record."""
        run = self.run
        entries = run.ctl.superseded[:]
        run.ctl.superseded.clear()
        superseded, to_results = self.fn.superseded, self.fn.to_results
        assert superseded is not None
        for entry in entries:
            entry.results = to_results(superseded(entry.record))
        run.notify()

    def succeed_many(self, done: list[Entry]) -> None:
        """Entries whose results are set and state DONE (a batch's fast path); the next entries
        of their keys join the ready queue."""
        run = self.run
        if run.latency is not None:
            now = run.loop.time()
            run.latency.add_many(now - entry.started for entry in done)
        nxt = run.ctl.finish_many(done, marked=True)
        if nxt:
            self.ready.extend(nxt)
        if run.prompt and len(run.ctl.out) >= run.prompt:
            run.take_finished()
        run.notify()

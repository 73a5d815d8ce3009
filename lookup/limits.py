"""What a lookup may ask of its service: a rate limit, an adaptive concurrency limit and a
circuit breaker, per lookup and worker process.

:class:`Limits` is the plain, picklable description a lookup is given; :class:`Gate` is made
from it lazily inside the event loop that uses it, and every call of the lookup passes through
it: :meth:`Gate.enter` before the call, :meth:`Gate.leave` with its outcome after. The gate
only awaits what the pure policies of :mod:`lookup.throttle` decide.

Invariants: calls in flight never exceed the adaptive limit (when on); call starts never exceed
``burst + rate * T`` in ``T`` seconds; after a ``Retry-After`` no call of the lookup starts
before that time (the whole lookup pauses, not only the record that got it); while the circuit
is open, no call starts and records fail at once with :class:`CircuitOpenError`.

The rate is per worker process, unless ``shared`` names a job-wide rate in Redis
(:mod:`lookup.shared_rate`): then every process of every executor takes its tokens from that
one bucket, and executors that come and go change nothing. ``budget`` goes further
(:mod:`lookup.budget`): calls in flight, calls and cost units per second and the adaptive limit
held for the whole job, following what the service's headers say of its quota. Without Redis,
a job-wide budget of R calls/s over P worker processes is ``rate=R / P`` (executors x cores for
Spark's Python workers), and holds only while P does.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from keyed_async_wait.core.exceptions import ConfigError

from .budget import Budget, BudgetClient, BudgetStats, Cost
from .exceptions import CircuitOpenError, LookupTimeoutError, RateLimitedError, ServiceUnavailableError
from .quota_headers import quotas_of
from .shared_rate import SharedBuckets, SharedRate
from .throttle import AimdLimit, CircuitBreaker, TokenBucket

__all__ = ["Gate", "Limits", "SharedRate", "ThrottleStats", "Ticket", "heard", "through_gate"]


@dataclass(frozen=True)
class Limits:
    """Parameters
    ----------
    rate : float, optional
        Calls per second (a batch call is one), per worker process.
    keys_rate : float, optional
        Keys per second for batch calls, per worker process.
    burst : float, optional
        Calls saved up while idle (default: one second's worth).
    adaptive : bool
        Find the service's capacity: calls in flight between 1 and ``max_concurrency``, growing
        while answers succeed and latency holds, shrinking on 429, 503, timeouts and latency
        rising (AIMD).
    max_concurrency : int
        The adaptive limit's ceiling (match the operator's capacity).
    breaker_failures : int, optional
        Failed calls in a row (5xx, 429, timeouts, refused) that open the circuit; None: no
        breaker.
    breaker_cool_off : float
        Seconds the circuit stays open before one probe goes out.
    shared : SharedRate, optional
        Hold ``rate`` and ``keys_rate`` for the whole job, in Redis, instead of per process.
    budget : Budget, optional
        One budget for the whole job, in Redis: calls in flight, calls and cost units per
        second, an adaptive limit, the service's own quota (see :class:`~lookup.Budget`).
        Works beside the per-process limits above.
    cost : Cost, optional
        What a call costs in the budget's units (default: 1 per call).
    """

    rate: float | None = None
    keys_rate: float | None = None
    burst: float | None = None
    adaptive: bool = False
    max_concurrency: int = 100
    breaker_failures: int | None = None
    breaker_cool_off: float = 5.0
    shared: SharedRate | None = None
    budget: Budget | None = None
    cost: Cost | None = None

    def __post_init__(self) -> None:
        # every setting checked when made, not in a task, by the name the caller wrote
        keys_rate, failures = self.keys_rate, self.breaker_failures
        if keys_rate is not None:
            _as_named({"rate": "keys_rate"}, lambda: TokenBucket(keys_rate, self.burst))
        if failures is not None:
            names = {"failures": "breaker_failures", "cool_off": "breaker_cool_off"}
            _as_named(names, lambda: CircuitBreaker(failures, self.breaker_cool_off))
        Gate(self)
        if self.shared is not None:
            if not isinstance(self.shared, SharedRate):
                raise ConfigError("shared", self.shared, "a SharedRate(url, name), or None")
            if self.rate is None and self.keys_rate is None:
                raise ConfigError("shared", self.shared, "None unless rate= or keys_rate= is given")
        if self.budget is not None and not isinstance(self.budget, Budget):
            raise ConfigError("budget", self.budget, "a Budget(url, name, ...), or None")
        if self.cost is not None and not isinstance(self.cost, Cost):
            raise ConfigError("cost", self.cost, "a Cost(...), or None")
        if self.cost is not None and self.budget is None:
            raise ConfigError("cost", self.cost, "None unless budget= is given (units are a budget's)")


def _as_named(names: dict[str, str], make: Callable[[], object]) -> None:
    """``make()``, its ConfigError naming the parameter as :class:`Limits` calls it."""
    try:
        make()
    except ConfigError as exc:
        raise ConfigError(names.get(exc.name, exc.name), exc.value, exc.allowed) from None


@dataclass
class ThrottleStats:
    """What the gate did (read-only for callers)."""

    throttled_s: float = 0.0  # seconds calls waited for the rate, a pause or the limit
    rejected: int = 0  # 429 answers
    unavailable: int = 0  # 503 and other 5xx, refused, reset
    timeouts: int = 0
    short_circuited: int = 0  # records failed at once while the circuit was open
    breaker_opened: int = 0
    limit: int = 0  # the adaptive limit now (0: none)

    def counters(self) -> dict[str, int]:
        """The counts under the names the metrics and the task log give them."""
        return {
            "rejected_429": self.rejected,
            "unavailable_5xx": self.unavailable,
            "short_circuited": self.short_circuited,
            "throttled_ms": int(self.throttled_s * 1000),
            "breaker_opened": self.breaker_opened,
        }


_OVERLOAD = (RateLimitedError, ServiceUnavailableError, LookupTimeoutError, asyncio.CancelledError)


@dataclass
class Ticket:
    """One call through a gate: when it started, its lease in the job's budget and the units it
    was charged, and what its answer said (its headers, told by the service with :func:`heard`)."""

    started: float
    lease: str | None = None
    units: float = 0.0
    headers: Mapping[str, str] | None = None
    answer: Any = None


_CALL: contextvars.ContextVar[Ticket | None] = contextvars.ContextVar("kaw_call", default=None)


def heard(headers: Mapping[str, str]) -> None:
    """What a service's answer said in its headers, for the call running in this task (its
    quota, its cost): a lookup's client calls it with every answer."""
    ticket = _CALL.get()
    if ticket is not None:
        ticket.headers = headers


class Gate:
    """The asyncio side of :class:`Limits` for one lookup in one event loop."""

    def __init__(self, limits: Limits) -> None:
        self.bucket = TokenBucket(limits.rate, limits.burst) if limits.rate is not None else None
        self.keys_bucket = (
            TokenBucket(limits.keys_rate, limits.burst) if limits.keys_rate is not None else None
        )
        if not isinstance(limits.max_concurrency, int) or limits.max_concurrency < 1:
            raise ConfigError("max_concurrency", limits.max_concurrency, "an integer >= 1")
        self.limit = AimdLimit(limits.max_concurrency) if limits.adaptive else None
        failures = limits.breaker_failures
        self.breaker = CircuitBreaker(failures, limits.breaker_cool_off) if failures is not None else None
        self.shared = limits.shared  # reserved through Redis instead of the local buckets
        self._buckets: SharedBuckets | None = None  # its client, made at the first call
        self.budget, self.cost = limits.budget, limits.cost or Cost()
        self._budget: BudgetClient | None = None  # made at the first call
        self._releasing: set[asyncio.Task[None]] = set()
        self.in_flight = 0
        self.paused_until = 0.0
        self._waiting: deque[asyncio.Future[None]] = deque()
        self.stats = ThrottleStats(limit=self.limit.allowed if self.limit else 0)

    async def enter(self, keys: int, lookup_key: Any, service: str, units: float | None = None) -> Ticket:
        """Wait until a call of ``keys`` keys (costing ``units``) may start; its ticket."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        wait = self.paused_until - now
        if self.shared is not None:
            wait = max(wait, await self._reserve_shared(keys, lookup_key, service))
            now = loop.time()
        else:
            if self.bucket is not None:
                wait = max(wait, self.bucket.reserve(now))
            if self.keys_bucket is not None:
                wait = max(wait, self.keys_bucket.reserve(now, keys))
        if wait > 0:
            self.stats.throttled_s += wait
            await asyncio.sleep(wait)
        await self._within_limit(loop)
        breaker = self.breaker
        now = loop.time()
        if breaker is not None and not breaker.allow(now):
            self.stats.short_circuited += 1
            raise CircuitOpenError(
                f"not called: the circuit is open after repeated failures (probe in "
                f"{breaker.remaining(now):.1f} s)",
                lookup_key=lookup_key,
                service=service,
                retry_after=breaker.remaining(now),
            )
        ticket = Ticket(now)
        if self.budget is not None:
            ticket.units = self.cost.estimate((), keys) if units is None else units
            if self._budget is None:
                self._budget = self.budget.connect()
            ticket.lease = await self._budget.acquire(ticket.units, lookup_key=lookup_key, service=service)
            paused = self.paused_until - loop.time()
            if paused > 0:  # a refusal came while this call waited for its paced start
                self.stats.throttled_s += paused
                await asyncio.sleep(paused)
            ticket.started = loop.time()
        self.in_flight += 1
        return ticket

    async def _within_limit(self, loop: asyncio.AbstractEventLoop) -> None:
        limit = self.limit
        while limit is not None and self.in_flight >= limit.allowed:
            waiter = loop.create_future()
            self._waiting.append(waiter)
            started = loop.time()
            try:
                await waiter
            except asyncio.CancelledError:
                self._wake()  # a place it was woken for goes to the next waiter
                raise
            finally:
                self.stats.throttled_s += loop.time() - started

    async def _reserve_shared(self, keys: int, lookup_key: Any, service: str) -> float:
        if self._buckets is None:
            assert self.shared is not None
            self._buckets = self.shared.connect()
        wait = 0.0
        for kind, bucket, n in (("rate", self.bucket, 1), ("keys", self.keys_bucket, keys)):
            if bucket is not None:
                reserved = await self._buckets.reserve(
                    kind, bucket.rate, bucket.burst, n, lookup_key=lookup_key, service=service
                )
                wait = max(wait, reserved)
        return wait

    async def aclose(self) -> None:
        """Close the shared budgets' clients (nothing else holds a resource)."""
        if self._releasing:
            await asyncio.gather(*self._releasing, return_exceptions=True)
        buckets, self._buckets = self._buckets, None
        if buckets is not None:
            await buckets.aclose()
        budget, self._budget = self._budget, None
        if budget is not None:
            await budget.aclose()

    def leave(self, ticket: Ticket, exc: BaseException | None) -> None:
        """The call that :meth:`enter` let start ended (``exc``: how it failed, or None)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        self.in_flight -= 1
        overload = isinstance(exc, _OVERLOAD)
        self._count(exc)
        retry_after = getattr(exc, "retry_after", None)
        if retry_after:  # the service said when to come back: the whole lookup waits
            self.paused_until = max(self.paused_until, now + float(retry_after))
        if self.limit is not None:
            if overload:
                self.limit.overloaded(now)
            elif exc is None:
                self.limit.succeeded(now - ticket.started, now)
            self.stats.limit = self.limit.allowed
        if self.breaker is not None:
            was_open = self.breaker.state
            self.breaker.record(not overload, now)
            if self.breaker.state == CircuitBreaker.OPEN and was_open != CircuitBreaker.OPEN:
                self.stats.breaker_opened += 1
        self._wake()

    async def give_back(
        self, ticket: Ticket, exc: BaseException | None, lookup_key: Any, service: str
    ) -> None:
        """The call's lease back to the job's budget, with what its answer said."""
        if ticket.lease is None or self._budget is None:
            return
        used = self.cost.used(ticket.headers, ticket.answer)
        quotas = quotas_of(ticket.headers) if ticket.headers is not None else None
        overload = isinstance(exc, _OVERLOAD)
        paused = await self._budget.release(
            ticket.lease,
            outcome="overload" if overload else "ok" if exc is None else "other",
            latency=asyncio.get_running_loop().time() - ticket.started,
            used=used,
            retry_after=float(getattr(exc, "retry_after", 0) or 0),
            quotas=quotas,
            lookup_key=lookup_key,
            service=service,
        )
        if getattr(exc, "retry_after", None) and self.budget is not None and self.budget.follow_headers:
            # the job-wide pause the budget made of the Retry-After replaces this process's own
            # (a whole-second Retry-After overshoots a window of a learned quota by up to 1 s)
            self.paused_until = asyncio.get_running_loop().time() + paused

    def give_back_later(self, ticket: Ticket, exc: BaseException, lookup_key: Any, service: str) -> None:
        """:meth:`give_back` in a task of its own (the call was cancelled: it must not wait)."""
        if ticket.lease is None:
            return
        task = asyncio.get_running_loop().create_task(
            self._give_back_quietly(ticket, exc, lookup_key, service)
        )
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)

    async def _give_back_quietly(
        self, ticket: Ticket, exc: BaseException, lookup_key: Any, service: str
    ) -> None:
        with contextlib.suppress(Exception):  # unreachable: the lease expires on its own
            await self.give_back(ticket, exc, lookup_key, service)

    @property
    def budget_stats(self) -> BudgetStats | None:
        return self._budget.stats if self._budget is not None else None

    def _count(self, exc: BaseException | None) -> None:
        if isinstance(exc, RateLimitedError):
            self.stats.rejected += 1
        elif isinstance(exc, ServiceUnavailableError):
            self.stats.unavailable += 1
        elif isinstance(exc, (LookupTimeoutError, asyncio.CancelledError)):
            self.stats.timeouts += 1

    def _wake(self) -> None:
        room = (self.limit.allowed if self.limit is not None else 1 << 30) - self.in_flight
        while room > 0 and self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():  # a cancelled waiter takes no room
                waiter.set_result(None)
                room -= 1


async def through_gate(
    gate: Gate, call: Any, argument: Any, keys: int, lookup_key: Any, service: str, units: float | None = None
) -> Any:
    """``call(argument)`` once ``gate`` lets a call of ``keys`` keys start, its outcome told to
    the gate (and its lease given back to the job's budget, with what the answer said)."""
    ticket = await gate.enter(keys, lookup_key, service, units)
    token = _CALL.set(ticket)
    try:
        answer = await call(argument)
    except asyncio.CancelledError as exc:
        gate.leave(ticket, exc)
        gate.give_back_later(ticket, exc, lookup_key, service)
        raise
    except BaseException as exc:
        gate.leave(ticket, exc)
        await gate.give_back(ticket, exc, lookup_key, service)
        raise
    finally:
        _CALL.reset(token)
    gate.leave(ticket, None)
    if ticket.lease is not None:
        ticket.answer = answer
        await gate.give_back(ticket, None, lookup_key, service)
    return answer

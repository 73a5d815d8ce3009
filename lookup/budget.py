"""One budget for the whole job: the service's quota (calls in flight, calls per second, cost
units per second) held in Redis for every task of every executor, and for every job that
names the same budget.

:class:`Budget` is the plain, picklable description a lookup's :class:`~lookup.Limits` is
given; :class:`BudgetClient` is made from it inside the event loop that uses it. A call takes
a *lease* before it starts (:meth:`BudgetClient.acquire`) and gives it back with what the
answer said when it ends (:meth:`BudgetClient.release`): the outcome (for the adaptive limit),
the cost units it really used (settled against what it was charged: the estimate scaled by
what calls have been using of their estimates, learned job-wide), a
``Retry-After``, and the quota the service stated in its headers (:mod:`lookup.quota_headers`),
which the whole job then follows. The scripts (:mod:`lookup.budget_scripts`) decide atomically
on Redis's clock.

Invariants: a call starts only holding a lease the budget granted; a process renews its
leases while their calls run, so a lease outlives its holder (a killed task) by at most
``lease`` seconds; within a process acquisitions are served first come, first served (one
asks Redis at a time), so no task or key starves; across groups (jobs), a group past its
weighted share waits while another group is waiting. If Redis cannot be reached a call does
not start: it fails as retryable (:class:`~lookup.ServiceUnavailableError`), never unlimited.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from keyed_async_wait.core.exceptions import ConfigError

from .budget_scripts import ACQUIRE, PAUSED, RELEASE, RENEW
from .exceptions import ServiceUnavailableError
from .quota_headers import CALLS, UNITS, ServiceQuota
from .redis_connect import RedisClient, RedisConnection

__all__ = ["Budget", "BudgetClient", "BudgetStats", "Cost"]

_POLL_FIRST, _POLL_MOST = 0.001, 0.05  # seconds between asks while the budget is full


def _number(name: str, value: Any, *, integer: bool = False, optional: bool = True) -> Any:
    if value is None and optional:
        return None
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not value > 0:
        raise ConfigError(name, value, "an integer >= 1" if integer else "a number > 0")
    return value


@dataclass(frozen=True)
class Cost:
    """What a call costs in the budget's units: charged before it starts (``units`` per call,
    plus ``per_key`` per key of a batch call, or the record's ``column``), settled after by what
    the answer says (``from_header``, or ``from_field``: a dotted path into the JSON answer).

    Parameters
    ----------
    units : float
        Units charged per call (per record with ``column``).
    per_key : float
        Units charged per key of a batch call, besides ``units``.
    column : str, optional
        A record column holding the record's estimate (a prompt's token count).
    from_header, from_field : str, optional
        Where the answer states what the call used; the difference from the estimate is
        settled (charged or given back) when the call ends.
    """

    units: float = 1.0
    per_key: float = 0.0
    column: str | None = None
    from_header: str | None = None
    from_field: str | None = None

    def __post_init__(self) -> None:
        for name in ("units", "per_key"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ConfigError(f"cost {name}", value, "a number >= 0")

    def estimate(self, records: Sequence[Any], keys: int) -> float:
        """The units charged for one call asking ``keys`` keys for ``records``."""
        if self.column is None:
            return self.units + self.per_key * keys
        total = 0.0
        for record in records:
            value = record.get(self.column) if isinstance(record, Mapping) else None
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ConfigError(f"cost column {self.column!r}", value, "a number >= 0 in every record")
            total += value
        return total

    def used(self, headers: Mapping[str, str] | None, answer: Any) -> float | None:
        """What the answer says the call used (None when it says nothing)."""
        if self.from_header is not None and headers is not None:
            for name, value in headers.items():
                if str(name).lower() == self.from_header.lower():
                    with contextlib.suppress(ValueError):
                        return max(0.0, float(value))
        if self.from_field is not None:
            node = answer
            for part in self.from_field.split("."):
                node = node.get(part) if isinstance(node, Mapping) else None
            if isinstance(node, (int, float)) and not isinstance(node, bool) and node >= 0:
                return float(node)
        return None


@dataclass(frozen=True, init=False)
class Budget:
    """One quota for the whole job, in Redis (see the module).

    Parameters
    ----------
    redis : str or RedisConnection
        Where it is held (any topology of :class:`~lookup.RedisConnection`; the password never
        shows).
    name : str
        The budget's name: lookups and jobs naming the same one share it.
    rate : float, optional
        Calls per second, for the whole job (a batch call is one).
    burst : float, optional
        Calls saved up while idle (default 1: calls start evenly spaced, never in a burst that
        a service counting in windows would refuse).
    in_flight : int, optional
        Calls in flight at most, for the whole job.
    units_rate, units_burst : float, optional
        Cost units per second (see :class:`Cost`), and how many may be saved up.
    adaptive : bool
        An adaptive concurrency limit shared by the job (AIMD, as ``Limits(adaptive=True)``,
        its limit kept in Redis): it shrinks on 429, 503 and timeouts anywhere in the job.
    max_concurrency : int
        The adaptive limit's ceiling.
    weight : float
        This group's share when several share the budget (by weight, among those asking).
    group : str, optional
        Who shares a fair share: by default this ``Budget`` object (one job: its tasks share
        it); give the same group to pool several lookups' shares.
    lease : float
        Seconds a task's place in flight outlives the task (a killed task's places come back
        after at most this long; running calls renew theirs).
    follow_headers : bool
        Follow what the service says of its quota (``Retry-After``, ``RateLimit``,
        ``X-RateLimit-*``): its remaining calls and policy rate, job-wide.
    headroom : float
        The share of a rate (configured or stated by the service) left unused, so that calls
        the network delays do not crowd a service's counting window past its quota.
    """

    connection: RedisConnection = field(repr=False)
    name: str
    rate: float | None
    burst: float | None
    in_flight: int | None
    units_rate: float | None
    units_burst: float | None
    adaptive: bool
    max_concurrency: int
    weight: float
    group: str
    lease: float
    follow_headers: bool
    headroom: float

    def __init__(
        self,
        redis: str | RedisConnection,
        name: str,
        *,
        rate: float | None = None,
        burst: float | None = None,
        in_flight: int | None = None,
        units_rate: float | None = None,
        units_burst: float | None = None,
        adaptive: bool = False,
        max_concurrency: int = 100,
        weight: float = 1.0,
        group: str | None = None,
        lease: float = 10.0,
        follow_headers: bool = True,
        headroom: float = 0.02,
        **options: Any,
    ) -> None:
        values = {
            "connection": RedisConnection.of(redis, **options),
            "name": name,
            "rate": _number("rate", rate),
            "burst": _number("burst", burst),
            "in_flight": _number("in_flight", in_flight, integer=True),
            "units_rate": _number("units_rate", units_rate),
            "units_burst": _number("units_burst", units_burst),
            "adaptive": bool(adaptive),
            "max_concurrency": _number("max_concurrency", max_concurrency, integer=True, optional=False),
            "weight": _number("weight", weight, optional=False),
            "group": group if group is not None else uuid.uuid4().hex[:12],
            "lease": _number("lease", lease, optional=False),
            "follow_headers": bool(follow_headers),
            "headroom": headroom,
        }
        for key, value in values.items():
            object.__setattr__(self, key, value)
        if not isinstance(name, str) or not name or any(c.isspace() or c in "{}" for c in name):
            raise ConfigError("budget name", name, "a non-empty name without spaces or braces")
        if isinstance(headroom, bool) or not isinstance(headroom, (int, float)) or not 0 <= headroom < 0.5:
            raise ConfigError("headroom", headroom, "a share from 0 to 0.5")
        if not isinstance(self.group, str) or not self.group or "|" in self.group:
            raise ConfigError("group", self.group, "a non-empty name without '|'")
        if not (rate or in_flight or units_rate or adaptive or follow_headers):
            raise ConfigError("Budget", name, "at least one of rate=, in_flight=, units_rate=, adaptive=True")

    def __repr__(self) -> str:
        said = [f"{n}={getattr(self, n)}" for n in ("rate", "in_flight", "units_rate") if getattr(self, n)]
        return f"Budget(url={self.connection.shown!r}, name={self.name!r}{''.join(', ' + s for s in said)})"

    @property
    def keys(self) -> list[str]:
        """Its Redis keys (one slot on a cluster: the name is their hash tag)."""
        base = f"kaw:budget:{{{self.name}}}"
        return [base, base + ":leases", base + ":groups"]

    def connect(self) -> BudgetClient:
        """The asyncio side, made inside the event loop that uses it."""
        return BudgetClient(self)


@dataclass
class BudgetStats:
    """What one process's budget client did (read-only for callers)."""

    waits: int = 0  # asks refused: the call waited
    wait_s: float = 0.0
    units: float = 0.0  # units charged and settled
    followed: str = ""  # the limit in force at the last grant, and where it came from
    last_refusal: str = ""


class BudgetClient:
    """A :class:`Budget` in one event loop (see the module)."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.stats = BudgetStats()
        self._client: RedisClient = budget.connection.connect()
        self._scripts: dict[str, Any] = {}
        self._turn = asyncio.Lock()  # one acquisition asks Redis at a time: first come, first served
        self._held: set[str] = set()
        self._charged: dict[str, tuple[float, float]] = {}  # lease -> (estimate, units charged)
        self._renewer: asyncio.Task[None] | None = None

    async def acquire(self, units: float, *, lookup_key: Any, service: str) -> str:
        """Wait for a place in the budget for a call costing ``units``; its lease."""
        budget = self.budget
        lease = f"{budget.group}|{uuid.uuid4().hex[:16]}"
        args = [
            budget.group, budget.weight, lease, budget.lease, budget.rate or 0, budget.burst or 0,
            budget.units_rate or 0, budget.units_burst or 0, budget.in_flight or 0, units,
            "1" if budget.adaptive else "0", budget.max_concurrency, budget.headroom,
            "1" if budget.follow_headers else "0",
        ]  # fmt: skip
        loop = asyncio.get_running_loop()
        async with self._turn:
            poll = _POLL_FIRST
            while True:
                granted, wait, why, *charged = await self._run("acquire", args, lookup_key, service)
                if int(granted) == 0:
                    if float(wait) > 0:  # granted, for a start that long from now: the rate's pace
                        started = loop.time()
                        await asyncio.sleep(float(wait))
                        # a refusal anywhere in the job while it waited paused the job: then
                        # it starts after the pause, not into another refusal
                        paused = float(_text(await self._run("paused", [], lookup_key, service)))
                        if paused > 0:
                            await asyncio.sleep(paused)
                        self.stats.wait_s += loop.time() - started
                    break
                self.stats.waits += 1
                self.stats.last_refusal = _text(why)
                seconds = float(wait)
                if seconds <= 0:  # full: ask again soon, then less often
                    seconds, poll = poll, min(poll * 2, _POLL_MOST)
                seconds *= 1 + random.random() * 0.1  # processes that wait together ask apart
                started = loop.time()
                await asyncio.sleep(seconds)
                self.stats.wait_s += loop.time() - started
        self.stats.followed = _text(why)
        charge = float(charged[0]) if charged else units
        self.stats.units += charge
        self._charged[lease] = (units, charge)
        self._held.add(lease)
        if self._renewer is None:
            self._renewer = loop.create_task(self._renew())
        return lease

    async def release(
        self,
        lease: str,
        *,
        outcome: str,
        latency: float,
        used: float | None = None,
        retry_after: float = 0.0,
        quotas: Mapping[str, ServiceQuota] | None = None,
        lookup_key: Any = None,
        service: str = "service",
    ) -> float:
        """Give ``lease`` back with what the call's answer said (``used``: the units it used,
        settled against what it was charged; None: the answer did not say). Returns the
        seconds the whole job is paused for from now (0: none): after a refusal, what the
        budget made of its ``Retry-After``."""
        self._held.discard(lease)
        estimate, charged = self._charged.pop(lease, (0.0, 0.0))
        settle = 0.0 if used is None else used - charged
        budget = self.budget
        said: list[Any] = []
        for kind in (CALLS, UNITS):
            quota = (quotas or {}).get(kind) if budget.follow_headers else None
            said += _quota_args(quota)
        args = [
            budget.group, lease, settle, outcome, latency, "1" if budget.adaptive else "0",
            budget.max_concurrency, retry_after if budget.follow_headers else 0, *said,
            estimate, "" if used is None else used, budget.headroom,
        ]  # fmt: skip
        self.stats.units += settle
        answer = await self._run("release", args, lookup_key, service)
        return float(_text(answer[1])) if isinstance(answer, list) and len(answer) > 1 else 0.0

    async def _renew(self) -> None:
        """Every third of a lease: the leases of the calls still running stay alive."""
        every = self.budget.lease / 3
        while True:
            await asyncio.sleep(every)
            if self._held:
                with contextlib.suppress(ServiceUnavailableError):  # the next ask says so
                    await self._run(
                        "renew", [self.budget.group, self.budget.lease, *self._held], None, "budget"
                    )

    async def _run(self, name: str, args: list[Any], lookup_key: Any, service: str) -> Any:
        try:
            async with self._client.held() as client:
                script = self._scripts.get(name)
                if script is None:
                    source = {"acquire": ACQUIRE, "release": RELEASE, "renew": RENEW, "paused": PAUSED}[name]
                    script = self._scripts[name] = client.register_script(source)
                return await script(keys=self.budget.keys, args=args)
        except Exception as exc:
            from .redis_errors import gate_error  # here: redis-py is imported only where it is used

            error = gate_error(
                exc, f"the budget {self.budget.name!r}", self.budget.connection.shown, lookup_key, service
            )
            if error is exc:
                raise
            raise error from None

    async def aclose(self) -> None:
        renewer, self._renewer = self._renewer, None
        if renewer is not None:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer
        await self._client.aclose()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _quota_args(quota: ServiceQuota | None) -> list[Any]:
    """What the release script reads of a stated quota: remaining, reset, limit, window (''
    when not said) and whether the reset is exact."""
    if quota is None:
        return ["", "", "", "", ""]
    return [
        "" if quota.remaining is None or quota.reset is None else quota.remaining,
        "" if quota.reset is None else quota.reset,
        "" if quota.limit is None else quota.limit,
        "" if quota.limit is None or not quota.window else quota.window,
        "1" if quota.exact else "",
    ]

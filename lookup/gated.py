"""What lookups and writes share of their :class:`~lookup.Limits`: a gate per event loop, made
there on first use (never pickled), calls through it, and what it counted."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from keyed_async_wait.core.exceptions import ConfigError

from .limits import Gate, Limits, ThrottleStats, through_gate

__all__ = ["Gated", "checked_limits"]


class Gated:
    """The limits of a lookup or a write (its attributes are the owner's)."""

    limits: Limits | None
    service_name: str
    _gate: Gate | None = None
    _gate_loop: asyncio.AbstractEventLoop | None = None

    def gate(self) -> Gate | None:
        """The gate of the running event loop (None without limits), made there on first use."""
        if self.limits is None:
            return None
        loop = asyncio.get_running_loop()
        if self._gate is None or self._gate_loop is not loop:
            self._gate, self._gate_loop = Gate(self.limits), loop
        return self._gate

    @property
    def throttle_stats(self) -> ThrottleStats | None:
        """What the limits did in this process (None without limits, or before the first call)."""
        return self._gate.stats if self._gate is not None else None

    def _gated(
        self, call: Any, argument: Any, keys: int, lookup_key: Any, units: float | None = None
    ) -> Awaitable[Any]:
        """``call(argument)`` to await, through the gate when there are limits (without limits
        the call itself: no coroutine in between on the hot path)."""
        gate = self.gate()
        if gate is None:
            return call(argument)
        return through_gate(gate, call, argument, keys, lookup_key, self.service_name, units)

    def _units(self, records: Any, keys: int) -> float | None:
        """The budget units a call for ``records`` costs (None without a budget)."""
        limits = self.limits
        if limits is None or limits.budget is None or limits.cost is None:
            return None
        return limits.cost.estimate(records, keys)

    def limit_counters(self) -> dict[str, int]:
        """What the limits and the job's budget did in this process so far (none without)."""
        counts: dict[str, int] = {}
        throttle = self.throttle_stats
        if throttle is not None:
            counts.update(
                rejected_429=throttle.rejected,
                unavailable_5xx=throttle.unavailable,
                short_circuited=throttle.short_circuited,
                throttled_ms=int(throttle.throttled_s * 1000),
                breaker_opened=throttle.breaker_opened,
            )
        budget = self._gate.budget_stats if self._gate is not None else None
        if budget is not None:
            counts.update(
                budget_waits=budget.waits,
                budget_wait_ms=int(budget.wait_s * 1000),
                budget_units=int(budget.units),
            )
        return counts

    async def _close_gate(self) -> None:
        gate, self._gate, self._gate_loop = self._gate, None, None
        if gate is not None:
            await gate.aclose()


def checked_limits(limits: Any) -> Limits | None:
    """``limits=`` checked when a lookup or a write is made."""
    if limits is not None and not isinstance(limits, Limits):
        raise ConfigError("limits", limits, "a Limits(...) or None")
    return limits

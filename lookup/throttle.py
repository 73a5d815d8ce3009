"""How fast and how much to call a service: pure policies that decide, never sleep.

- :class:`TokenBucket`: a rate limit (calls or keys per second, with a burst). ``reserve``
  takes tokens and says how long to wait before using them.
- :class:`AimdLimit`: an adaptive concurrency limit (additive increase, multiplicative
  decrease, as TCP's): it grows while answers succeed and latency holds, and shrinks on
  overload (429, 503, timeouts) and on latency rising above its baseline.
- :class:`CircuitBreaker`: after sustained failures, calls stop for a cool-off; then one probe
  is let through (half-open), and its outcome closes or re-opens the circuit.

The asyncio layer (``lookup.limits``) awaits what these decide. Invariants (property-tested):
a bucket never grants more than ``burst + rate * T`` tokens in ``T`` seconds; a limit stays in
``[minimum, maximum]``; an open circuit lets nothing through before its cool-off ends, and then
exactly one probe at a time.
"""

from __future__ import annotations

import math

from keyed_async_wait.core.exceptions import ConfigError

__all__ = ["AimdLimit", "CircuitBreaker", "TokenBucket"]


def _positive(name: str, value: float) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value <= 0:
        raise ConfigError(name, value, "a number > 0")
    return float(value)


class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` (default: one second's worth) saved up."""

    __slots__ = ("_last", "_tokens", "burst", "rate")

    def __init__(self, rate: float, burst: float | None = None) -> None:
        self.rate = _positive("rate", rate)
        self.burst = _positive("burst", burst if burst is not None else max(1.0, rate))
        self._tokens = self.burst
        self._last: float | None = None

    def reserve(self, now: float, n: float = 1.0) -> float:
        """Take ``n`` tokens at ``now`` (monotonic seconds): the seconds to wait before using them
        (0 when they were there). Reservations queue: each waits for the ones before it."""
        if self._last is not None:
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now
        self._tokens -= n
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate


class AimdLimit:
    """A concurrency limit between ``minimum`` and ``maximum``, starting at ``initial``.

    Until the first overload, each success adds 1 (slow start, as TCP's: the limit doubles per
    round trip); after it, each success adds ``1 / limit`` (one more per round), unless its
    latency exceeds ``tolerance`` times the baseline (the lowest latency seen lately), which
    counts as overload. Overload multiplies the limit by ``backoff``, at most once per
    ``cooldown`` (default: the baseline latency, about one round trip), so that one burst of
    rejections from the calls already in flight shrinks it once, not once per call.
    """

    __slots__ = (
        "_baseline",
        "_last_cut",
        "_slow_start",
        "backoff",
        "cooldown",
        "limit",
        "maximum",
        "minimum",
        "tolerance",
    )

    def __init__(
        self,
        maximum: int,
        *,
        minimum: int = 1,
        initial: int | None = None,
        backoff: float = 0.5,
        tolerance: float = 2.0,
        cooldown: float | None = None,
    ) -> None:
        if not isinstance(maximum, int) or isinstance(maximum, bool) or maximum < 1:
            raise ConfigError("maximum", maximum, "an integer >= 1")
        if not isinstance(minimum, int) or isinstance(minimum, bool) or not 1 <= minimum <= maximum:
            raise ConfigError("minimum", minimum, f"an integer from 1 to maximum ({maximum})")
        if not 0 < backoff < 1:
            raise ConfigError("backoff", backoff, "a factor between 0 and 1")
        if not tolerance > 1:
            raise ConfigError("tolerance", tolerance, "a factor > 1")
        self.maximum, self.minimum = maximum, minimum
        self.limit = float(min(maximum, max(minimum, initial if initial is not None else minimum * 4)))
        self.backoff, self.tolerance = backoff, tolerance
        self.cooldown = cooldown
        self._baseline: float | None = None
        self._last_cut = -math.inf
        self._slow_start = True

    @property
    def allowed(self) -> int:
        """Calls that may be in flight now."""
        return int(self.limit)

    def succeeded(self, latency: float, now: float) -> None:
        baseline = self._baseline
        if baseline is None or latency < baseline:
            self._baseline = baseline = max(latency, 1e-6)
        else:  # forget slowly, so that a service that got slower for good sets a new baseline
            self._baseline = baseline = baseline * 1.01
        if latency > self.tolerance * baseline:
            self.overloaded(now)
            return
        step = 1.0 if self._slow_start else 1.0 / self.limit
        self.limit = min(float(self.maximum), self.limit + step)

    def overloaded(self, now: float) -> None:
        cooldown = self.cooldown if self.cooldown is not None else (self._baseline or 0.0)
        if now - self._last_cut < cooldown:
            return
        self._last_cut = now
        self._slow_start = False
        self.limit = max(float(self.minimum), self.limit * self.backoff)


class CircuitBreaker:
    """Opens after ``failures`` failed calls in a row; stays open ``cool_off`` seconds; then lets
    one probe through (half-open): a success closes it, a failure opens it again."""

    CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"

    __slots__ = ("_failures", "_opened", "_probing", "cool_off", "failures", "state")

    def __init__(self, failures: int = 20, cool_off: float = 5.0) -> None:
        if not isinstance(failures, int) or isinstance(failures, bool) or failures < 1:
            raise ConfigError("failures", failures, "an integer >= 1")
        self.failures = failures
        self.cool_off = _positive("cool_off", cool_off)
        self.state = self.CLOSED
        self._failures = 0
        self._opened = 0.0
        self._probing = False

    def allow(self, now: float) -> bool:
        """Whether a call may go out now (a True while half-open is the probe)."""
        if self.state == self.CLOSED:
            return True
        if self.state == self.OPEN:
            if now - self._opened < self.cool_off:
                return False
            self.state = self.HALF_OPEN
        if self._probing:
            return False
        self._probing = True
        return True

    def remaining(self, now: float) -> float:
        """Seconds until a probe may go out (0 when closed)."""
        if self.state == self.CLOSED:
            return 0.0
        return max(0.0, self._opened + self.cool_off - now)

    def record(self, ok: bool, now: float) -> None:
        """The outcome of a call that :meth:`allow` let through."""
        if self.state == self.HALF_OPEN and self._probing:
            self._probing = False
            if ok:
                self.state, self._failures = self.CLOSED, 0
            else:
                self.state, self._opened = self.OPEN, now
            return
        if ok:
            self._failures = 0
            return
        self._failures += 1
        if self.state == self.CLOSED and self._failures >= self.failures:
            self.state, self._opened = self.OPEN, now

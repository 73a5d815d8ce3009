"""A service's quota, as the test service enforces and announces it: at most ``calls`` calls
and ``units`` cost units per window of ``window`` seconds, and ``in_flight`` calls at once;
past any of them an answer is 429 with ``Retry-After``. Every answer states what is left
(``announce``) in the form ``form`` names: ``"ietf"``, the IETF ``RateLimit-Policy`` and
``RateLimit`` headers; ``"x-ratelimit"``, ``X-RateLimit-Limit`` / ``-Remaining`` / ``-Reset``
(an epoch second, as GitHub's; no window stated); ``"retry-after"``, nothing but the 429's
``Retry-After``. An admitted call's answer says what it used (``X-Units-Used``, and
``usage.units`` in its JSON).

Windows are fixed, aligned to the service's clock (as most APIs count; the epoch's seconds for
``"x-ratelimit"``, whose reset is a time). The quota may change while the service runs
(``calls=``, ``units=``): the next answers announce it.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field

__all__ = ["Quota"]


@dataclass
class Quota:
    calls: int | None = None  # per window
    units: float | None = None  # per window
    in_flight: int | None = None
    window: float = 1.0
    announce: bool = True
    form: str = "ietf"  # "ietf", "x-ratelimit" or "retry-after"
    admitted: int = 0
    rejected: int = 0
    units_used: float = 0.0
    peak_in_flight: int = 0
    first_admitted: float | None = None  # monotonic seconds of the first and last admission
    last_admitted: float | None = None
    _window_start: float = 0.0
    _calls: int = 0
    _units: float = 0.0
    _running: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def admit(self, units: float, now: float | None = None) -> tuple[bool, dict[str, str]]:
        """Whether a call costing ``units`` may run now, and the headers of its answer."""
        if now is None:
            now = time.time() if self.form == "x-ratelimit" else time.monotonic()
        with self._lock:
            start = math.floor(now / self.window) * self.window
            if start != self._window_start:
                self._window_start, self._calls, self._units = start, 0, 0.0
            over = (
                (self.calls is not None and self._calls + 1 > self.calls)
                or (self.units is not None and self._units + units > self.units)
                or (self.in_flight is not None and self._running + 1 > self.in_flight)
            )
            if over:
                self.rejected += 1
            else:
                self._calls += 1
                self._units += units
                self._running += 1
                self.admitted += 1
                self.units_used += units
                if self.first_admitted is None:
                    self.first_admitted = now
                self.last_admitted = now
                self.peak_in_flight = max(self.peak_in_flight, self._running)
            headers = self._headers(start + self.window - now, start + self.window)
            if over:
                headers["Retry-After"] = str(max(1, math.ceil(start + self.window - now)))
            return not over, headers

    def used(self) -> float:
        """The share of the calls quota used from the first admission to the last."""
        if self.calls is None or self.first_admitted is None or self.last_admitted is None:
            return 0.0
        seconds = self.last_admitted - self.first_admitted
        return (self.admitted - 1) / (self.calls / self.window * seconds) if seconds > 0 else 0.0

    def done(self) -> None:
        with self._lock:
            self._running -= 1

    def _headers(self, left: float, end: float) -> dict[str, str]:
        if not self.announce or self.form == "retry-after":
            return {}
        if self.form == "x-ratelimit":
            if self.calls is None:
                return {}
            return {
                "X-RateLimit-Limit": str(self.calls),
                "X-RateLimit-Remaining": str(max(0, self.calls - self._calls)),
                "X-RateLimit-Reset": str(math.ceil(end)),  # the epoch second the window ends
            }
        reset = max(1, math.ceil(left))  # an integer of seconds, as the field's t
        policies, state = [], []
        if self.calls is not None:
            policies.append(f'"calls";q={self.calls};w={math.ceil(self.window)}')
            state.append(f'"calls";r={max(0, self.calls - self._calls)};t={reset}')
        if self.units is not None:
            policies.append(f'"units";q={round(self.units)};w={math.ceil(self.window)};qu="units"')
            state.append(f'"units";r={max(0, round(self.units - self._units))};t={reset}')
        if not policies:
            return {}
        return {"RateLimit-Policy": ", ".join(policies), "RateLimit": ", ".join(state)}

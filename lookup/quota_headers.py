"""What a service says of its quota in an answer's headers, read into one shape.

The forms read (a name is case-insensitive):

- the IETF ``RateLimit-Policy`` and ``RateLimit`` fields (draft-ietf-httpapi-ratelimit-headers,
  08 and later): ``RateLimit-Policy: "calls";q=100;w=60`` and ``RateLimit: "calls";r=42;t=17``,
  a policy's quota unit (``qu``) other than ``"requests"`` counting cost units;
- the earlier drafts: ``RateLimit-Limit`` / ``-Remaining`` / ``-Reset`` (05, 06), and
  ``RateLimit: limit=100, remaining=42, reset=17`` (07);
- the common ``X-RateLimit-Limit`` / ``-Remaining`` / ``-Reset`` (a reset above 10^9 is an epoch
  time, as GitHub's; else seconds), and ``X-RateLimit-Reset-After``;
- per-token variants: ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` (reset as a
  duration, ``6m0s``, ``1.5s``, ``20ms``) and ``anthropic-ratelimit-{requests,tokens}-{limit,
  remaining,reset}`` (reset an RFC 3339 time); ``tokens`` are cost units.

Structured fields are parsed by ``http_sfv``. Unparsable values are ignored (a service's typo
never stops a job); a policy with several windows keeps the one with the fewest calls left.
"""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import http_sfv

__all__ = ["ServiceQuota", "quotas_of"]

CALLS, UNITS = "calls", "units"
_EPOCH = 1e9  # a reset above this is a point in time, not seconds from now
_NUMBER = r"(\d+(?:\.\d+)?)"
_DURATION = re.compile(rf"(?:{_NUMBER}h)?(?:{_NUMBER}m(?!s))?(?:{_NUMBER}s)?(?:{_NUMBER}ms)?$")  # 6m0s, 20ms


@dataclass(frozen=True)
class ServiceQuota:
    """One quota as a service stated it: ``remaining`` calls (or units) until ``reset`` seconds
    from now, out of ``limit`` per ``window`` seconds (each None when not said). ``exact``: the
    reset was a point in time or a fraction of a second (not whole seconds from now, which may
    be up to a second late)."""

    kind: str  # "calls" or "units"
    remaining: float | None = None
    reset: float | None = None
    limit: float | None = None
    window: float | None = None
    exact: bool = field(default=False, compare=False)

    @property
    def rate(self) -> float | None:
        """The quota as a rate (per second), when the service said its limit and window."""
        if self.limit is None or not self.window:
            return None
        return self.limit / self.window


def quotas_of(headers: Mapping[str, str], now: float | None = None) -> dict[str, ServiceQuota]:
    """The quotas an answer's headers state, by kind ("calls", "units"): at most one each."""
    lower = {str(k).lower(): str(v) for k, v in headers.items()}
    found: dict[str, ServiceQuota] = {}
    for quota in (*_ietf(lower), *_drafts(lower, now), *_x_ratelimit(lower, now), *_per_token(lower, now)):
        if quota.remaining is None and quota.rate is None:
            continue  # nothing a budget can follow
        held = found.get(quota.kind)
        if held is None or _tighter(quota, held):
            found[quota.kind] = quota
    return found


def _tighter(a: ServiceQuota, b: ServiceQuota) -> bool:
    if a.remaining is None:
        return False
    return b.remaining is None or a.remaining < b.remaining


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number >= 0 and number == number else None


def _exact(value: str | None) -> bool:
    """Whether a reset is a point in time (an epoch second, an RFC 3339 time) or has a fraction
    of a second (``1.5``, ``20ms``): then it is as exact as the service's clock."""
    if not value:
        return False
    text = value.strip()
    number = _number(text)
    if number is None:
        return "ms" in text or "." in text or "T" in text
    return number > _EPOCH or number != int(number)


def _reset(value: str | None, now: float | None) -> float | None:
    """Seconds until a reset given as seconds, an epoch time or a duration (``6m0s``)."""
    if value is None:
        return None
    number = _number(value.strip())
    if number is None:
        return _duration(value) if value.strip() else None
    if number > _EPOCH:
        return max(0.0, number - (time.time() if now is None else now))
    return number


def _duration(text: str) -> float | None:
    match = _DURATION.match(text.strip())
    if not match or not any(match.groups()):
        return None
    hours, minutes, seconds, millis = (float(g) if g else 0.0 for g in match.groups())
    return hours * 3600 + minutes * 60 + seconds + millis / 1000


def _ietf(headers: Mapping[str, str]) -> list[ServiceQuota]:
    """``RateLimit-Policy`` with ``RateLimit`` (08 and later): items matched by name."""
    policies = _sf_list(headers.get("ratelimit-policy"))
    state = _sf_list(headers.get("ratelimit"))
    if not state or not all(params.get("r") is not None for _, params in state):
        return []
    declared = {name: params for name, params in policies}
    out = []
    for name, params in state:
        policy = declared.get(name, {})
        unit = str(policy.get("qu", "requests"))
        out.append(
            ServiceQuota(
                CALLS if unit == "requests" else UNITS,
                remaining=_number(params.get("r")),
                reset=_number(params.get("t")),
                limit=_number(policy.get("q")),
                window=_number(policy.get("w")),
            )
        )
    return out


def _sf_list(text: str | None) -> list[tuple[str, dict[str, Any]]]:
    if not text:
        return []
    parsed = http_sfv.List()
    try:
        parsed.parse(text.encode())
    except ValueError:
        return []
    return [(str(item.value), dict(item.params)) for item in parsed]


def _drafts(headers: Mapping[str, str], now: float | None) -> list[ServiceQuota]:
    """``RateLimit-Limit`` / ``-Remaining`` / ``-Reset`` (05, 06) and the 07 dictionary."""
    out = []
    if "ratelimit-remaining" in headers:
        limit_text = headers.get("ratelimit-limit", "").split(",")[0]
        stated = headers.get("ratelimit-limit", "") + headers.get("ratelimit-policy", "")
        window = re.search(r";\s*w=(\d+)", stated)
        out.append(
            ServiceQuota(
                CALLS,
                remaining=_number(headers["ratelimit-remaining"]),
                reset=_reset(headers.get("ratelimit-reset"), now),
                limit=_number(limit_text.split(";")[0]),
                window=float(window.group(1)) if window else None,
                exact=_exact(headers.get("ratelimit-reset")),
            )
        )
    fields = _sf_dictionary(headers.get("ratelimit"))
    if "remaining" in fields:
        out.append(
            ServiceQuota(
                CALLS,
                remaining=_number(fields["remaining"]),
                reset=_number(fields.get("reset")),
                limit=_number(fields.get("limit")),
            )
        )
    return out


def _sf_dictionary(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    parsed = http_sfv.Dictionary()
    try:
        parsed.parse(text.encode())
    except ValueError:
        return {}
    return {str(name): getattr(member, "value", None) for name, member in parsed.items()}


def _x_ratelimit(headers: Mapping[str, str], now: float | None) -> list[ServiceQuota]:
    if "x-ratelimit-remaining" not in headers:
        return []
    reset = headers.get("x-ratelimit-reset-after") or headers.get("x-ratelimit-reset")
    return [
        ServiceQuota(
            CALLS,
            remaining=_number(headers["x-ratelimit-remaining"]),
            reset=_reset(reset, now),
            limit=_number(headers.get("x-ratelimit-limit")),
            exact=_exact(reset),
        )
    ]


def _per_token(headers: Mapping[str, str], now: float | None) -> list[ServiceQuota]:
    out = []
    for word, kind in (("requests", CALLS), ("tokens", UNITS)):
        # (the header of what is left, of its reset, of its limit; how the reset is written)
        forms = (
            (
                f"x-ratelimit-remaining-{word}",
                f"x-ratelimit-reset-{word}",
                f"x-ratelimit-limit-{word}",
                _reset,
            ),
            (
                f"anthropic-ratelimit-{word}-remaining",
                f"anthropic-ratelimit-{word}-reset",
                f"anthropic-ratelimit-{word}-limit",
                _rfc3339,
            ),
        )
        for remaining_header, reset_header, limit_header, reset_of in forms:
            remaining = headers.get(remaining_header)
            if remaining is not None:
                said_reset = headers.get(reset_header)
                out.append(
                    ServiceQuota(
                        kind,
                        remaining=_number(remaining),
                        reset=reset_of(said_reset, now),
                        limit=_number(headers.get(limit_header)),
                        exact=reset_of is _rfc3339 or _exact(said_reset),
                    )
                )
    return out


def _rfc3339(text: str | None, now: float | None) -> float | None:
    if not text:
        return None
    try:
        when = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))

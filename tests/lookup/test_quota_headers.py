"""What a service says of its quota, read from every common form of rate-limit header; a
header a service got wrong never stops a job."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lookup.quota_headers import ServiceQuota, quotas_of

NOW = 1_795_679_990.0


@pytest.mark.parametrize(
    ("headers", "calls", "units"),
    [
        (  # IETF, draft 08 and later: policies and their state, matched by name
            {
                "RateLimit-Policy": '"calls";q=100;w=10, "tok";q=5000;w=60;qu="tokens"',
                "RateLimit": '"calls";r=42;t=3, "tok";r=100;t=30',
            },
            ServiceQuota("calls", 42, 3, 100, 10),
            ServiceQuota("units", 100, 30, 5000, 60),
        ),
        (  # drafts 05 and 06
            {"RateLimit-Limit": "100, 100;w=60", "RateLimit-Remaining": "7", "RateLimit-Reset": "12"},
            ServiceQuota("calls", 7, 12, 100, 60),
            None,
        ),
        (  # draft 07
            {"RateLimit": "limit=100, remaining=50, reset=5"},
            ServiceQuota("calls", 50, 5, 100, None),
            None,
        ),
        (  # GitHub's: the reset an epoch time
            {
                "X-RateLimit-Limit": "60",
                "X-RateLimit-Remaining": "0",
                "X-RateLimit-Reset": str(int(NOW) + 10),
            },
            ServiceQuota("calls", 0, 10, 60, None),
            None,
        ),
        (  # per token, resets as durations
            {
                "x-ratelimit-limit-requests": "500",
                "x-ratelimit-remaining-requests": "499",
                "x-ratelimit-reset-requests": "120ms",
                "x-ratelimit-remaining-tokens": "9000",
                "x-ratelimit-reset-tokens": "6m0s",
            },
            ServiceQuota("calls", 499, 0.12, 500, None),
            ServiceQuota("units", 9000, 360, None, None),
        ),
        (  # per token, resets as RFC 3339 times
            {
                "anthropic-ratelimit-tokens-remaining": "30",
                "anthropic-ratelimit-tokens-reset": "2026-11-26T08:00:00Z",
            },
            None,
            ServiceQuota("units", 30, 10, None, None),
        ),
        ({"RateLimit": "garbage;;;", "X-RateLimit-Remaining": "many"}, None, None),
    ],
)
def test_each_form_of_the_headers_is_read(
    headers: dict[str, str], calls: ServiceQuota | None, units: ServiceQuota | None
) -> None:
    found = quotas_of(headers, now=NOW)
    assert found.get("calls") == calls and found.get("units") == units


def test_of_several_windows_the_one_with_the_fewest_calls_left_is_followed() -> None:
    headers = {
        "RateLimit-Policy": '"second";q=10;w=1, "day";q=1000;w=86400',
        "RateLimit": '"second";r=9;t=1, "day";r=3;t=4000',
    }
    assert quotas_of(headers)["calls"] == ServiceQuota("calls", 3, 4000, 1000, 86400)
    assert ServiceQuota("calls", 3, 4000, 1000, 86400).rate == pytest.approx(1000 / 86400)


@given(st.dictionaries(st.sampled_from(["RateLimit", "RateLimit-Policy", "X-RateLimit-Remaining",
                                        "X-RateLimit-Reset", "x-ratelimit-reset-tokens",
                                        "x-ratelimit-remaining-tokens", "RateLimit-Remaining"]),
                       st.text(max_size=40)))  # fmt: skip
def test_any_header_value_is_read_or_ignored_never_raises(headers: dict[str, str]) -> None:
    for quota in quotas_of(headers).values():
        assert quota.remaining is None or quota.remaining >= 0
        assert quota.reset is None or quota.reset >= 0


@pytest.mark.parametrize(
    ("headers", "exact"),
    [
        ({"X-RateLimit-Remaining": "3", "X-RateLimit-Reset": str(int(NOW) + 2)}, True),  # a time
        ({"X-RateLimit-Remaining": "3", "X-RateLimit-Reset": "2"}, False),  # whole seconds
        ({"X-RateLimit-Remaining": "3", "X-RateLimit-Reset-After": "1.250"}, True),
        ({"x-ratelimit-remaining-requests": "3", "x-ratelimit-reset-requests": "20ms"}, True),
        (
            {
                "anthropic-ratelimit-requests-remaining": "3",
                "anthropic-ratelimit-requests-reset": "2026-11-26T08:00:00Z",
            },
            True,
        ),
        ({"RateLimit-Remaining": "3", "RateLimit-Reset": "1"}, False),
    ],
)
def test_a_reset_is_exact_when_it_is_a_time_or_has_a_fraction(headers: dict[str, str], exact: bool) -> None:
    """A reset in whole seconds from now may be up to a second late; the budget waits for an
    exact one in any window, and follows a short window's whole-second one by its rate."""
    assert quotas_of(headers, now=NOW)["calls"].exact is exact

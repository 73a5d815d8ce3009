"""The waits of :class:`~lookup.SharedCache`'s single flight, without I/O: told what each look
at Redis found (a key's cached answer, its claim's token and time to live), they say per key
whether to wait on, follow another worker's claim, take a dead or overdue claim over, or ask the
service; :meth:`lookup.shared_cache.SharedCacheClient.wait_many` does the looking and sleeping.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["Verdict", "Waits", "decoded", "verdict"]

Verdict = Literal["ask", "take", "follow", "wait"]


# a claim seen gone this close before its expiry (as estimated from its PTTL) is taken as expired
_EXPIRY_SLACK = 0.01


@dataclass
class _Wait:
    """One key's wait: the claim waited on (its token), the time by which it has surely
    expired if it is gone, and the time this wait ends; ``following`` once it is a claim
    another worker made since or took over (its token None until seen), never taken over."""

    token: bytes | None
    expires: float
    deadline: float
    following: bool = False


def verdict(wait: _Wait, claim: bytes | None, now: float) -> Verdict:
    """What one look at a key's claim (its answer not in the cache yet) means for its waiter:
    ``ask`` the service itself (the claim was given up before it could have expired, or the
    wait for a claim followed ended); ``take`` the claim over (it expired: its holder died;
    or it outlived the bound); ``follow`` a claim another worker made since (wait for it,
    bounded again); ``wait`` on."""
    if wait.following:
        if now >= wait.deadline or (claim is None and wait.token is not None):
            return "ask"
        return "wait"
    if claim is None:
        return "take" if now >= wait.expires - _EXPIRY_SLACK else "ask"
    if claim != wait.token:
        return "follow"
    return "take" if now >= wait.deadline else "wait"


class Waits:
    """The waits of one :meth:`SharedCacheClient.wait_many`, without I/O: it is told what each
    look at Redis found and says which claims to try to take over.

    Rule: a key's wait ends with its answer found, or in asking the service when its claim is
    given up before it could have expired. Once every claim still waited on is takeable (gone
    after its expiry, or still there past ``bound``), this waiter tries, once, to take them
    over: first the leader (the least claim name among them and those whose claim another
    worker replaced meanwhile; when it is one of the latter, none: all are followed), then,
    only if the leader was won, the rest at once. A claim won is this waiter's to ask; one
    lost (or a claim another worker made meanwhile) is followed: waited for up to ``bound``
    more, never taken over again.

    Invariant: a key is asked by at most one of the waiters that saw the same claim while the
    one that took it over lives and answers within ``bound``: a compare-and-set admits one of
    them, and two waiters of the same keys never split them (only the leader's winner takes
    the rest). No key is waited for past ``start + 2 * bound``: a claim is followed at the
    latest at the first bound, and a followed one for one bound more.
    """

    def __init__(
        self,
        bound: float,
        now: float,
        names: Sequence[str],
        first: Sequence[tuple[bytes | None, bytes | None, int]],
    ) -> None:
        """``first``: per key, at the look made at ``now`` (taken before it was sent), the
        cache's text, the claim's token and its ``PTTL`` (-1: no expiry; -2: gone)."""
        self.bound = bound
        self.end = now + 2 * bound
        self.names = names
        self.out: list[tuple[bool, Any]] = [(False, None)] * len(names)
        self.taken: set[int] = set()  # the keys whose claims this waiter took over (it asks)
        self.waits: dict[int, _Wait] = {}
        self._round: list[int] = []  # the takeover's claims, leader first
        self._stage = 0  # 0: none yet; 1: its leader tried; 2: the rest tried; 3: over
        self._moved: set[int] = set()  # keys whose claim another worker made since
        for i, (text, token, pttl) in enumerate(first):
            found = decoded(text)
            if found[0]:
                self.out[i] = found
            elif token is not None:  # (a claim gone already: as if given up, asked)
                expires = math.inf if pttl == -1 else now + max(pttl, 0) / 1000
                self.waits[i] = _Wait(token, expires, now + bound)

    @property
    def open(self) -> list[int]:
        return sorted(self.waits)

    def due(self, now: float) -> float:
        """The next time a wait passes a bound (or the end)."""
        return min([w.deadline for w in self.waits.values() if w.deadline > now] + [self.end])

    def looked(
        self, open_: Sequence[int], texts: Sequence[Any], claims: Sequence[Any], now: float
    ) -> list[int]:
        """A look's findings (answers and claims of ``open_``, received at ``now``); returns
        the claim to try to take over now (the leader), if any."""
        takes: list[int] = []
        blocked = False
        for i, text, claim in zip(open_, texts, claims, strict=True):
            wait = self.waits.get(i)
            if wait is None:
                continue
            found = decoded(text)
            if found[0]:
                self.out[i] = found
                del self.waits[i]
                continue
            said = verdict(wait, claim, now) if now < self.end else "ask"
            if said == "ask":
                del self.waits[i]
            elif said == "follow":
                self._moved.add(i)
                self._follow(i, now, claim)
            elif said == "take":
                takes.append(i)
            elif not wait.following:
                blocked = True  # a live claim: take over none yet (all of them at once, later)
            elif wait.token is None:
                wait.token = claim  # the claim followed, seen: its going is news now
        if not takes or blocked or self._stage:
            return []
        self._round = sorted(takes, key=lambda i: self.names[i])
        if min([*takes, *self._moved], key=lambda i: self.names[i]) in self._moved:
            # the leader was taken over by another waiter: the rest is its to take, followed
            for i in self._round:
                self._follow(i, now)
            self._stage = 3
            return []
        self._stage = 1
        return self._round[:1]

    def took(self, tried: Sequence[int], won: Sequence[bool], now: float) -> list[int]:
        """The takeover of ``tried`` done (``won`` per key, at ``now``); returns the claims to
        try next: the rest, once the leader was won (then none: one takeover a wait)."""
        for i, got in zip(tried, won, strict=True):
            if got:
                del self.waits[i]  # this waiter's to ask
                self.taken.add(i)
            else:
                self._follow(i, now)
        rest = self._round[1:] if self._stage == 1 else []
        self._stage = 2 if self._stage == 1 and won[0] and rest else 3
        if self._stage == 2:
            return rest
        for i in rest:  # the leader lost: the rest is the winner's, followed
            self._follow(i, now)
        return []

    def _follow(self, i: int, now: float, token: bytes | None = None) -> None:
        self.waits[i] = _Wait(token, math.inf, min(now + self.bound, self.end), following=True)


def decoded(text: bytes | None) -> tuple[bool, Any]:
    """A kept entry as ``(found, answer)``: None from Redis is not found; neither is text that
    is not ours (a key reused by hand: ask the service)."""
    if text is None:
        return (False, None)
    try:
        return (True, json.loads(text))
    except ValueError:
        return (False, None)

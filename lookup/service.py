"""The one narrow interface a :class:`~lookup.Lookup` asks its service through.

A service answers keys: ``await fetch(key)`` is the decoded answer for one key (a dict, or any
value ``fields=`` maps), or None for a miss; it raises a
:class:`~lookup.LookupServiceError` (or lets a connection error through: the lookup turns it
into :class:`~lookup.ServiceUnavailableError`, retryable). Optional: ``fetch_many(keys)`` (one
call for many keys: an answer, None or an exception per key, in order; the lookup then batches
records), ``aclose()`` (its clients), ``describe(key)`` (what a call asks, for errors; secrets
left out) and ``name`` (the service's name in errors and limits).

A service is pickled with its lookup to every executor, so it holds a description (a URL, a
table, options), never a live client: it makes its clients lazily, inside the event loop that
calls it (see ``docs/guide/backends.md``).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, Protocol

__all__ = ["Service"]


class Service(Protocol):
    """Answers one key (see the module doc for the optional members)."""

    async def fetch(self, key: Hashable) -> Any: ...

"""Lookups a SQL user may declare in the query itself, and the services they may call (no pyspark).

Anything a SQL user can make the workers do is opted into by the Python code that installs the
functions: declared ``'http'`` and ``'redis'`` sources are off unless ``sql_ext.install`` is
given a :class:`DeclaredSources` allow-list, and nothing in SQL (a ``SET`` included) can widen
it: the list travels inside the registered function, not in the session's settings. SQL reads
the declaration (``sql_ext.declared``); :meth:`DeclaredSources.declare` checks its URL against
the list and makes the lookup, which shows no part of a service's answer in its errors.

An HTTP URL is allowed when its scheme, host and port equal an allowed prefix's and its path
starts with the prefix's path at a segment boundary; record fields may only fill the path and
the query after that (never the scheme, host or port). A Redis URL is allowed when its scheme,
host and port equal an allowed one's, and its database too when the allowed URL names one.
URLs with credentials, dot segments or other schemes are refused whatever the list says.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from keyed_async_wait.core.exceptions import ConfigError

from .fields import Field
from .http_lookup import HttpLookup
from .redis_lookup import RedisLookup

__all__ = ["DeclaredSources"]

_DEFAULT_PORTS = {"http": 80, "https": 443, "redis": 6379, "rediss": 6379}
_DOT_SEGMENT = re.compile(r"^(\.|%2e){1,2}$", re.IGNORECASE)
_ENABLE = (
    "declared sources are off: the Python code that calls sql_ext.install() enables them with "
    "declared_sources=DeclaredSources(http=[URL prefixes], redis=[Redis URLs]) (from lookup)"
)


def _origin(url: str, schemes: tuple[str, ...], name: str) -> tuple[str, str, int, str]:
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in schemes:
        raise ConfigError(name, url, f"a URL with scheme {' or '.join(schemes)}")
    if "@" in parts.netloc:
        raise ConfigError(
            name,
            "(a URL with credentials)",
            "a URL without user:password@ (SQL text ends up in plans and logs)",
        )
    if "{" in parts.netloc or "}" in parts.netloc:
        raise ConfigError(
            name, url, "a URL whose host and port are fixed (record fields only in the path and query)"
        )
    try:
        port = parts.port or _DEFAULT_PORTS[scheme]
    except ValueError as exc:
        raise ConfigError(name, url, f"a URL with a valid port ({exc})") from None
    host = (parts.hostname or "").lower()
    if not host:
        raise ConfigError(name, url, "a URL with a host")
    return scheme, host, port, parts.path


def _segments(path: str) -> list[str]:
    """The path's segments ('/a/b/' -> ['a', 'b', ''])."""
    return path.split("/")[1:] if path.startswith("/") else [path] if path else []


@dataclass(frozen=True)
class DeclaredSources:
    """The allow-list of services a SQL user may declare: ``http`` URL prefixes
    (``"https://api.internal/v1/users/"``) and ``redis`` URLs (``"redis://cache:6379"`` for any
    database, ``"redis://cache:6379/2"`` for one)."""

    http: Sequence[str] = ()
    redis: Sequence[str] = ()

    def __post_init__(self) -> None:
        for value, name in ((self.http, "http"), (self.redis, "redis")):
            if isinstance(value, str):
                raise ConfigError(f"DeclaredSources({name}=)", value, "a list of URLs, not one string")
        object.__setattr__(self, "http", tuple(self.http))
        object.__setattr__(self, "redis", tuple(self.redis))
        for prefix in self.http:
            _origin(prefix, ("http", "https"), "DeclaredSources(http=)")
            if "{" in prefix or "?" in prefix:
                raise ConfigError(
                    "DeclaredSources(http=)", prefix, "a URL prefix without templates or a query"
                )
        for url in self.redis:
            _origin(url, ("redis", "rediss"), "DeclaredSources(redis=)")

    def check_http(self, name: str, url: str) -> None:
        """ConfigError naming ``name`` unless ``url`` (a template) is allowed."""
        if not self.http:
            raise ConfigError(name, url, _ENABLE + "; no HTTP prefix is allowed")
        scheme, host, port, path = _origin(url, ("http", "https"), name)
        have = _segments(path)
        if any(_DOT_SEGMENT.match(s) for s in have) or "" in have[:-1]:
            raise ConfigError(name, url, "a URL path without '.', '..' or empty segments")
        for prefix in self.http:
            p_scheme, p_host, p_port, p_path = _origin(prefix, ("http", "https"), "DeclaredSources(http=)")
            wanted = _segments(p_path.rstrip("/"))
            # whole segments compared: a prefix '/users' never allows '/usersx'
            if (scheme, host, port) == (p_scheme, p_host, p_port) and have[: len(wanted)] == wanted:
                return
        raise ConfigError(name, url, "a URL under one of the allowed prefixes: " + ", ".join(self.http))

    def check_redis(self, name: str, url: str) -> None:
        if not self.redis:
            raise ConfigError(name, url, _ENABLE + "; no Redis URL is allowed")
        scheme, host, port, path = _origin(url, ("redis", "rediss"), name)
        db = path.strip("/")
        for allowed in self.redis:
            a_scheme, a_host, a_port, a_path = _origin(
                allowed, ("redis", "rediss"), "DeclaredSources(redis=)"
            )
            a_db = a_path.strip("/")
            if (scheme, host, port) == (a_scheme, a_host, a_port) and (not a_db or a_db == (db or "0")):
                return
        raise ConfigError(name, url, "one of the allowed Redis URLs: " + ", ".join(self.redis))

    def declare(
        self, kind: str, options: Mapping[str, Any], fields: list[tuple[str, str, str | None, bool]]
    ) -> Any:
        """The lookup a SQL call declares: ``kind`` ``'http'`` (``url``, optionally ``batch_url``
        and ``key``) or ``'redis'`` (``url``, ``key``); ``fields`` as ``(name, type, path,
        optional)``. A ConfigError names the option when a URL is not under this list."""
        for option in ("url", "batch_url"):
            if option in options:
                check = self.check_http if kind == "http" else self.check_redis
                check(option, str(options[option]))
        declared = [Field(name, type_, path, optional=optional) for name, type_, path, optional in fields]
        try:
            if kind == "http":
                return HttpLookup(
                    options["url"],
                    batch_url=options.get("batch_url"),
                    key=options.get("key"),
                    fields=declared,
                    error_body_chars=0,  # a SQL user reads errors: no answers of services echoed
                )
            return RedisLookup(options["url"], options["key"], fields=declared, error_body_chars=0)
        except (ValueError, KeyError) as exc:
            raise ConfigError(f"'{kind}' source", dict(options), str(exc)) from exc

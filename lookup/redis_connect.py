"""Where a Redis is and how to reach it: one description, :class:`RedisConnection`, for every
Redis part (:class:`~lookup.RedisLookup`, :class:`~lookup.RedisWrite`, the job-wide budget of
:class:`~lookup.SharedRate`, the step journal :class:`~lookup.StepJournal`), on every topology:

- one node: ``redis://[user:password@]host:port[/db]``, ``rediss://`` (TLS), ``unix:///path``;
- a Redis Cluster: the URL of any node, as it is; whether it is a cluster is asked of the node
  the first time a process uses it (``cluster=True`` or ``False`` says it instead). Calls follow
  MOVED and ASK; batches are split by slot, each master's share sent at once
  (:mod:`lookup.redis_nodes`);
- Sentinel: ``redis-sentinel://[user:password@]host:port[,host:port...][/db]#service``
  (``rediss-sentinel://`` for TLS): the master of ``service`` is asked of the sentinels, and
  asked again when it fails over.

Each part takes a URL with its options, or a :class:`RedisConnection` made once and shared. The
options are checked when the part is made (a wrong scheme, an unknown URL option, a Sentinel URL
without its service: an error naming it and what is allowed); the clients are made in the
process and event loop that use them, never pickled: TLS always verified (``ca_file`` adds a CA
bundle; ``client_cert`` and ``client_key`` for mutual TLS); the password from an environment
variable or the URL; an ACL user in the URL. The password never shows in a repr or an error.
"""

from __future__ import annotations

import asyncio
import os
import urllib.parse
from dataclasses import dataclass, field, fields
from typing import Any

from .exceptions import LookupOptionError
from .secrets import redact_url

__all__ = ["RedisClient", "RedisConnection"]

SCHEMES = ("redis", "rediss", "unix", "redis-sentinel", "rediss-sentinel")
URL_OPTIONS = ("db",)  # what a URL's query may say; everything else is an option of the connection


def _sentinel_parts(url: str) -> tuple[list[tuple[str, int]], str, int | None]:
    """The sentinels' addresses, the service and the database of a Sentinel URL."""
    parts = urllib.parse.urlsplit(url)
    hosts = parts.netloc.rpartition("@")[2]
    service = urllib.parse.unquote(parts.fragment)
    if not service:
        raise LookupOptionError(
            "url", f"url={redact_url(url)!r}: a Sentinel URL names its service after '#' "
            "(redis-sentinel://host:26379[,host:port...][/db]#mymaster)",
        )  # fmt: skip
    addresses = []
    for host_port in hosts.split(","):
        host, _, port = host_port.rpartition(":")
        if not host or not port.isdigit():
            allowed = "host:port pairs, comma-separated (redis-sentinel://h1:26379,h2:26379/0#mymaster)"
            raise LookupOptionError(
                "url", f"url={redact_url(url)!r}: sentinel {host_port!r}; allowed: {allowed}"
            )
        addresses.append((host.strip("[]"), int(port)))
    db = parts.path.strip("/")
    if db and not db.isdigit():
        raise LookupOptionError("url", f"the Sentinel URL's database {db!r} is not a number")
    return addresses, service, int(db) if db else None


@dataclass(frozen=True)
class RedisConnection:
    """How to reach one Redis (see the module for the URLs).

    Parameters
    ----------
    url : str
        ``redis://``, ``rediss://``, ``unix://``, ``redis-sentinel://`` or ``rediss-sentinel://``.
    db : int, optional
        The database, when the URL names none (a cluster has only 0).
    password_env : str, optional
        An environment variable holding the password (read where the client is made).
    ca_file : str, optional
        A CA bundle to trust besides the system's (TLS only).
    client_cert, client_key : str, optional
        A client certificate and its key, for a server that asks for one (TLS only).
    max_connections : int
        Connections per process (per node of a cluster) at most; more calls wait for one.
    socket_timeout : float
        Seconds to connect and to wait for an answer.
    cluster : bool, optional
        Whether the URL's node belongs to a Redis Cluster; None: asked of the node.
    read_from_replicas : bool
        Lookups may read from a cluster's replicas: more reads, at the price of answers a replica
        has not caught up with yet. Writes always go to masters. (Sentinel: reads go to the
        master.)
    """

    url: str = field(repr=False)
    db: int | None = None
    password_env: str | None = None
    ca_file: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    max_connections: int = 100
    socket_timeout: float = 5.0
    cluster: bool | None = None
    read_from_replicas: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.url, str):
            raise LookupOptionError("url", f"url={type(self.url).__name__}; allowed: a redis:// URL")
        parts = urllib.parse.urlsplit(self.url)
        scheme = parts.scheme.lower()
        if scheme not in SCHEMES:
            allowed = ", ".join(f"{s}://" for s in SCHEMES)
            raise LookupOptionError("url", f"url={redact_url(self.url)!r}; allowed: a URL of {allowed}")
        unknown = sorted(set(urllib.parse.parse_qs(parts.query)) - set(URL_OPTIONS))
        if unknown:
            raise LookupOptionError(
                unknown[0],
                f"URL option {unknown[0]!r}; allowed in the URL: {', '.join(URL_OPTIONS)} (TLS files, "
                "timeouts and pools are options of the lookup, the write or RedisConnection)",
            )
        for name in ("ca_file", "client_cert", "client_key"):
            if getattr(self, name) is not None and not self.tls:
                raise LookupOptionError(
                    name, f"{name}= is for TLS: give a rediss:// URL (or a rediss-sentinel:// one)"
                )
        if (self.client_cert is None) != (self.client_key is None):
            raise LookupOptionError("client_cert", "client_cert= and client_key= go together (mutual TLS)")
        self._check_numbers()
        self._check_topology(scheme)

    def _check_numbers(self) -> None:
        count = self.max_connections
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise LookupOptionError("max_connections", f"max_connections={count!r}; allowed: an integer >= 1")
        if not isinstance(self.socket_timeout, (int, float)) or not self.socket_timeout > 0:
            raise LookupOptionError("socket_timeout", f"socket_timeout={self.socket_timeout!r}; allowed: > 0")
        if self.cluster not in (None, True, False):
            raise LookupOptionError(
                "cluster", f"cluster={self.cluster!r}; allowed: None (asked), True, False"
            )

    def _check_topology(self, scheme: str) -> None:
        url_db = _sentinel_parts(self.url)[2] if self.sentinel else _url_db(self.url)
        if self.db is not None and url_db is not None and self.db != url_db:
            raise LookupOptionError(
                "db",
                f"db={self.db} conflicts with the database {url_db} the URL names; give the database "
                "once, in the URL (redis://host:port/N) or as db=",
            )
        if self.cluster and (self.sentinel or scheme == "unix"):
            raise LookupOptionError(
                "cluster", f"cluster=True with a {scheme}:// URL; allowed: a redis:// or rediss:// URL"
            )
        if self.read_from_replicas and (self.cluster is False or self.sentinel or scheme == "unix"):
            raise LookupOptionError(
                "read_from_replicas",
                "read_from_replicas=True is for a Redis Cluster; allowed: a redis:// or rediss:// URL "
                "of a cluster's node, without cluster=False",
            )
        if self.cluster and (self.db or url_db):
            raise LookupOptionError("db", "a Redis Cluster has one database, 0")

    @classmethod
    def of(cls, target: str | RedisConnection, **options: Any) -> RedisConnection:
        """``target`` as a connection: a URL with ``options``, or a connection made already
        (then the options are its own: giving them again is an error naming the first)."""
        if isinstance(target, RedisConnection):
            defaults = {f.name: f.default for f in fields(cls)}
            given = sorted(name for name, value in options.items() if value != defaults.get(name))
            if given:
                raise LookupOptionError(
                    given[0], f"{given[0]}= with a RedisConnection: give it to the RedisConnection instead"
                )
            return target
        return cls(target, **options)

    def __repr__(self) -> str:
        return f"RedisConnection({redact_url(self.url)!r})"

    @property
    def shown(self) -> str:
        """The URL as it may be shown (a password replaced by ``***``)."""
        return redact_url(self.url)

    @property
    def sentinel(self) -> bool:
        return self.url.lower().startswith(("redis-sentinel://", "rediss-sentinel://"))

    @property
    def tls(self) -> bool:
        return self.url.lower().startswith(("rediss://", "rediss-sentinel://"))

    def connect(self) -> RedisClient:
        """This connection's client in the running event loop (made on its first use there)."""
        return RedisClient(self)

    # ------------------------------------------------------------------ clients

    def client_options(self, pool: bool = True) -> dict[str, Any]:
        password = os.environ.get(self.password_env) if self.password_env else None
        options: dict[str, Any] = {
            "socket_timeout": self.socket_timeout,
            "socket_connect_timeout": self.socket_timeout,
            "decode_responses": False,
        }
        if pool:
            options["max_connections"] = self.max_connections
        if self.db is not None:
            options["db"] = self.db
        if self.ca_file is not None:
            options["ssl_ca_certs"] = self.ca_file
        if self.client_cert is not None:
            options["ssl_certfile"], options["ssl_keyfile"] = self.client_cert, self.client_key
        if password is not None:
            options["password"] = password
        return options

    def sentinel_kwargs(self) -> tuple[list[tuple[str, int]], str, dict[str, Any], dict[str, Any]]:
        addresses, service, db = _sentinel_parts(self.url)
        parts = urllib.parse.urlsplit(self.url)
        data = self.client_options(pool=False)
        if db is not None:
            data.setdefault("db", db)
        if parts.username:
            data["username"] = urllib.parse.unquote(parts.username)
        if parts.password and "password" not in data:
            data["password"] = urllib.parse.unquote(parts.password)
        watchers = {"socket_timeout": self.socket_timeout, "socket_connect_timeout": self.socket_timeout}
        if self.tls:
            data["ssl"] = watchers["ssl"] = True
            for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
                if name in data:
                    watchers[name] = data[name]
        return addresses, service, data, watchers

    async def open(self) -> tuple[Any, bool]:
        """A client of the running loop, and whether it is a cluster's (asked of the node when
        ``cluster`` is None)."""
        from .redis_clients import open_client

        return await open_client(self)

    def sync_client(self) -> Any:
        """A blocking client (the driver's and the intake's few calls), on the same topology."""
        from .redis_clients import sync_client

        return sync_client(self)


class RedisClient:
    """A connection's client in one event loop: made at the first :meth:`get`, its topology
    found out then (:attr:`cluster`). Never pickled (its owner drops it).

    Calls on a cluster go through :meth:`held`: redis-py's cluster client fails a call past
    ``max_connections`` per node (MaxConnectionsError) where the one-node pool waits, so at
    most ``max_connections`` calls (a pipeline is one) run at once and the others wait.
    """

    __slots__ = ("_client", "_gate", "_opening", "cluster", "connection")

    def __init__(self, connection: RedisConnection) -> None:
        self.connection = connection
        self.cluster = False
        self._client: Any = None
        self._gate: asyncio.Semaphore | None = None
        self._opening: asyncio.Future[Any] | None = None

    async def get(self) -> Any:
        """The client (the same for every caller of this loop)."""
        client = self._client
        if client is not None:
            return client
        if self._opening is not None:  # another call is opening it: wait for that one
            return await asyncio.shield(self._opening)
        self._opening = opening = asyncio.get_running_loop().create_future()
        try:
            client, self.cluster = await self.connection.open()
        except BaseException as exc:
            self._opening = None
            opening.set_exception(exc)
            opening.exception()  # retrieved: the waiters, if any, get it too
            raise
        if self.cluster:
            self._gate = asyncio.Semaphore(self.connection.max_connections)
        self._client = client
        opening.set_result(client)
        return client

    def held(self) -> _Held:
        """``async with handle.held() as client``: the client, with a call's place held."""
        return _Held(self)

    async def aclose(self) -> None:
        client, self._client, self._opening = self._client, None, None
        if client is not None:
            await client.aclose()


class _Held:
    __slots__ = ("_gate", "_handle")

    def __init__(self, handle: RedisClient) -> None:
        self._handle = handle
        self._gate: asyncio.Semaphore | None = None

    async def __aenter__(self) -> Any:
        client = await self._handle.get()
        gate = self._handle._gate
        if gate is not None:
            await gate.acquire()
            self._gate = gate
        return client

    async def __aexit__(self, *exc: object) -> None:
        if self._gate is not None:
            self._gate.release()


def _url_db(url: str) -> int | None:
    """The database a Redis URL names (its path or ``?db=``), None when it names none."""
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qs(parts.query).get("db")
    text = query[0] if query else parts.path.strip("/") if parts.scheme != "unix" else ""
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise LookupOptionError("url", f"the Redis URL's database {text!r} is not a number") from None

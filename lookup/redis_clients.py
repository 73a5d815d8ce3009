"""The redis-py clients of a :class:`~lookup.redis_connect.RedisConnection`, on its topology
(one node, Redis Cluster, Sentinel). A module of its own so that redis-py is imported only by
a process that talks to a Redis: a worker of an HTTP lookup never pays for it."""

from __future__ import annotations

import asyncio
import weakref
from typing import Any, Protocol

import redis
import redis.asyncio as aioredis

from .redis_errors import said
from .redis_packing import hiredis_packing


class RedisConnection(Protocol):
    """What a client is made from: :class:`lookup.RedisConnection` (named here, not imported,
    so that the connection module imports this one only where a client is made)."""

    @property
    def url(self) -> str: ...
    @property
    def cluster(self) -> bool | None: ...
    @property
    def max_connections(self) -> int: ...
    @property
    def read_from_replicas(self) -> bool: ...
    @property
    def sentinel(self) -> bool: ...
    @property
    def shown(self) -> str: ...
    def client_options(self, pool: bool = True) -> dict[str, Any]: ...
    def sentinel_kwargs(self) -> tuple[list[tuple[str, int]], str, dict[str, Any], dict[str, Any]]: ...


__all__ = ["BlockingCluster", "ClosingCluster", "open_client", "sync_client"]


def _standalone(connection: RedisConnection) -> aioredis.Redis:
    # a blocking pool: with more calls in flight than max_connections, a call waits for a
    # connection (the operator's timeout bounds it) instead of failing "Too many connections"
    pool = aioredis.BlockingConnectionPool.from_url(
        connection.url, timeout=None, **connection.client_options()
    )
    pool.connection_class = hiredis_packing(pool.connection_class)  # the class the URL asks for
    return aioredis.Redis.from_pool(pool)


def _cluster(connection: RedisConnection) -> Any:
    options = connection.client_options()
    options.pop("db", None)
    options.update(_replica_reads(connection.read_from_replicas))
    # the gate (RedisClient.held) bounds calls; connections being closed after a failover
    # still count against a node's limit a moment, hence the slack
    options["max_connections"] = 2 * connection.max_connections
    return ClosingCluster.from_url(connection.url, **options)


def _sentinel_client(connection: RedisConnection) -> aioredis.Redis:
    from redis.asyncio.sentinel import Sentinel

    addresses, service, data, watchers = connection.sentinel_kwargs()
    sentinel = Sentinel(addresses, sentinel_kwargs=watchers, **data)
    client = sentinel.master_for(service, redis_class=_WithSentinels)
    client.sentinels = list(sentinel.sentinels)
    return client


async def open_client(connection: RedisConnection) -> tuple[Any, bool]:
    """A client of the running loop, and whether it is a cluster's (asked of the node when
    ``cluster`` is None: :func:`_mode_is_cluster`)."""
    if connection.sentinel:
        return _sentinel_client(connection), False
    if connection.cluster:
        return await _initialized(_cluster(connection)), True
    client = _standalone(connection)
    if connection.cluster is False or connection.url.lower().startswith("unix://"):
        return client, False
    try:
        try:
            enabled = _mode_is_cluster(await client.execute_command("HELLO"))
        except redis.exceptions.ResponseError as refused:  # Redis < 6.2, or HELLO renamed away
            try:
                enabled = _info_is_cluster(await client.info("cluster"))
            except redis.exceptions.ResponseError:
                raise _no_discovery(refused, connection) from None
    except BaseException:
        await client.aclose()
        raise
    if not enabled:
        return client, False
    await client.aclose()
    return await _initialized(_cluster(connection)), True


def sync_client(connection: RedisConnection) -> Any:
    """A blocking client (the driver's and the intake's few calls), on the same topology."""
    if connection.sentinel:
        addresses, service, data, watchers = connection.sentinel_kwargs()
        return redis.sentinel.Sentinel(addresses, sentinel_kwargs=watchers, **data).master_for(service)
    options = connection.client_options()
    if connection.cluster is not False and not connection.url.lower().startswith("unix://"):
        if connection.cluster:
            options.pop("db", None)
            return BlockingCluster.from_url(connection.url, **options)
        client = redis.Redis.from_url(connection.url, **options)
        try:
            enabled = _mode_is_cluster(client.execute_command("HELLO"))
        except redis.exceptions.ResponseError as refused:
            try:
                enabled = _info_is_cluster(client.info("cluster"))
            except redis.exceptions.ResponseError:
                client.close()
                raise _no_discovery(refused, connection) from None
        if enabled:
            client.close()
            options.pop("db", None)
            return BlockingCluster.from_url(connection.url, **options)
        return client
    return redis.Redis.from_url(connection.url, **options)


class ClosingCluster(aioredis.RedisCluster):
    """redis-py's asyncio cluster client, whose :meth:`aclose` also closes the connections of
    nodes a topology refresh took out of its tables (a failover, a node marked failing).

    redis-py closes those in tasks of the loop (a busy connection when it is released), which
    a client closed right after, or a loop that ends first, leaves open until collected; and a
    command that held such a node across the refresh may open a new connection on it, which
    nothing closes: the node, dropped, was collected with it open (``ResourceWarning:
    Unclosed ClusterNode``). Invariants: every connection the client's nodes opened is closed
    when :meth:`aclose` returns (each is noted when made, weakly: a closed one is not held);
    a node taken out of the tables is held until none of its connections is open, so it is
    never collected with one open while the client lives."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._made: weakref.WeakSet[Any] = weakref.WeakSet()
        self._retired: list[Any] = []
        self._note_connections()
        self._hold_retired_nodes()

    def _note_connections(self) -> None:
        """Note each connection the client's nodes make (weakly), for :meth:`aclose`."""
        made = self._made
        # the class each node makes its connections with: nodes found later take it from the
        # manager's kwargs, the startup nodes already hold theirs
        shared = self.nodes_manager.connection_kwargs
        base = shared.get("connection_class") or aioredis.Connection

        class Noted(base):  # type: ignore[valid-type,misc]
            def __init__(self, *a: Any, **k: Any) -> None:
                super().__init__(*a, **k)
                made.add(self)

        Noted.__name__ = Noted.__qualname__ = base.__name__
        shared["connection_class"] = Noted
        for node in self.nodes_manager.startup_nodes.values():
            node.connection_class = Noted

    def _hold_retired_nodes(self) -> None:
        """Hold each node a refresh takes out of the tables (``set_nodes(..., remove_old=True)``,
        redis-py's one way out) while a connection of it is open."""
        manager, retired = self.nodes_manager, self._retired

        class Holding(type(manager)):  # type: ignore[misc]
            __slots__ = ()  # the same layout: the manager's class may be swapped for it

            def set_nodes(self, old: dict[str, Any], new: dict[str, Any], remove_old: bool = False) -> None:
                if remove_old:
                    retired[:] = [node for node in retired if _is_open(node)]
                    retired.extend(node for name, node in old.items() if name not in new)
                super().set_nodes(old, new, remove_old)

        Holding.__name__ = Holding.__qualname__ = type(manager).__name__
        manager.__class__ = Holding  # its attributes are slots: no method can be set on it

    async def aclose(self) -> None:
        try:
            await super().aclose()
        finally:
            left = [c for c in self._made if c.is_connected]
            await asyncio.gather(*(c.disconnect() for c in left), return_exceptions=True)
            self._retired.clear()


def _is_open(node: Any) -> bool:
    """Whether a cluster node has a connection open."""
    return any(connection.is_connected for connection in node._connections)


class BlockingCluster(redis.RedisCluster):
    """redis-py's blocking cluster client, whose :meth:`close` also closes the connections its
    nodes opened: redis-py's closes each node's client but not the node's connection pool (it
    was handed one), so their sockets stayed open until collected."""

    def close(self) -> None:
        try:
            super().close()
        finally:
            manager = getattr(self, "nodes_manager", None)  # None: __init__ failed before it
            held = [] if manager is None else [manager.nodes_cache, manager.startup_nodes]
            for node in [node for nodes in held for node in nodes.values()]:
                if node.redis_connection is not None:
                    node.redis_connection.connection_pool.disconnect()


class _WithSentinels(aioredis.Redis):
    """A Sentinel service's master client that closes the sentinels' clients with its own
    (redis-py leaves them open)."""

    sentinels: list[Any] = []

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        try:
            await super().aclose(close_connection_pool)
        finally:
            for watcher in self.sentinels:
                await watcher.aclose()


def _mode_is_cluster(reply: Any) -> bool:
    """Whether a ``HELLO`` reply (a flat list in RESP2, a map in RESP3) says ``mode: cluster``
    (asked without a protocol version, so the connection's own protocol is kept).
    Redis lets every user that may log in run HELLO (as AUTH: no ACL rule refuses it), so a
    least-privilege user (``+get +mget +@connection``) learns the topology without ``INFO``;
    only a Redis before 6 (no HELLO) or one with HELLO renamed away is asked ``INFO``."""
    fields = reply if isinstance(reply, dict) else dict(zip(reply[::2], reply[1::2], strict=True))
    mode = fields.get(b"mode", fields.get("mode"))
    return mode in (b"cluster", "cluster")


def _info_is_cluster(info: Any) -> bool:
    return bool(int(info.get("cluster_enabled", 0)))


def _no_discovery(refused: BaseException, connection: RedisConnection) -> BaseException:
    return redis.exceptions.NoPermissionError(
        f"the Redis user may run neither HELLO nor INFO, so whether {connection.shown} is a "
        f"Redis Cluster cannot be asked ({said(refused)}); allow +info (or HELLO, Redis 6 and later), "
        "or say it with cluster=True or cluster=False"
    )


async def _initialized(client: Any) -> Any:
    """A cluster client that has read the slots: redis-py lets the first calls made together
    race its lazy start (a connection of one used by another), so it starts before any call."""
    try:
        await client.initialize()
    except BaseException:
        await client.aclose()
        raise
    return client


def _replica_reads(wanted: bool) -> dict[str, Any]:
    """The cluster client's option for reads spread over masters and replicas (redis-py 5.3
    named it ``load_balancing_strategy``; before, ``read_from_replicas``)."""
    if not wanted:
        return {}
    try:
        from redis.cluster import LoadBalancingStrategy
    except ImportError:  # redis-py < 5.3
        return {"read_from_replicas": True}
    return {"load_balancing_strategy": LoadBalancingStrategy.ROUND_ROBIN}

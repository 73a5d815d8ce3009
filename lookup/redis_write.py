"""RedisWrite: SET, HSET or DEL from a record, fenced by the record's version in one atomic
script per write (many writes per call); a batch is one pipeline.

Beside each key ``K`` the script keeps ``K:kaw-version``, the version of the last write it
applied. A write runs only when its version is newer (byte order of the strings of
:mod:`.versions`); then it applies the command and stores its version, atomically (a Lua
script). A delete keeps its version as a tombstone for ``tombstone_ttl`` seconds, so a late
older upsert cannot bring the key back meanwhile. With ``ttl`` the key and its version expire
together. On Redis Cluster the version key is named to share its key's slot (:func:`version_key`),
and a batch is one script call per master (:mod:`.redis_write_scripts`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from redis import exceptions as redis_errors

from .exceptions import LookupOptionError, ServiceUnavailableError
from .limits import Limits
from .redis_connect import RedisClient, RedisConnection
from .redis_errors import converted_errors, response_error, transient
from .redis_nodes import not_served_here, per_node, usable
from .redis_write_calls import Command, Item, WriteCalls, by_slot
from .redis_write_scripts import SCRIPT, SCRIPT_PER_MASTER
from .template import Template
from .writes import Write

__all__ = ["RedisWrite"]

log = logging.getLogger(__name__)

COMMANDS = ("SET", "HSET", "DEL")

_UNSURE_MOST = 100_000


class RedisWrite(Write):
    """Write records into Redis, each key's writes fenced by the record's version.

    Parameters
    ----------
    url : str
        ``redis://``, ``rediss://`` or ``unix://``; the password from ``password_env`` or the URL.
    key : str
        A template over the record's fields (``user:{user_id}``).
    command : {"SET", "HSET", "DEL"}
        ``SET``: the ``fields`` as one JSON object; ``HSET``: each of ``fields`` a hash field
        (a string as it is, any other value as its JSON literal, as :class:`RedisLookup` reads
        typed fields back); ``DEL``: delete the key.
    fields : list of str, optional
        The record fields written (``SET`` and ``HSET``; required for them).
    version : str, optional
        The column holding the record's version (its ``order_by`` column, an offset, an
        update time). Required unless ``at_least_once``.
    deleted : str, optional
        A boolean column: a record where it is true deletes its key (with a tombstone).
    ttl : float, optional
        Seconds the written key (and its version) live.
    tombstone_ttl : float
        Seconds a delete's version is kept (default a week).
    result : str
        The name of the result column: true when the write was applied, false when refused as
        stale (default ``applied``).
    coalesce : bool
        While a key has a write in flight, the writes that queue behind it collapse to the
        newest: only it is sent, the others leave with ``applied`` false and ``outcome``
        ``"superseded"`` (counted as ``writes_superseded``). The store ends at the newest
        version as without coalescing, far sooner for a hot key; wrong for a store that must
        see every version (an audit log, a counter). Needs ``version``.
    outcome : str
        With ``coalesce``: the name of a second result column, ``"applied"``, ``"stale"`` or
        ``"superseded"`` (default ``outcome``).
    at_least_once : bool
        Write without a version: no fencing, so a re-run writes again and may write an older
        value over a newer one.
    replicas : int
        Replicas that must hold a write before it counts as done (Redis's ``WAIT``, after each
        batch). Redis replicates after it answers, so a failover may lose the writes its
        replicas had not received yet; with ``replicas=1`` such a write fails as retryable and
        is written again (to the new master, fenced). 0 (the default): the master's answer.
        One node or Sentinel; not on a Redis Cluster (its clients cannot wait per node).
    replica_timeout : float
        Seconds ``WAIT`` waits for the replicas.
    db, password_env, max_connections, socket_timeout, ca_file, client_cert, client_key
        As :class:`RedisLookup` (``url`` may be a :class:`~lookup.RedisConnection` instead).
    limits : Limits, optional
        A rate, calls in flight, the breaker and a job-wide :class:`~lookup.Budget`, as for
        lookups; a pipeline of a batch's writes is one call of as many keys.
    """

    service_name = "redis"
    batching = True

    def __init__(
        self,
        url: str | RedisConnection,
        key: str,
        *,
        command: str = "SET",
        fields: Sequence[str] | None = None,
        version: str | None = None,
        deleted: str | None = None,
        ttl: float | None = None,
        tombstone_ttl: float = 7 * 24 * 3600,
        at_least_once: bool = False,
        result: str = "applied",
        coalesce: bool = False,
        outcome: str = "outcome",
        db: int | None = None,
        password_env: str | None = None,
        max_connections: int = 100,
        socket_timeout: float = 5.0,
        ca_file: str | None = None,
        client_cert: str | None = None,
        client_key: str | None = None,
        cluster: bool | None = None,
        replicas: int = 0,
        replica_timeout: float = 1.0,
        limits: Limits | None = None,
    ) -> None:
        command = str(command).upper()
        if command not in COMMANDS:
            raise LookupOptionError("command", f"command={command!r}; allowed: {', '.join(COMMANDS)}")
        self.fields = tuple(fields or ())
        if command != "DEL" and not self.fields:
            raise LookupOptionError(
                "fields", f"command={command!r} needs fields=[...]: the record fields written"
            )
        if ttl is not None and not ttl > 0:
            raise LookupOptionError("ttl", f"ttl={ttl!r}; allowed: seconds > 0, or None")
        if not tombstone_ttl > 0:
            raise LookupOptionError("tombstone_ttl", f"tombstone_ttl={tombstone_ttl!r}; allowed: seconds > 0")
        self.connection = RedisConnection.of(
            url,
            db=db,
            password_env=password_env,
            max_connections=max_connections,
            socket_timeout=socket_timeout,
            ca_file=ca_file,
            client_cert=client_cert,
            client_key=client_key,
            cluster=cluster,
        )
        self.key = Template(key).with_fields("key")
        self.replicas, self._wait = _replica_wait(replicas, replica_timeout, self.connection)
        self.command = command
        self.deleted = deleted
        self.ttl_ms = 0 if ttl is None else max(1, round(ttl * 1000))
        self.tombstone_ms = max(1, round(tombstone_ttl * 1000))
        self._calls = WriteCalls(command, self.fields, deleted, self.ttl_ms, self.tombstone_ms)
        self._script_loaded = False  # SCRIPT LOAD done on the current client
        self._by_master = True  # on a cluster, one call per master (until a master refuses it)
        # writes applied that too few replicas held (retried): found again at their own version,
        # they are this write's, not a re-run's, and count as applied once replicas hold them
        self._unsure: set[tuple[Hashable, str | None]] = set()
        inputs = (*self.key.fields, *self.fields, *((deleted,) if deleted else ()))
        super().__init__(
            version=version,
            at_least_once=at_least_once,
            fields=tuple(dict.fromkeys(inputs)),
            result=result,
            coalesce=coalesce,
            outcome=outcome,
            limits=limits,
        )

    def __repr__(self) -> str:
        return f"RedisWrite({self.command} {self.key.text!r}, version={self.version!r})"

    def target(self, record: Any) -> Hashable:
        return self.key.render(record)

    def describe_call(self, record: Any) -> str:
        return f"Redis {self._calls.command_of(record)} {self.key.render(record)!r}"

    # ------------------------------------------------------------------ client

    def _make_client(self) -> RedisClient:
        self._script_loaded = False  # a new client: a server it has not loaded the script on
        return self.connection.connect()

    async def _close_client(self, client: Any) -> None:
        await client.aclose()

    # ------------------------------------------------------------------ writes

    async def _apply(self, record: Any, target: Hashable, version: str | None) -> bool:
        [outcome] = await self._apply_many([(record, target, version)])
        if isinstance(outcome, BaseException):
            raise outcome
        return bool(outcome)

    async def _apply_many(self, items: list[Item]) -> list[Any]:
        """EVALSHA calls of up to ``CHUNK`` writes each (plain str arguments: packed by
        hiredis), the scripts loaded first on this client: one pipeline. On a cluster one call
        holds writes of every slot of one master (:data:`SCRIPT_PER_MASTER`) and the masters'
        calls go at once (:func:`~lookup.redis_nodes.per_node`); a write its master no longer
        serves (a slot moved), or whose master is not known, goes again in a call of its slot
        alone, which redis-py routes and redirects. A call the server had no script for ran
        nothing: its records get a retryable error, and the scripts are loaded again."""
        handle = self.client()
        targets = [item[1] for item in items[:5]]
        out: list[Any] = [None] * len(items)
        async with handle.held() as client:
            with converted_errors(targets, action="write"):
                if not self._script_loaded:
                    await client.script_load(SCRIPT)  # on a cluster: on every master
                    if handle.cluster:
                        await client.script_load(SCRIPT_PER_MASTER)
                    self._script_loaded = True
            if self.replicas and handle.cluster:
                raise LookupOptionError("replicas", _NO_CLUSTER_WAIT)
            token = uuid.uuid4().hex[:12]  # this batch's: a command sent again carries it
            rest = list(range(len(items)))
            if handle.cluster and self._by_master and usable(client, read_from_replicas=False):
                commands, calls, rest = self._calls.per_master(client, items, out, token)
                answers = await self._exchanged(client, commands, calls, items, targets)
                self._settle(items, calls, answers, out, not_here=rest)
                rest.sort()  # a key's writes in their order (all of one key share their master)
            commands, calls = [], []
            groups = by_slot(items, rest) if handle.cluster else {None: rest}
            for slot, group in groups.items():
                calls += self._calls.queue(commands, items, group, out, slot, token)
            answers = await self._exchanged(client, commands, calls, items, targets)
        held_by: Any = None
        if calls and self.replicas:
            answers, held_by = answers[:-1], answers[-1]
        replicated = held_by is None or (isinstance(held_by, int) and held_by >= self.replicas)
        self._settle(items, calls, answers, out, replicated=replicated, held_by=held_by)
        if not replicated and self.connection.sentinel:
            # the node may be a master no longer: the next call asks the sentinels again
            await client.connection_pool.disconnect()
        return out

    async def _exchanged(
        self,
        client: Any,
        commands: list[Command],
        calls: list[list[int]],
        items: list[Item],
        targets: list[Hashable],
    ) -> list[Any]:
        """The calls' answers; when they are lost, their writes are marked as maybe applied."""
        with converted_errors(targets, action="write"):
            try:
                return await self._send(client, commands) if calls else []
            except BaseException:  # the answers are lost: the writes may have applied
                for members in calls:
                    for i in members:
                        _maybe_applied(self._unsure, items[i])
                raise

    def _settle(
        self,
        items: list[Item],
        calls: list[list[int]],
        answers: list[Any],
        out: list[Any],
        *,
        replicated: bool = True,
        held_by: Any = None,
        not_here: list[int] | None = None,
    ) -> None:
        """Each write's outcome into ``out``. With ``not_here`` (calls of every slot of a
        master): a write whose node did not serve its key (it did nothing) is added there
        instead, and so are a call's writes when the server refused the call itself."""
        for members, answer in zip(calls, answers, strict=True):
            if isinstance(answer, redis_errors.NoScriptError):
                self._script_loaded = False  # the server lost its scripts (a restart): load again
            elif not_here is not None and isinstance(answer, redis_errors.ResponseError):
                self._refused_by_master(answer, [items[i] for i in members])
                not_here += members
                continue
            per_write = answer if isinstance(answer, list) else [answer] * len(members)
            for i, one in zip(members, per_write, strict=True):
                if not_here is not None and not_served_here(one):
                    not_here.append(i)
                else:
                    out[i] = _outcome(items[i][1], self._settled(items[i], one, replicated, held_by))

    def _refused_by_master(self, refusal: BaseException, items: list[Item]) -> None:
        """A call of every slot of a master was refused (AWS ElastiCache Serverless runs no
        script without declared keys): calls per slot from now on, unless Redis was only
        changing (a failover); its writes go again at once with the same token (one that did
        apply reads as applied)."""
        if self._by_master and not transient(refusal):
            log.warning("Redis refused a write call of several slots (%s): one call per slot now", refusal)
            self._by_master = False
        for item in items:
            _maybe_applied(self._unsure, item)

    def _settled(self, item: Item, answer: Any, replicated: bool, held_by: Any) -> Any:
        """A write's answer with the replicas' word on it: 1 applied (unsure until enough
        replicas hold it), 0 stale, 2 its own version found again (this write's own, when an
        earlier attempt of it was unsure; else a re-run's, stale)."""
        if answer not in (1, 2):
            if isinstance(answer, BaseException) and not isinstance(answer, redis_errors.ResponseError):
                _maybe_applied(self._unsure, item)  # its answer was lost on the way, not refused
            return answer
        mark = (item[1], item[2])
        if answer == 2 and mark not in self._unsure:
            return 0
        if replicated:
            self._unsure.discard(mark)
            return 1
        _maybe_applied(self._unsure, item)
        if isinstance(held_by, BaseException):  # WAIT refused (an ACL user without +wait)
            return held_by
        return _Unreplicated(held_by, self.replicas, self._wait[1])

    async def _send(self, client: Any, commands: list[Command]) -> list[Any]:
        """The calls' answers (each with its keys' cluster slot, or None on one node), and
        WAIT's last when replicas are asked for (one node only)."""
        if commands[0][0] is not None and usable(client, read_from_replicas=False):
            routed = [(slot, command) for slot, command in commands if slot is not None]
            return await per_node(client, routed, timeout=self.connection.socket_timeout, resend_lost=False)
        async with client.pipeline(transaction=False) as pipe:
            for _, command in commands:
                pipe.execute_command(*command)
            if self.replicas:
                pipe.execute_command("WAIT", *self._wait)  # on the writes' own connection
            return list(await pipe.execute(raise_on_error=False))


def _outcome(target: Hashable, answer: Any) -> Any:
    """A write's answer as its result: applied or not, or the error its record gets."""
    if isinstance(answer, redis_errors.NoScriptError):  # not run: safe to try again
        return ServiceUnavailableError(
            "the write script was not loaded", lookup_key=target, service="redis", action="write"
        )
    if isinstance(answer, redis_errors.ResponseError):
        return response_error(target, answer, action="write")
    if isinstance(answer, _Unreplicated):
        return ServiceUnavailableError(
            f"applied, but {answer.held_by!r} of {answer.wanted} replicas held it within "
            f"{answer.ms} ms, so a failover could lose it: written again",
            lookup_key=target,
            service="redis",
            action="write",
        )
    if isinstance(answer, BaseException):
        return answer
    return bool(answer)


def _maybe_applied(unsure: set[tuple[Hashable, str | None]], item: Item) -> None:
    """Remember in ``unsure`` that a write may have applied without its caller knowing (its
    answer lost, or too few replicas held it): its retry, a new call with a new token, then
    takes its own version found again (2) as applied, not as a re-run's (stale)."""
    if len(unsure) >= _UNSURE_MOST:
        unsure.clear()  # bounded: an entry is only needed while its record retries
    unsure.add((item[1], item[2]))


@dataclass(frozen=True)
class _Unreplicated:
    held_by: Any  # WAIT's answer (the replicas that hold the writes), or its error
    wanted: int
    ms: str


_NO_CLUSTER_WAIT = (
    "replicas= waits for replicas with WAIT on the writes' connection, which a Redis Cluster's "
    "clients do not keep per node; allowed on a Cluster: replicas=0"
)


def _replica_wait(replicas: Any, timeout: Any, connection: RedisConnection) -> tuple[int, tuple[str, str]]:
    """``replicas`` checked, and the arguments of its WAIT."""
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        raise LookupOptionError("replicas", f"replicas={replicas!r}; allowed: an integer >= 0")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise LookupOptionError("replica_timeout", f"replica_timeout={timeout!r}; allowed: seconds > 0")
    if replicas and connection.cluster:
        raise LookupOptionError("replicas", _NO_CLUSTER_WAIT)
    return replicas, (str(replicas), str(max(1, round(timeout * 1000))))

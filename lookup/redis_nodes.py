"""A batch's commands on a Redis Cluster: one write to each master, its answers read by hiredis.

redis-py's cluster client routes a pipeline command by command in Python and reads each answer
through its connection's timeout and error handling: measured, about 24 us of CPU per key for a
batch of 500 keys over 3 masters (one ``MGET`` per slot, as Redis refuses keys of two slots in
one command). :func:`per_node` routes the same commands by their key's slot with redis-py's own
slot table, packs each master's share into one buffer (hiredis), writes it on one of redis-py's
connections to that master, and parses the answers with a ``hiredis.Reader`` fed straight from
the connection's stream: 2.6 us a key measured the same way.

What it leaves to redis-py's cluster client, which then answers those commands as it always did:

- a command its master redirected (``MOVED``, ``ASK``) or asked to try again (``TRYAGAIN``,
  ``CLUSTERDOWN``): redis-py follows the redirect and reads the slots again;
- with ``resend_lost=True`` (reads only), a master's commands whose exchange failed (a refused or
  broken connection); a write's lost answer is never re-sent here: it may have applied, and the
  caller knows what that means for it;
- everything, when the client is not one it knows how to reach below (reads from replicas, a
  redis-py without the parts used: :func:`usable`).

Connections are redis-py's own (its TLS, ``AUTH``, ACL user and limits per node); a connection
whose exchange failed or was cancelled is disconnected before it goes back, since answers may
still be on their way on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import hiredis
from redis import exceptions as redis_errors
from redis.asyncio.cluster import ClusterNode
from redis.crc import key_slot

__all__ = [
    "Routed",
    "by_master",
    "get_by_slot",
    "masters_of",
    "mget_by_slot",
    "not_served_here",
    "per_node",
    "pipelined",
    "raising",
    "slots_of",
    "usable",
]

# (the key that picks the slot, or the slot, and the command's words)
Routed = tuple[int | str | bytes, tuple[Any, ...]]

READ_SIZE = 1 << 16
_INCOMPLETE = object()  # what the reader gives for an answer not whole yet (False is an answer: 0 == False)
# answered by redis-py's cluster client instead: it follows these and refreshes its slot table
_HANDED_OVER = (
    redis_errors.MovedError,
    redis_errors.AskError,
    redis_errors.TryAgainError,
    redis_errors.ClusterDownError,
)


def usable(client: Any, read_from_replicas: bool) -> bool:
    """Whether ``client`` (redis-py's asyncio cluster client) has the parts :func:`per_node`
    uses; reads spread over replicas stay with redis-py (its replica connections send
    ``READONLY``)."""
    manager = getattr(client, "nodes_manager", None)
    return (
        not read_from_replicas
        and manager is not None
        and callable(getattr(manager, "get_node_from_slot", None))
        and callable(getattr(ClusterNode, "acquire_connection", None))
    )


async def pipelined(
    client: Any,
    routed: Sequence[Routed],
    *,
    cluster: bool,
    timeout: float,
    resend_lost: bool,
    read_from_replicas: bool = False,
) -> list[Any]:
    """``routed``'s answers, in one round trip: a pipeline on one node; on a cluster each
    master's share at once (:func:`per_node`), or redis-py's cluster pipeline where that cannot
    be used. The first error Redis answered is raised, as redis-py's pipeline does."""
    if cluster and usable(client, read_from_replicas):
        return raising(await per_node(client, routed, timeout=timeout, resend_lost=resend_lost))
    pipe = client.pipeline(transaction=False)
    for _, words in routed:
        pipe.execute_command(*words)
    return list(await pipe.execute())


def raising(answers: list[Any]) -> list[Any]:
    """``answers``, unless Redis refused one: then that error is raised (the first), as
    redis-py's pipeline and MGET do."""
    refused = next((a for a in answers if isinstance(a, BaseException)), None)
    if refused is not None:
        raise refused
    return answers


async def mget_by_slot(client: Any, keys: Sequence[str | bytes], *, timeout: float) -> list[Any]:
    """The values of ``keys``, in order: one ``MGET`` per slot, sent by :func:`per_node` (a
    slot's ``MGET`` Redis refused gives each of its keys that error)."""
    values, _ = await _per_slot(client, keys, timeout, lone="MGET")
    return values


async def get_by_slot(client: Any, keys: Sequence[str | bytes], *, timeout: float) -> list[Any]:
    """GET's answer for each key, in order (the value, None for a miss, or the key's
    ``ResponseError``, WRONGTYPE among them): a slot's one key asked with ``GET``, several with
    one ``MGET``, whose nils are asked again with ``GET`` (``MGET`` answers nil for a key of
    another type too); sent by :func:`per_node`."""
    values, nils = await _per_slot(client, keys, timeout, lone="GET")
    if nils:
        again = await per_node(
            client, [(keys[i], ("GET", keys[i])) for i in nils], timeout=timeout, resend_lost=True
        )
        for i, value in zip(nils, again, strict=True):
            values[i] = value
    return values


async def _per_slot(
    client: Any, keys: Sequence[str | bytes], timeout: float, lone: str
) -> tuple[list[Any], list[int]]:
    """The keys' values, one ``MGET`` per slot (a slot's one key asked with ``lone``), and the
    keys an ``MGET`` of several answered nil for."""
    slots: dict[int, list[int]] = {}
    for i, slot in enumerate(slots_of(keys)):
        slots.setdefault(slot, []).append(i)
    routed = [
        (slot, (lone, keys[members[0]]) if len(members) == 1 else ("MGET", *[keys[i] for i in members]))
        for slot, members in slots.items()
    ]
    values: list[Any] = [None] * len(keys)
    nils: list[int] = []
    answers = await per_node(client, routed, timeout=timeout, resend_lost=True)
    for members, answer in zip(slots.values(), answers, strict=True):
        if len(members) == 1:  # most slots of a batch: one key
            values[members[0]] = answer[0] if lone == "MGET" and type(answer) is list else answer
        elif isinstance(answer, BaseException):
            for i in members:
                values[i] = answer
        else:
            for i, value in zip(members, answer, strict=True):
                values[i] = value
                if value is None:
                    nils.append(i)
    return values, nils


# What a script's command answers when its node does not serve the key (Redis 6.2 says "Lua
# script attempted to ...", 7.0 and on "Script attempted to ..."): checked before the command
# runs, so it did nothing
_NOT_SERVED = ("attempted to access a non local key", "while the cluster is down")


def not_served_here(answer: object) -> bool:
    """Whether ``answer`` (one command's, inside a script) says its node does not serve the key now."""
    text = str(answer) if isinstance(answer, Exception) else ""
    return any(phrase in text for phrase in _NOT_SERVED)


def masters_of(client: Any, slots: Sequence[int]) -> list[Any]:
    """Each slot's master as the slot table of ``client`` (redis-py's asyncio cluster client)
    has it, None where it knows none. The table is read directly (its method costs 0.7 us a
    call), the method asked only for a slot the table lacks."""
    manager = client.nodes_manager
    table = getattr(manager, "slots_cache", None) or {}
    masters: list[Any] = []
    for slot in slots:
        held = table.get(slot)
        if held:
            masters.append(held[0])  # redis-py keeps a slot's master first
            continue
        try:
            masters.append(manager.get_node_from_slot(slot))
        except (redis_errors.RedisClusterException, LookupError):
            masters.append(None)
    return masters


def by_master(client: Any, slots: Sequence[int]) -> tuple[dict[str, tuple[Any, list[int]]], list[int]]:
    """The indexes of ``slots`` grouped by their master (:func:`masters_of`), each group in the
    order given and keyed by the master's name (redis-py's nodes are not hashable in every
    release it allows) with the node; and the indexes of slots with no master known."""
    groups: dict[str, tuple[Any, list[int]]] = {}
    unknown: list[int] = []
    for i, node in enumerate(masters_of(client, slots)):
        if node is None:
            unknown.append(i)
            continue
        group = groups.get(node.name)
        if group is None:
            groups[node.name] = (node, [i])
        else:
            group[1].append(i)
    return groups, unknown


def _encoded(key: str | bytes) -> bytes:
    return key.encode() if isinstance(key, str) else key


def slots_of(keys: Sequence[str | bytes]) -> list[int]:
    """Each key's cluster slot (redis-py's ``key_slot``)."""
    return [key_slot(_encoded(key)) for key in keys]


async def per_node(client: Any, routed: Sequence[Routed], *, timeout: float, resend_lost: bool) -> list[Any]:
    """Each command's answer, in the order given: the value Redis answered, or the
    ``ResponseError`` it answered for that command.

    Invariant: every command is sent once to its slot's master as redis-py's slot table has it,
    and answered once: by that master, or (redirected, told to try again, or its exchange lost
    with ``resend_lost``) by redis-py's cluster client. A master that does not answer within
    ``timeout`` seconds raises ``redis.TimeoutError``; a failed exchange without ``resend_lost``
    raises its error. Values are as Redis sends them (RESP2: a hash is a flat list).
    """
    answers: list[Any] = [None] * len(routed)
    slots = [key if isinstance(key, int) else key_slot(_encoded(key)) for key, _ in routed]
    groups, handed = by_master(client, slots)  # a command with no master known: redis-py's
    cache = getattr(client.nodes_manager, "nodes_cache", None)
    exchanges = [
        asyncio.wait_for(_exchange(node, [routed[i][1] for i in members], cache), timeout)
        for node, members in groups.values()
    ]
    outcomes = await asyncio.gather(*exchanges, return_exceptions=True)
    for (_, members), outcome in zip(groups.values(), outcomes, strict=True):
        if isinstance(outcome, BaseException):
            if not (resend_lost and _lost(outcome)):
                raise _as_redis_error(outcome)
            handed += members
            continue
        for i, answer in zip(members, outcome, strict=True):
            if isinstance(answer, _HANDED_OVER):
                handed.append(i)
            else:
                answers[i] = answer
    if handed:
        handed.sort()
        pipe = client.pipeline(transaction=False)
        for i in handed:
            pipe.execute_command(*routed[i][1])
        for i, answer in zip(handed, await pipe.execute(raise_on_error=False), strict=True):
            answers[i] = answer
    return answers


def _lost(exc: BaseException) -> bool:
    """Whether the exchange broke on its connection (a timeout is no such: asking again would
    wait as long again)."""
    if isinstance(exc, (asyncio.TimeoutError, redis_errors.TimeoutError)):
        return False
    return isinstance(exc, (redis_errors.ConnectionError, OSError))


def _as_redis_error(exc: BaseException) -> BaseException:
    if isinstance(exc, asyncio.TimeoutError) and not isinstance(exc, redis_errors.RedisError):
        return redis_errors.TimeoutError("a cluster node did not answer in time")
    return exc


async def _exchange(node: Any, commands: list[tuple[Any, ...]], cache: dict[str, Any] | None) -> list[Any]:
    """``commands`` written to ``node`` at once on one of its connections, and their answers;
    ``cache``: redis-py's nodes by name, to tell whether ``node`` is still one of them."""
    connection = node.acquire_connection()
    try:
        await connection.send_packed_command(
            b"".join(map(hiredis.pack_command, commands)), check_health=False
        )
        answers = await _read(connection, len(commands), connection._parser.parse_error)
    except BaseException:
        # answers may still arrive on it: it must not serve another call
        await asyncio.shield(connection.disconnect(nowait=True))
        raise
    finally:
        if cache is not None and cache.get(node.name) is not node:
            # redis-py read the slots again meanwhile and made new nodes, closing the old ones'
            # connections (some releases do): one opened since would stay open in a node nobody
            # holds any more
            await asyncio.shield(connection.disconnect(nowait=True))
        _release(node, connection)
    return answers


def _release(node: Any, connection: Any) -> None:
    """``connection`` back to ``node``'s free ones (older redis-py, 6.0 among them, has no
    method for it: its own calls put the connection back on ``_free``)."""
    release = getattr(node, "release", None)
    if release is not None:
        release(connection)
    else:
        node._free.append(connection)


async def _read(connection: Any, count: int, error: Callable[[str], Exception]) -> list[Any]:
    stream = connection._reader
    reader = hiredis.Reader(replyError=error, notEnoughData=_INCOMPLETE)
    answers: list[Any] = []
    while len(answers) < count:
        data = await stream.read(READ_SIZE)
        if not data:
            raise redis_errors.ConnectionError("the cluster node closed the connection")
        reader.feed(data)
        answers.extend(iter(reader.gets, _INCOMPLETE))  # every whole answer in the data so far
    if len(answers) != count:
        raise redis_errors.ConnectionError(f"{len(answers)} answers to {count} commands")
    return answers

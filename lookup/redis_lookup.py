"""RedisLookup: GET, HGETALL or HMGET by key template, batched through MGET or a pipeline."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from redis import exceptions as redis_errors

from .base import Lookup
from .cache import PartialCache
from .exceptions import (
    BODY_LIMIT,
    BadResponseError,
    LookupOptionError,
)
from .fast_json import loads, loads_many
from .fields import Field
from .limits import Limits
from .loop_client import LoopClient
from .redis_connect import RedisClient, RedisConnection
from .redis_errors import converted_errors, response_error
from .redis_nodes import get_by_slot, per_node, usable
from .shared_cache import SharedCache
from .template import Template

__all__ = ["RedisLookup"]

COMMANDS = ("GET", "HGETALL", "HMGET")
DECODES = ("json", "raw")


class RedisLookup(LoopClient, Lookup):
    """Look records up in Redis.

    ``key``: a template over the record's fields (``user:{user_id}``). ``command``: ``GET``
    (the value, JSON-decoded with ``decode="json"`` or a string with ``decode="raw"``),
    ``HGETALL`` (the hash as a dict) or ``HMGET`` (the ``hash_fields`` as a dict). A missing
    key (or an empty hash) is a miss. Batches go through one MGET (GET) or one pipeline
    (the hash commands).

    Connection: ``url`` (``redis://``, ``rediss://``, ``unix://``), ``db``, the password from
    ``password_env`` (or inside the URL), ``ca_file``, ``client_cert`` and ``client_key`` for TLS;
    or a :class:`~lookup.RedisConnection` made once for every Redis part. One connection pool per
    worker process and loop, made on first use.
    """

    service_name = "redis"

    def __init__(
        self,
        url: str | RedisConnection,
        key: str,
        *,
        command: str = "GET",
        decode: str = "json",
        hash_fields: Sequence[str] | None = None,
        fields: Sequence[Field | str | tuple[str, str]] | None = None,
        result_path: str | None = None,
        db: int | None = None,
        password_env: str | None = None,
        max_connections: int = 100,
        socket_timeout: float = 5.0,
        ca_file: str | None = None,
        client_cert: str | None = None,
        client_key: str | None = None,
        cluster: bool | None = None,
        read_from_replicas: bool = False,
        error_body_chars: int = BODY_LIMIT,
        cache: PartialCache | None = None,
        dedup: bool = True,
        limits: Limits | None = None,
        shared_cache: SharedCache | None = None,
    ) -> None:
        super().__init__(
            fields=fields,
            result_path=result_path,
            cache=cache,
            dedup=dedup,
            error_body_chars=error_body_chars,
            limits=limits,
            shared_cache=shared_cache,
        )
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
            read_from_replicas=read_from_replicas,
        )
        command = command.upper()
        if command not in COMMANDS:
            raise LookupOptionError("command", f"command={command!r}; allowed: {', '.join(COMMANDS)}")
        if decode not in DECODES:
            raise LookupOptionError("decode", f"decode={decode!r}; allowed: {', '.join(DECODES)}")
        if command == "HMGET" and not hash_fields:
            raise LookupOptionError("command", "command='HMGET' needs hash_fields=[...]")
        self.key = Template(key).with_fields("key")
        self.command = command
        self.decode = decode
        self.hash_fields = list(hash_fields or [])
        # a hash's values and a raw value are strings: typed fields read them as literals
        self.mapper.from_strings = command != "GET" or decode == "raw"

    def __repr__(self) -> str:
        return f"RedisLookup({self.command} {self.key.text!r})"

    def input_fields(self) -> tuple[str, ...]:
        return self.key.fields

    def cache_identity(self) -> str:
        """The Redis (its URL without a password), the command and how answers are decoded."""
        fields = ",".join(self.hash_fields)
        return f"{super().cache_identity()}|{self.connection.shown}|{self.command} {fields}|{self.decode}"

    def cache_credentials(self) -> str:
        """The URL's user and password, the password's variable and the client certificate: an
        ACL user that sees other keys keeps its answers apart in a shared cache."""
        c = self.connection
        return f"{c.url}|{c.password_env}|{c.client_cert}"

    def _key_template(self) -> Template:
        return self.key

    # ------------------------------------------------------------------ client

    def _make_client(self) -> RedisClient:
        return self.connection.connect()

    async def _close_client(self, client: RedisClient) -> None:
        await client.aclose()

    # ------------------------------------------------------------------ lookups

    def request_key(self, record: Any) -> Hashable:
        return self.key.render(record)

    def describe_call(self, record: Any) -> str:
        """What this lookup asks for ``record``, for its errors: the command and the Redis key."""
        return f"Redis {self.command} {self.key.render(record)!r}"

    def request_keys(self, records: list[Any]) -> list[Any]:
        return self.key.render_many(records)

    async def fetch(self, key: Hashable) -> Any:
        with converted_errors(key):
            async with self.client().held() as client:
                if self.command == "GET":
                    raw = await client.get(key)
                elif self.command == "HGETALL":
                    raw = await client.hgetall(key)
                else:
                    raw = await client.hmget(key, self.hash_fields)
        return self._decoded(key, raw)

    async def fetch_many(self, keys: list[Hashable]) -> list[Any]:
        handle = self.client()
        with converted_errors(keys[:5]):
            async with handle.held() as client:
                raws = await self._raws(client, keys, handle.cluster)
        if self.command == "GET" and self.decode == "json":
            try:  # the common case in one comprehension; any oddity takes the careful path
                return loads_many(raws)
            except (TypeError, ValueError):
                pass
        out: list[Any] = []
        for key, raw in zip(keys, raws, strict=True):
            if isinstance(raw, redis_errors.ResponseError):
                out.append(response_error(key, raw))
                continue
            try:
                out.append(self._decoded(key, raw))
            except BadResponseError as exc:
                out.append(exc)
        return out

    async def _raws(self, client: Any, keys: list[Hashable], cluster: bool) -> list[Any]:
        """What Redis holds under ``keys``: one MGET (on a cluster one per slot, each master's
        sent at once) or one pipeline."""
        if cluster and usable(client, self.connection.read_from_replicas):
            return await self._raws_by_node(client, keys)
        if self.command == "GET":
            raws = await (client.mget_nonatomic(keys) if cluster else client.mget(keys))
            nils = [i for i, raw in enumerate(raws) if raw is None]
            if nils:  # MGET answers nil for a key of another type too: GET tells them apart
                raws = await self._misses_or_wrong_types(client, keys, raws, nils)
            return list(raws)
        pipe = client.pipeline(transaction=False)
        for key in keys:
            if self.command == "HGETALL":
                pipe.hgetall(key)
            else:
                pipe.hmget(key, self.hash_fields)
        return list(await pipe.execute(raise_on_error=False))

    async def _raws_by_node(self, client: Any, keys: list[Any]) -> list[Any]:
        """:meth:`_raws` on a cluster, each master's share in one exchange
        (:func:`~lookup.redis_nodes.per_node`); a hash as redis-py gives it (a dict)."""
        timeout = self.connection.socket_timeout
        if self.command == "GET":
            return await get_by_slot(client, keys, timeout=timeout)
        words = ("HGETALL",) if self.command == "HGETALL" else ("HMGET",)
        extra = tuple(self.hash_fields) if self.command == "HMGET" else ()
        routed = [(key, (*words, key, *extra)) for key in keys]
        raws = await per_node(client, routed, timeout=timeout, resend_lost=True)
        if self.command == "HGETALL":
            raws = [_pairs(raw) if isinstance(raw, list) else raw for raw in raws]
        return raws

    @staticmethod
    async def _misses_or_wrong_types(
        client: Any, keys: list[Hashable], raws: list[Any], nils: list[int]
    ) -> list[Any]:
        """The nils of an MGET asked again with GET, which a user allowed only reads may run:
        nil again for a miss, WRONGTYPE for a key of another type (a value written meanwhile is
        taken as it is now)."""
        pipe = client.pipeline(transaction=False)
        for i in nils:
            pipe.get(keys[i])
        again = await pipe.execute(raise_on_error=False)
        raws = list(raws)
        for i, value in zip(nils, again, strict=True):
            raws[i] = value
        return raws

    def _decoded(self, key: Hashable, raw: Any) -> Any:
        if raw is None:
            return None
        if self.command == "GET":
            text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
            if self.decode == "raw":
                return text
            try:
                return loads(text)
            except ValueError as exc:
                raise BadResponseError(
                    f"value is not JSON ({exc}); use decode='raw' for plain strings",
                    lookup_key=key,
                    service=self.service_name,
                    body=text,
                    body_limit=self.error_body_chars,
                ) from exc
        if self.command == "HGETALL":
            if not raw:
                return None
            return {_text(k): _text(v) for k, v in raw.items()}
        values = [_text(v) for v in raw]
        if all(v is None for v in values):
            return None
        return dict(zip(self.hash_fields, values, strict=True))


def _pairs(flat: list[Any]) -> dict[Any, Any]:
    """A hash as RESP2 sends it (name, value, name, value...) as a dict."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


def _text(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value

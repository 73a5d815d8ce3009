"""HttpLookup: an async HTTP lookup per record, or per batch, on aiohttp."""

from __future__ import annotations

import email.utils
import json
import os
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import aiohttp

from .base import Lookup
from .cache import PartialCache
from .exceptions import (
    BadResponseError,
    LookupTimeoutError,
    RateLimitedError,
    ServiceUnavailableError,
)
from .fields import Field
from .template import Template

__all__ = ["HttpLookup", "Secret"]


class Secret:
    """A value that never shows in a repr, a log line or an error."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    @classmethod
    def from_env(cls, name: str) -> Secret:
        value = os.environ.get(name)
        if value is None:
            raise ValueError(f"environment variable {name} is not set (it should hold a secret)")
        return cls(value)

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _render_json(template: Any, record: Any, cache: dict[str, Template]) -> Any:
    if isinstance(template, str):
        t = cache.get(template)
        if t is None:
            t = cache[template] = Template(template)
        # a template that is exactly one field keeps the field's own JSON type
        if len(t.fields) == 1 and template == "{" + t.fields[0] + "}":
            try:
                value = record[t.fields[0]]
            except (KeyError, IndexError, TypeError):
                value = None
            return value if value is not None else t.render(record)
        return t.render(record)
    if isinstance(template, Mapping):
        return {k: _render_json(v, record, cache) for k, v in template.items()}
    if isinstance(template, list):
        return [_render_json(v, record, cache) for v in template]
    return template


def _json_fields(template: Any) -> list[str]:
    if isinstance(template, str):
        return list(Template(template).fields)
    if isinstance(template, Mapping):
        return [f for v in template.values() for f in _json_fields(v)]
    if isinstance(template, list):
        return [f for v in template for f in _json_fields(v)]
    return []


class HttpLookup(Lookup):
    """Look records up over HTTP.

    ``url``: a template over the record's fields (``http://svc/users/{user_id}``; values are
    URL-quoted). ``params`` and ``headers`` values and string leaves of ``json_body`` may be
    templates too. ``fields`` declares the result columns (names, types, paths into the JSON);
    without it the whole JSON answer (or ``result_path`` into it) is the result.

    Status codes: 404 and 204 (``miss_statuses``) are a miss; another 2xx is a hit, whose body
    must be JSON (JSON ``null`` is a miss; an empty body is a bad response) with every declared
    field; 429 and 503 are retryable and carry Retry-After; other 5xx, connection errors and
    timeouts are retryable; other 4xx are not.

    Batch endpoint: with ``batch_url``, records are looked up many at a time: the values of the
    ``key`` template (default: the URL's only field) are sent as ``batch_body(keys)`` (default a
    JSON list) and the answer is a JSON object from key (as a string) to result, or a list in
    key order (``batch_response="list"``); a key absent or null is a miss.

    Secrets: ``bearer_token`` / ``bearer_token_env`` and ``basic_auth`` / ``basic_auth_env``
    (a ``(user, password)`` pair of values or of environment variable names) are kept in
    :class:`Secret` and never appear in a repr or an error.
    """

    service = "http"

    def __init__(
        self,
        url: str,
        *,
        method: str = "GET",
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        json_body: Any = None,
        fields: Sequence[Field | str | tuple[str, str]] | None = None,
        result_path: str | None = None,
        key: str | None = None,
        batch_url: str | None = None,
        batch_body: Callable[[list[Any]], Any] | None = None,
        batch_response: str = "map",
        bearer_token: str | None = None,
        bearer_token_env: str | None = None,
        basic_auth: tuple[str, str] | None = None,
        basic_auth_env: tuple[str, str] | None = None,
        request_timeout: float = 10.0,
        max_connections: int = 1000,
        miss_statuses: Sequence[int] = (404, 204),
        cache: PartialCache | None = None,
        dedup: bool = True,
    ) -> None:
        self.batching = batch_url is not None
        self.miss_statuses = tuple(miss_statuses)
        super().__init__(fields=fields, result_path=result_path, cache=cache, dedup=dedup)
        self.url = Template(url, url_quote=True)
        self.method = method.upper()
        self.params = {k: Template(v) for k, v in (params or {}).items()}
        self.headers = {k: Template(v) for k, v in (headers or {}).items()}
        self.json_body = json_body
        if batch_response not in ("map", "list"):
            raise ValueError(f"batch_response={batch_response!r}; allowed: 'map', 'list'")
        if key is None and len(self.url.fields) == 1:
            key = "{" + self.url.fields[0] + "}"
        if self.batching and key is None:
            raise ValueError(
                "a batch endpoint needs key= (a template of what is looked up, e.g. '{user_id}')"
            )
        self.key = Template(key) if key is not None else None
        self.batch_url = batch_url
        self.batch_body = batch_body
        self.batch_response = batch_response
        if bearer_token_env is not None:
            bearer_token = Secret.from_env(bearer_token_env).reveal()
        self._bearer = Secret(bearer_token) if bearer_token is not None else None
        if basic_auth_env is not None:
            basic_auth = (
                Secret.from_env(basic_auth_env[0]).reveal(),
                Secret.from_env(basic_auth_env[1]).reveal(),
            )
        self._basic = (basic_auth[0], Secret(basic_auth[1])) if basic_auth is not None else None
        if request_timeout <= 0:
            raise ValueError(f"request_timeout={request_timeout}; allowed: seconds > 0")
        if max_connections < 1:
            raise ValueError(f"max_connections={max_connections}; allowed: an integer >= 1")
        self.request_timeout = request_timeout
        self.max_connections = max_connections
        self._json_templates: dict[str, Template] = {}

    def __repr__(self) -> str:
        auth = " auth=***" if self._bearer or self._basic else ""
        return f"HttpLookup({self.method} {self.url.text!r}{auth})"

    def _key_template(self) -> Template | None:
        return self.key if self.batching else None

    def input_fields(self) -> tuple[str, ...]:
        templates = [self.key] if self.batching and self.key is not None else [self.url]
        templates += [*self.params.values(), *self.headers.values()]
        names = [f for t in templates if t is not None for f in t.fields]
        if self.json_body is not None and not self.batching:
            names += _json_fields(self.json_body)
        return tuple(dict.fromkeys(names))

    # ------------------------------------------------------------------ client

    def _make_client(self) -> aiohttp.ClientSession:
        # aiohttp's default of 100 connections would silently cap concurrency
        connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=0, ttl_dns_cache=300)
        headers = {}
        if self._bearer is not None:
            headers["Authorization"] = f"Bearer {self._bearer.reveal()}"
        auth = aiohttp.BasicAuth(self._basic[0], self._basic[1].reveal()) if self._basic else None
        return aiohttp.ClientSession(
            connector=connector,
            headers=headers,
            auth=auth,
            timeout=aiohttp.ClientTimeout(total=self.request_timeout),
            raise_for_status=False,
        )

    async def _close_client(self, client: aiohttp.ClientSession) -> None:
        await client.close()

    # ------------------------------------------------------------------ requests

    def request_key(self, record: Any) -> Hashable:
        if self.batching:
            assert self.key is not None
            return self.key.render(record)
        url = self.url.render(record)
        params = tuple((k, t.render(record)) for k, t in self.params.items()) or None
        headers = tuple((k, t.render(record)) for k, t in self.headers.items()) or None
        body = None
        if self.json_body is not None:
            body = json.dumps(_render_json(self.json_body, record, self._json_templates), sort_keys=True)
        if params is None and headers is None and body is None:
            return url
        return (url, params, headers, body)

    def _request_keys_fast(self, records: list[Any]) -> list[Any]:
        if self.batching and self.key is not None:
            return self.key.render_many(records)
        return [self.request_key(record) for record in records]

    async def _fetch(self, key: Hashable) -> Any:
        if isinstance(key, tuple):
            url, params, headers, body = key
        else:
            url, params, headers, body = key, None, None, None
        status, answer_headers, payload = await self._request(
            self.method, url, key, params=params, headers=headers, data=body
        )
        return self._decode(status, answer_headers, payload, key)

    async def _fetch_many(self, keys: list[Hashable]) -> list[Any]:
        assert self.batch_url is not None
        body = self.batch_body(keys) if self.batch_body else keys
        status, headers, payload = await self._request("POST", self.batch_url, keys, data=json.dumps(body))
        if status == 404:  # a batch endpoint that is not there is not a miss of every key
            raise BadResponseError(
                "the batch endpoint answered 404 (check batch_url)",
                lookup_key=keys[:5],
                service=self.batch_url,
                status=status,
            )
        answer = self._decode(status, headers, payload, keys)
        if answer is None:
            return [None] * len(keys)
        if self.batch_response == "list":
            if not isinstance(answer, list) or len(answer) != len(keys):
                raise BadResponseError(
                    f"batch answer should be a list of {len(keys)} items",
                    lookup_key=keys[:5],
                    service=self.batch_url,
                    status=status,
                    body=payload,
                )
            return answer
        if not isinstance(answer, Mapping):
            raise BadResponseError(
                "batch answer should be a JSON object from key to result",
                lookup_key=keys[:5],
                service=self.batch_url,
                status=status,
                body=payload,
            )
        return [answer.get(str(k)) for k in keys]

    async def _request(
        self, method: str, url: str, key: Any, *, params: Any = None, headers: Any = None, data: Any = None
    ) -> tuple[int, Mapping[str, str], bytes]:
        session = self.client()
        extra_headers = dict(headers) if headers else {}
        if data is not None:
            extra_headers.setdefault("Content-Type", "application/json")
        try:
            async with session.request(
                method, url, params=list(params) if params else None, headers=extra_headers or None, data=data
            ) as response:
                return response.status, response.headers, await response.read()
        except TimeoutError as exc:  # aiohttp's ServerTimeoutError and the total timeout
            raise LookupTimeoutError(
                f"no answer within {self.request_timeout:g} s", lookup_key=key, service=url
            ) from exc
        except aiohttp.ClientConnectionError as exc:
            raise ServiceUnavailableError(
                f"{type(exc).__name__}: {exc}", lookup_key=key, service=url
            ) from exc
        except aiohttp.ClientError as exc:
            raise ServiceUnavailableError(
                f"{type(exc).__name__}: {exc}", lookup_key=key, service=url
            ) from exc

    def _decode(self, status: int, headers: Mapping[str, str], payload: bytes, key: Any) -> Any:
        url = self.service
        if status in self.miss_statuses:
            return None
        if 200 <= status < 300:
            if not payload.strip():
                raise BadResponseError(
                    f"empty answer; a miss is status {' or '.join(map(str, self.miss_statuses))}",
                    lookup_key=key,
                    service=url,
                    status=status,
                )
            try:
                return json.loads(payload)  # JSON null: the service says there is nothing: a miss
            except ValueError as exc:
                raise BadResponseError(
                    f"answer is not JSON ({exc})", lookup_key=key, service=url, status=status, body=payload
                ) from exc
        if status == 429:
            raise RateLimitedError(
                "rate limited (429)",
                lookup_key=key,
                service=url,
                status=status,
                retry_after=_retry_after(headers.get("Retry-After")),
            )
        if status >= 500:
            raise ServiceUnavailableError(
                f"server error {status}: {payload[:200].decode('utf-8', 'replace')}",
                lookup_key=key,
                service=url,
                status=status,
                retry_after=_retry_after(headers.get("Retry-After")),
            )
        raise BadResponseError("request rejected", lookup_key=key, service=url, status=status, body=payload)

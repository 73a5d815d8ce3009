"""HttpLookup: an async HTTP lookup per record, or per batch (aiohttp, or the lean client on
httptools when it is installed)."""

from __future__ import annotations

import base64
import email.utils
import json
import time
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from typing import Any

from .base import Lookup
from .cache import PartialCache
from .exceptions import (
    BODY_LIMIT,
    BadResponseError,
    LookupOptionError,
    RateLimitedError,
    ServiceUnavailableError,
    snippet,
)
from .fast_json import loads
from .fields import Field
from .http_client import http_client_setting, make_transport, send
from .http_options import ClientOptions
from .http_wire import Answer, Transport
from .limits import Limits
from .loop_client import LoopClient
from .secrets import Redactor, Secret, redact_url, split_userinfo
from .shared_cache import SharedCache
from .template import Template

__all__ = ["HttpLookup", "Secret"]


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


def _secret(value: str | Secret | None) -> Secret | None:
    if value is None or isinstance(value, Secret):
        return value
    return Secret(value)


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


def _authorization_header(bearer: Secret | None, basic: tuple[str, Secret | None] | None) -> Secret | None:
    if bearer is not None:
        return Secret(f"Bearer {bearer.reveal()}")
    if basic is not None:
        user, password = basic
        assert password is not None
        token = base64.b64encode(f"{user}:{password.reveal()}".encode()).decode("ascii")
        return Secret(f"Basic {token}")
    return None


class HttpLookup(LoopClient, Lookup):
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

    service_name = "http"
    fetch_outside_task = True  # its transports yield before anything that needs the caller's task

    def __init__(
        self,
        url: str,
        *,
        method: str = "GET",
        params: Mapping[str, str | Secret] | None = None,
        headers: Mapping[str, str | Secret] | None = None,
        json_body: Any = None,
        fields: Sequence[Field | str | tuple[str, str]] | None = None,
        result_path: str | None = None,
        key: str | None = None,
        batch_url: str | None = None,
        batch_body: Callable[[list[Any]], Any] | None = None,
        batch_response: str = "map",
        bearer_token: str | Secret | None = None,
        bearer_token_env: str | None = None,
        basic_auth: tuple[str, str | Secret] | None = None,
        basic_auth_env: tuple[str, str] | None = None,
        ca_file: str | None = None,
        client_cert: str | None = None,
        client_key: str | None = None,
        proxy: str | Secret | None = None,
        request_timeout: float = 10.0,
        max_connections: int = 1000,
        miss_statuses: Sequence[int] = (404, 204),
        error_body_chars: int = BODY_LIMIT,
        cache: PartialCache | None = None,
        dedup: bool = True,
        limits: Limits | None = None,
        shared_cache: SharedCache | None = None,
    ) -> None:
        self.miss_statuses = tuple(miss_statuses)
        super().__init__(
            fields=fields,
            result_path=result_path,
            cache=cache,
            dedup=dedup,
            error_body_chars=error_body_chars,
            limits=limits,
            shared_cache=shared_cache,
        )
        url, userinfo = split_userinfo(url)
        if userinfo is not None and (basic_auth is not None or basic_auth_env is not None):
            raise LookupOptionError(
                "basic_auth", "credentials in the URL and basic_auth=: give them once, as basic_auth="
            )
        self.url = Template(url, url_quote=True)
        self.method = method.upper()
        self.params = {k: Template(v) for k, v in (params or {}).items() if not isinstance(v, Secret)}
        self.headers = {k: Template(v) for k, v in (headers or {}).items() if not isinstance(v, Secret)}
        # secret values are constants: sent with every request, never part of a lookup key
        self._secret_params: list[tuple[str, Secret]] = [
            (k, v) for k, v in (params or {}).items() if isinstance(v, Secret)
        ]
        self._secret_headers: dict[str, Secret] = {
            k: v for k, v in (headers or {}).items() if isinstance(v, Secret)
        }
        self.json_body = json_body
        # what is looked up in a batch (the URL itself otherwise: request_key below)
        self.key = _key_template(key, self.url, batch_url is not None, batch_response) or self.url
        if batch_url is not None:
            batch_url, batch_userinfo = split_userinfo(batch_url)
            userinfo = userinfo or batch_userinfo
        self.batch_url = batch_url
        self.batch_body = batch_body
        self.batch_response = batch_response
        self._bearer, self._basic = _credentials(
            bearer_token, bearer_token_env, basic_auth, basic_auth_env, userinfo
        )
        _check_client(request_timeout, max_connections)
        self.request_timeout = request_timeout
        self.max_connections = max_connections
        self.ca_file = ca_file
        self.client_options = ClientOptions.of(ca_file, client_cert, client_key, proxy)
        self._json_templates: dict[str, Template] = {}
        self._authorization = _authorization_header(self._bearer, self._basic)
        self._redactor = Redactor(self._secret_texts())

    def _secret_texts(self) -> list[str]:
        texts = [v.reveal() for _, v in self._secret_params] + [
            v.reveal() for v in self._secret_headers.values()
        ]
        if self._bearer is not None:
            texts.append(self._bearer.reveal())
        texts += self.client_options.secret_texts()  # a proxy URL may carry a user and password
        if self._basic is not None:
            user, password = self._basic[0], self._basic[1]
            assert password is not None
            texts += [password.reveal(), base64.b64encode(f"{user}:{password.reveal()}".encode()).decode()]
        return texts

    def __repr__(self) -> str:
        auth = (
            " auth=***" if self._bearer or self._basic or self._secret_headers or self._secret_params else ""
        )
        return f"HttpLookup({self.method} {self.url.text!r}{auth})"

    def cache_identity(self) -> str:
        """The method and the URL templates (a digest of them is all a shared cache's keys show)."""
        batch = getattr(self, "batch_url", None)
        return f"{super().cache_identity()}|{self.method} {self.url.text}|{batch}"

    def cache_credentials(self) -> str:
        """The secret headers and parameters and the authorization: two tenants' answers never
        meet in a shared cache."""
        secrets = [repr(v.reveal()) for v in self._secret_headers.values()]
        secrets += [repr(v.reveal()) for _, v in self._secret_params]
        auth = self._authorization
        if auth is not None:
            secrets.append(repr(auth.reveal() if hasattr(auth, "reveal") else auth))
        return "|".join(secrets)

    @property
    def batching(self) -> bool:
        """Whether records go to the batch endpoint (``batch_url``) many at a time."""
        return self.batch_url is not None

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

    def _make_client(self) -> Transport:
        return make_transport(
            self.method,
            self.max_connections,
            self.request_timeout,
            self.client_options,
            self.batch_url or self.url.text,
        )

    async def _close_client(self, client: Transport) -> None:
        await client.aclose()

    # ------------------------------------------------------------------ requests

    def describe_call(self, record: Any) -> str:
        """What this lookup asks for ``record``, for its errors: the method and URL, secrets
        redacted (a batching lookup: the key and the batch URL)."""
        if self.batching:
            assert self.key is not None
            return self._redactor.redact(f"key {self.key.render(record)!r} by POST {self.batch_url}")
        return self._redactor.redact(f"{self.method} {redact_url(self.url.render(record))}")

    def request_key(self, record: Any) -> Hashable:
        if self.batching:
            assert self.key is not None
            return self.key.render(record)
        url = self.url.render(record)
        if not (self.params or self.headers or self.json_body is not None):
            return url
        params = tuple((k, t.render(record)) for k, t in self.params.items()) or None
        headers = tuple((k, t.render(record)) for k, t in self.headers.items()) or None
        body = None
        if self.json_body is not None:
            body = json.dumps(_render_json(self.json_body, record, self._json_templates), sort_keys=True)
        return (url, params, headers, body)

    def request_keys(self, records: list[Any]) -> list[Any]:
        if self.batching and self.key is not None:
            return self.key.render_many(records)
        return [self.request_key(record) for record in records]

    async def fetch(self, key: Hashable) -> Any:
        if isinstance(key, tuple):
            url, params, headers, body = key
        else:
            url, params, headers, body = key, None, None, None
        answer = await self._request(self.method, url, key, params=params, headers=headers, data=body)
        return _decoded(self, answer.status, answer.headers, answer.body, key)

    async def fetch_many(self, keys: list[Hashable]) -> list[Any]:
        assert self.batch_url is not None
        body = self.batch_body(keys) if self.batch_body else keys
        answer = await self._request("POST", self.batch_url, keys, data=json.dumps(body))
        status, headers, payload = answer.status, answer.headers, answer.body
        if status == 404:  # a batch endpoint that is not there is not a miss of every key
            raise BadResponseError(
                "the batch endpoint answered 404 (check batch_url)",
                lookup_key=keys[:5],
                service=self.batch_url,
                status=status,
            )
        answer = _decoded(self, status, headers, payload, keys)
        if answer is None:
            return [None] * len(keys)
        if self.batch_response == "list":
            if not isinstance(answer, list) or len(answer) != len(keys):
                raise BadResponseError(
                    f"batch answer should be a list of {len(keys)} items",
                    lookup_key=keys[:5],
                    service=self.batch_url,
                    status=status,
                    body=self._body(payload),
                )
            return answer
        if not isinstance(answer, Mapping):
            raise BadResponseError(
                "batch answer should be a JSON object from key to result",
                lookup_key=keys[:5],
                service=self.batch_url,
                status=status,
                body=self._body(payload),
            )
        return [answer.get(str(k)) for k in keys]

    def _request(
        self, method: str, url: str, key: Any, *, params: Any = None, headers: Any = None, data: Any = None
    ) -> Awaitable[Answer]:
        """The answer to one request, to await (the client's call itself: no coroutine of its
        own in between, on every lookup's path)."""
        sent: dict[str, str] | None = None
        if headers or data is not None or self._secret_headers or self._authorization is not None:
            sent = dict(headers) if headers else {}
            sent.update((k, v.reveal()) for k, v in self._secret_headers.items())
            if self._authorization is not None:
                sent["Authorization"] = self._authorization.reveal()
            if data is not None:
                sent.setdefault("Content-Type", "application/json")
        query = None
        if params or self._secret_params:
            query = list(params) if params else []
            query += [(k, v.reveal()) for k, v in self._secret_params]
        return send(
            self.client(),
            method,
            url,
            key=key,
            params=query,
            headers=sent,
            data=data,
            redactor=self._redactor,
            request_timeout=self.request_timeout,
            service=url,
        )

    def _body(self, payload: Any) -> str | None:
        """What an error may show of an answer: at most ``error_body_chars``, secrets redacted."""
        if not self.error_body_chars or payload is None:
            return None
        return self._redactor.redact(snippet(payload, self.error_body_chars))


def _decoded(lookup: HttpLookup, status: int, headers: Mapping[str, str], payload: bytes, key: Any) -> Any:
    """The answer a status and body mean: a miss, the JSON, or the error to raise."""
    url = lookup.service_name
    if status in lookup.miss_statuses:
        return None
    if 200 <= status < 300:
        if not payload or (payload[:1].isspace() and not payload.strip()):
            raise BadResponseError(
                f"empty answer; a miss is status {' or '.join(map(str, lookup.miss_statuses))}",
                lookup_key=key,
                service=url,
                status=status,
            )
        try:
            return loads(payload)  # JSON null: the service says there is nothing: a miss
        except ValueError as exc:
            raise BadResponseError(
                f"answer is not JSON ({exc})",
                lookup_key=key,
                service=url,
                status=status,
                body=lookup._body(payload),
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
            f"server error {status}" + (f": {body}" if (body := lookup._body(payload)) else ""),
            lookup_key=key,
            service=url,
            status=status,
            retry_after=_retry_after(headers.get("Retry-After")),
        )
    # refused credentials say which options carry them (the error never shows the secret)
    hint = ""
    if status in (401, 403):
        hint = " (check the credentials: bearer_token_env=, bearer_token=, headers=)"
    raise BadResponseError(
        "request rejected" + hint, lookup_key=key, service=url, status=status, body=lookup._body(payload)
    )


def _key_template(key: str | None, url: Template, batching: bool, batch_response: str) -> Template | None:
    """What is looked up (default: the URL's one field); a batch endpoint needs it."""
    if batch_response not in ("map", "list"):
        raise LookupOptionError(
            "batch_response", f"batch_response={batch_response!r}; allowed: 'map', 'list'"
        )
    if key is None and len(url.fields) == 1:
        key = "{" + url.fields[0] + "}"
    if batching and key is None:
        raise LookupOptionError(
            "key", "a batch endpoint needs key= (a template of what is looked up, e.g. '{user_id}')"
        )
    return Template(key) if key is not None else None


def _check_client(request_timeout: float, max_connections: int) -> None:
    if request_timeout <= 0:
        raise LookupOptionError("request_timeout", f"request_timeout={request_timeout}; allowed: seconds > 0")
    if max_connections < 1:
        raise LookupOptionError(
            "max_connections", f"max_connections={max_connections}; allowed: an integer >= 1"
        )
    http_client_setting()  # a wrong KAW_HTTP fails here, on the driver, not in a worker


def _credentials(
    bearer_token: str | Secret | None,
    bearer_token_env: str | None,
    basic_auth: tuple[str, str | Secret] | None,
    basic_auth_env: tuple[str, str] | None,
    userinfo: tuple[str, str] | None,
) -> tuple[Secret | None, tuple[str, Secret] | None]:
    """The bearer token and the basic-auth pair, each from wherever it was given."""
    if bearer_token_env is not None:
        bearer_token = Secret.from_env(bearer_token_env, "bearer_token_env")
    if basic_auth_env is not None:
        basic_auth = (
            Secret.from_env(basic_auth_env[0], "basic_auth_env").reveal(),
            Secret.from_env(basic_auth_env[1], "basic_auth_env"),
        )
    if userinfo is not None:
        basic_auth = userinfo
    basic = None
    if basic_auth is not None:
        password = _secret(basic_auth[1])
        assert password is not None
        basic = (basic_auth[0], password)
    return _secret(bearer_token), basic

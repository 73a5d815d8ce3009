"""HttpWrite: PUT, PATCH, POST or DELETE from a record, with the record's version in headers a
service fences by.

What is sent with each write (besides the method, the URL template and the JSON body of the
record's ``fields``):

- ``X-Record-Version``: the record's version as a string whose byte order is the column's
  order (:mod:`.versions`: ``[0-9a-z]`` only);
- ``Idempotency-Key``: ``<resource>@<version>``, the same for every re-run of that write;
- ``X-Record-Resource``: the resource, when ``resource=`` names it (a write to a collection
  URL, ``POST /events``, whose URL is the same for every record).

The resource is the rendered URL, or ``resource=`` (a template over the record's fields) for a
URL that names no field. A fenced write to a URL that names no field, without ``resource=``,
is refused when made: every record would be versioned as one resource. An unfenced write
(``at_least_once=True``, no version) may post every record to one URL.

What the service must do for the effect to be once per resource and version: keep, per
resource, the version of the last write it applied; apply a write only when its
``X-Record-Version`` is greater (plain byte comparison), storing it with the change in one
step; otherwise answer ``412 Precondition Failed`` (or ``409``) without a change, which the
write counts as refused as stale (no error). The refusal may name the version the service
holds for the resource, in ``X-Record-Version`` (or the ``Idempotency-Key`` of the write it
applied): a write whose earlier attempt's answer was lost (the connection closed, a timeout, a
5xx; or the HTTP client resent a PUT or DELETE itself after its kept-alive connection closed
unanswered) and whose retry is refused naming its own version finds its own write, and counts it
applied, as :class:`~lookup.RedisWrite` does; refused naming a newer version, or naming none, it
is stale (as is a first attempt that finds its version held: a re-run's). A delete keeps its
version (a tombstone) for as long as an older write may still arrive. A service that dedupes
by ``Idempotency-Key`` alone gets once per version, but not the order: an older version
arriving after a newer one would still be applied.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any, NamedTuple

from .exceptions import BadResponseError, LookupOptionError, RateLimitedError, ServiceUnavailableError
from .http_client import make_transport, send
from .http_options import ClientOptions
from .http_wire import Transport
from .limits import Limits
from .secrets import Redactor, Secret, redact_url, split_userinfo
from .template import Template
from .writes import Write, to_json

__all__ = ["RESOURCE_HEADER", "VERSION_HEADER", "HttpWrite"]

VERSION_HEADER = "X-Record-Version"
RESOURCE_HEADER = "X-Record-Resource"
METHODS = ("PUT", "PATCH", "POST", "DELETE")

_UNSURE_MOST = 100_000


class HttpWrite(Write):
    """Write records to an HTTP service, each resource's writes fenced by the record's version.

    Parameters
    ----------
    url : str
        A template over the record's fields (``https://crm/contacts/{contact_id}``; values are
        URL-quoted); the resource a write's version is kept for. A URL naming no field (a
        collection, ``https://api/events``) takes unfenced writes, or fenced ones with
        ``resource=``.
    resource : str, optional
        A template over the record's fields naming the resource a fenced write's version is
        kept for, when the URL does not (``"{event_id}"``); sent as ``X-Record-Resource`` and in
        the ``Idempotency-Key``.
    method : {"PUT", "PATCH", "POST", "DELETE"}
        The method of an upsert (``DELETE`` always deletes).
    fields : list of str, optional
        The record fields sent as a JSON object (dates and times as ISO text, decimals as
        text, binary as base64); none for ``DELETE``.
    version : str, optional
        The column holding the record's version. Required unless ``at_least_once``.
    deleted : str, optional
        A boolean column: a record where it is true is sent as ``DELETE``.
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
        No version: nothing to fence by, so a re-run sends again and an older write may land
        after a newer one.
    headers : dict, optional
        Extra headers; a :class:`Secret` value is never shown.
    bearer_token, bearer_token_env : optional
        An ``Authorization: Bearer`` token, or the environment variable holding it.
    stale_statuses : tuple of int
        Answers that mean "refused as stale" (default 409 and 412).
    ca_file, client_cert, client_key, proxy, request_timeout, max_connections
        As :class:`HttpLookup`.
    limits : Limits, optional
        A rate, calls in flight, the breaker and a job-wide :class:`~lookup.Budget` (shared
        with the lookups of the same service when they name the same one), as for lookups.
    """

    service_name = "http"

    def __init__(
        self,
        url: str,
        *,
        method: str = "PUT",
        fields: Sequence[str] | None = None,
        version: str | None = None,
        deleted: str | None = None,
        at_least_once: bool = False,
        resource: str | None = None,
        result: str = "applied",
        coalesce: bool = False,
        outcome: str = "outcome",
        headers: Mapping[str, str | Secret] | None = None,
        bearer_token: str | Secret | None = None,
        bearer_token_env: str | None = None,
        stale_statuses: Sequence[int] = (409, 412),
        ca_file: str | None = None,
        client_cert: str | None = None,
        client_key: str | None = None,
        proxy: str | Secret | None = None,
        request_timeout: float = 10.0,
        max_connections: int = 100,
        limits: Limits | None = None,
    ) -> None:
        method = str(method).upper()
        if method not in METHODS:
            raise LookupOptionError("method", f"method={method!r}; allowed: {', '.join(METHODS)}")
        self.fields = tuple(fields or ())
        if method != "DELETE" and not self.fields:
            raise LookupOptionError("fields", f"method={method!r} needs fields=[...]: the record fields sent")
        url, userinfo = split_userinfo(url)
        if userinfo is not None:
            raise LookupOptionError("url", "credentials in the URL: give bearer_token= or headers= instead")
        if not request_timeout > 0:
            raise LookupOptionError("request_timeout", f"request_timeout={request_timeout!r}; allowed: > 0")
        self.url = Template(url, url_quote=True)
        self.resource = _resource(self.url, resource, version)
        self.method, self.deleted = method, deleted
        self.stale_statuses = tuple(stale_statuses)
        self.client_options = ClientOptions.of(ca_file, client_cert, client_key, proxy)
        self.request_timeout, self.max_connections = request_timeout, max_connections
        token = Secret.from_env(bearer_token_env, "bearer_token_env") if bearer_token_env else bearer_token
        secret = Secret(token) if isinstance(token, str) else token
        self._headers = {k: v for k, v in (headers or {}).items() if not isinstance(v, Secret)}
        self._secret_headers = {k: v for k, v in (headers or {}).items() if isinstance(v, Secret)}
        if secret is not None:
            self._secret_headers["Authorization"] = Secret(f"Bearer {secret.reveal()}")
        texts = [v.reveal() for v in self._secret_headers.values()] + self.client_options.secret_texts()
        if secret is not None:
            texts.append(secret.reveal())
        self._redactor = Redactor(texts)
        # writes whose answer was lost (they may have applied): a retry refused naming its own
        # version found its own write, not a re-run's
        self._unsure: set[tuple[Hashable, str]] = set()
        named = self.resource.fields if self.resource is not None else ()
        inputs = (*self.url.fields, *named, *self.fields, *((deleted,) if deleted else ()))
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
        named = f", resource={self.resource.text!r}" if self.resource is not None else ""
        return f"HttpWrite({self.method} {self.url.text!r}{named}, version={self.version!r})"

    def target(self, record: Any) -> Hashable:
        """The resource a write is for: the rendered URL, or ``resource=``'s rendering."""
        if self.resource is not None:
            return self.resource.render(record)
        return self.url.render(record)

    def describe_call(self, record: Any) -> str:
        call = f"{self._method_of(record)} {redact_url(self.url.render(record))}"
        if self.resource is not None:
            call += f" (resource {self.resource.render(record)!r})"
        return self._redactor.redact(call)

    def _make_client(self) -> Transport:
        return make_transport(
            self.method,
            self.max_connections,
            self.request_timeout,
            self.client_options,
            self.url.text,
            watch_resends=True,
        )

    async def _close_client(self, client: Transport) -> None:
        await client.aclose()

    def _maybe_applied(self, sent: _Sent | None) -> None:
        """Remember that a write may have applied without its caller knowing (its answer lost):
        its retry, refused naming its own version, then counts it applied."""
        if sent is not None:
            if len(self._unsure) >= _UNSURE_MOST:
                self._unsure.clear()  # bounded: an entry is only needed while its record retries
            self._unsure.add((sent.target, sent.version))

    def _settled(self, sent: _Sent | None) -> bool:
        """The write has its answer: whether an earlier attempt of it was unsure."""
        if sent is None:
            return False
        mark = (sent.target, sent.version)
        unsure = mark in self._unsure
        self._unsure.discard(mark)
        return unsure

    def _method_of(self, record: Any) -> str:
        if self.deleted is not None and record.get(self.deleted):
            return "DELETE"
        return self.method

    async def _apply(self, record: Any, target: Hashable, version: str | None) -> bool:
        method = self._method_of(record)
        headers = dict(self._headers)
        headers.update((k, v.reveal()) for k, v in self._secret_headers.items())
        sent = None if version is None else _Sent(target, version, f"{target}@{version}")
        if sent is not None:
            headers[VERSION_HEADER] = sent.version
            headers["Idempotency-Key"] = sent.key
        if self.resource is not None:
            headers[RESOURCE_HEADER] = str(target)
        data = None
        if method != "DELETE":
            data = to_json({name: record.get(name) for name in self.fields})
            headers["Content-Type"] = "application/json"
        url = self.url.render(record) if self.resource is not None else str(target)
        try:
            answer = await send(
                self.client(),
                method,
                url,
                key=url,
                params=None,
                headers=headers,
                data=data,
                redactor=self._redactor,
                request_timeout=self.request_timeout,
                service=redact_url(url),
                action="write",
            )
        except BaseException:  # no answer (closed, reset, a timeout): the write may have applied
            self._maybe_applied(sent)
            raise
        if answer.resent:  # the client's own resend: its first sending may have applied
            self._maybe_applied(sent)
        return self._outcome(method, url, answer.status, answer.headers, sent)

    def _outcome(
        self, method: str, url: str, status: int, headers: Mapping[str, str], sent: _Sent | None = None
    ) -> bool:
        if 200 <= status < 300 or (method == "DELETE" and status in (404, 410)):  # gone is gone
            self._settled(sent)
            return True
        if status in self.stale_statuses:
            return self._settled(sent) and _names(headers, sent)
        if status >= 500:  # it may have applied before failing
            self._maybe_applied(sent)
        where = self._redactor.redact(redact_url(url))
        retry_after = _seconds(headers.get("Retry-After"))
        if status == 429:
            raise RateLimitedError(
                "rate limited (429)",
                lookup_key=where,
                service="http",
                retry_after=retry_after,
                action="write",
            )
        if status >= 500:
            raise ServiceUnavailableError(
                f"server error {status}",
                lookup_key=where,
                service="http",
                status=status,
                retry_after=retry_after,
                action="write",
            )
        raise BadResponseError(
            "write rejected", lookup_key=where, service="http", status=status, action="write"
        )


class _Sent(NamedTuple):
    """What a fenced write sent: its resource, version and ``Idempotency-Key``."""

    target: Hashable
    version: str
    key: str


def _names(headers: Mapping[str, str], sent: _Sent | None) -> bool:
    """Whether a refusal names the very version the write sent as the one held."""
    if sent is None:
        return False
    return headers.get(VERSION_HEADER) == sent.version or headers.get("Idempotency-Key") == sent.key


def _resource(url: Template, resource: str | None, version: str | None) -> Template | None:
    """``resource=`` as a template; a fenced write needs the URL or it to name a field."""
    if resource is not None:
        if not isinstance(resource, str):
            raise LookupOptionError("resource", f"resource={resource!r}; allowed: a template like '{{id}}'")
        return Template(resource).with_fields("resource")
    if version is not None and not url.fields:
        raise LookupOptionError(
            "url",
            f"url={redact_url(url.text)!r} names no field, so a fenced write would keep one version "
            "for every record; name the record's resource with resource='{id}' (the collection "
            "URL stays as it is), or write unfenced with at_least_once=True and no version",
        )
    return None


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None

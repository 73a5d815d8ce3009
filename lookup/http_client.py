"""The wire side of :class:`HttpLookup`: which client, redirects, and error conversion.

Redirects are followed here, not by aiohttp, so that credentials never travel to another
origin: when a redirect leaves the origin of the request (scheme, host or port differ), the
``Authorization``, ``Proxy-Authorization`` and ``Cookie`` headers and every header the lookup
was given are dropped for that hop and every later one, as requests and httpx drop
credentials. URLs are sent as rendered (already percent-encoded), so a record value can never
become a dot segment that climbs the path.
"""

from __future__ import annotations

import functools
import os
import re
import ssl
import sys
import urllib.parse
from typing import Any

import yarl

from .exceptions import (
    AccessDeniedError,
    BadResponseError,
    CertificateError,
    LookupOptionError,
    LookupTimeoutError,
    RequestError,
    ServiceUnavailableError,
)
from .http_lean import WireError
from .http_options import ClientOptions
from .http_wire import Answer, Transport
from .limits import heard
from .secrets import Redactor, redact_url

__all__ = [
    "HTTP_CLIENTS",
    "MAX_REDIRECTS",
    "Answer",
    "http_client_setting",
    "make_transport",
    "send",
]

MAX_REDIRECTS = 10
HTTP_CLIENTS = ("auto", "httptools", "aiohttp")
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_KEPT_ACROSS_ORIGINS = frozenset({"content-type", "accept"})
# characters left as they are when a rendered URL is re-quoted (reserved ones, and % escapes)
_URL_SAFE = "/:@!$&'()*+,;=?#[]%~"
# a character that quote() with _URL_SAFE would change (anything but ASCII letters, digits,
# "_.-~" and _URL_SAFE)
_NEEDS_QUOTING = re.compile(r"[^A-Za-z0-9_.\-~/:@!$&'()*+,;=?#\[\]%]")


def http_client_setting() -> str:
    """``KAW_HTTP``: ``auto`` or ``httptools`` (the lean client, on llhttp), or ``aiohttp``."""
    value = os.environ.get("KAW_HTTP", "auto").strip().lower() or "auto"
    if value not in HTTP_CLIENTS:
        raise LookupOptionError("KAW_HTTP", f"KAW_HTTP={value!r}; allowed: {', '.join(HTTP_CLIENTS)}")
    return value


def make_transport(
    method: str,
    max_connections: int,
    request_timeout: float,
    options: ClientOptions,
    url: str,
    *,
    watch_resends: bool = False,
) -> Transport:
    """The client of the running loop for a lookup of ``url``: the lean one (:mod:`.http_lean`,
    on llhttp through httptools); aiohttp for HEAD (llhttp cannot frame a HEAD answer), through
    a proxy (explicit or from the environment: the lean client speaks to none), or when
    ``KAW_HTTP=aiohttp``. ``watch_resends``: aiohttp's answers say whether it resent the request
    itself (a trace on every request; the lean client's always say)."""
    setting = http_client_setting()
    proxy = options.proxy_for(url)
    if setting == "aiohttp" or method == "HEAD" or proxy is not None:
        from .http_aiohttp import AiohttpTransport

        return AiohttpTransport(max_connections, request_timeout, options, watch_resends=watch_resends)
    from .http_lean import LeanTransport

    return LeanTransport(max_connections, request_timeout, options)


# URLs kept parsed per worker process: a key's URL repeats with each of its records, and
# parsing one (yarl) costs 3-4 us, several percent of a lean request's CPU
WIRE_URLS = 1024


@functools.lru_cache(maxsize=WIRE_URLS)
def wire_url(url: str) -> yarl.URL:
    """The URL as it goes out: an internationalised host name as IDNA (``xn--...``), non-ASCII
    and spaces elsewhere quoted, nothing decoded or normalised. Cached (the last
    :data:`WIRE_URLS` used): a ``yarl.URL`` is immutable, so callers share it."""
    if _NEEDS_QUOTING.search(url) is not None:  # most URLs need none: skip the quoting
        url = urllib.parse.quote(_idna_host(url), safe=_URL_SAFE)
    return yarl.URL(url, encoded=True)


def _idna_host(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname
    if not host or host.isascii():
        return url
    ascii_host = yarl.URL.build(scheme="http", host=host).raw_host or host  # IDNA, as yarl does it
    netloc = re.sub(re.escape(host), ascii_host, parts.netloc, count=1, flags=re.IGNORECASE)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def _next_hop(method: str, status: int, data: Any) -> tuple[str, Any]:
    if status == 303 or (status in (301, 302) and method == "POST"):
        return ("HEAD" if method == "HEAD" else "GET"), None  # what browsers, requests and httpx do
    return method, data


async def send(
    transport: Transport,
    method: str,
    url: str,
    *,
    key: Any,
    params: list[tuple[str, str]] | None,
    headers: dict[str, str] | None,
    data: Any,
    redactor: Redactor,
    request_timeout: float,
    service: str,
    action: str = "lookup",
) -> Answer:
    """One request, redirects followed; lookup errors (never holding a secret) on failure:
    ``action`` says whether it is a lookup's or a write's."""
    said = {"lookup_key": key, "service": service, "action": action}
    try:
        target = wire_url(url)
        first = await transport.request(method, target, params, headers, data)
        answer: Answer | None = first
        if first.status in _REDIRECTS and first.headers.get("Location"):
            answer = await _follow(transport, method, target, params, headers, data, first)
    except TimeoutError as exc:  # aiohttp's ServerTimeoutError and the total timeout
        error: Exception = LookupTimeoutError(f"no answer within {request_timeout:g} s", **said)
        raise error from _cause(error, exc, redactor)
    except _aiohttp_errors("ClientConnectorCertificateError", "ClientSSLError", also=(ssl.SSLError,)) as exc:
        message = f"TLS certificate not trusted ({type(exc).__name__}: {exc}); give ca_file= for a private CA"
        error = CertificateError(redactor.redact(message), **said)
        raise error from _cause(error, exc, redactor)
    except _aiohttp_errors("ClientHttpProxyError") as exc:  # the proxy answered CONNECT with an error
        status, message = getattr(exc, "status", None), getattr(exc, "message", "")
        error = _proxy_refused(status, **said) or ServiceUnavailableError(
            redactor.redact(f"the proxy answered {status}: {message}"), **said
        )
        raise error from _cause(error, exc, redactor)
    except _aiohttp_errors("ClientError", also=(OSError,)) as exc:  # OSError: refused, reset, WireError
        error = ServiceUnavailableError(redactor.redact(_what(exc)), **said)
        raise error from _cause(error, exc, redactor)
    except ValueError as exc:  # a URL that cannot be sent (a bad port, a bad host)
        shown = redactor.redact(redact_url(url))
        error = RequestError(f"{shown!r} is not a URL that can be asked ({exc})", **said)
        raise error from _cause(error, exc, redactor)
    if answer is None:
        raise BadResponseError(f"more than {MAX_REDIRECTS} redirects", **said)
    refused = _proxy_refused(answer.status, **said) if _from_proxy(answer) else None
    if refused is not None:
        raise refused
    heard(answer.headers)  # the quota and cost it states, for the job's budget
    return answer


async def _follow(
    transport: Transport, method: str, target: yarl.URL, params: Any, headers: Any, data: Any, answer: Answer
) -> Answer | None:
    """The answer once no redirect follows ``answer`` (the first request's), or None after
    :data:`MAX_REDIRECTS` of them."""
    origin = target.origin()
    for _ in range(MAX_REDIRECTS):
        location = answer.headers.get("Location") if answer.status in _REDIRECTS else None
        if not location:
            return answer
        target = target.join(yarl.URL(location))
        if target.origin() != origin:
            kept = (headers or {}).items()
            headers = {k: v for k, v in kept if k.lower() in _KEPT_ACROSS_ORIGINS}
            origin = target.origin()  # once dropped, credentials stay dropped
        method, data = _next_hop(method, answer.status, data)
        params = None  # the Location carries its own query
        answer = await transport.request(method, target, params, headers, data)
    location = answer.headers.get("Location") if answer.status in _REDIRECTS else None
    return None if location else answer


def _aiohttp_errors(
    *names: str, also: tuple[type[BaseException], ...] = ()
) -> tuple[type[BaseException], ...]:
    """``also`` and aiohttp's exception classes of these names; none of aiohttp's when this
    process never imported it (then none of its errors can be raised). aiohttp is imported only
    where its client is used (:mod:`.http_aiohttp`): the lean client's workers never pay for it."""
    aiohttp = sys.modules.get("aiohttp")
    return also if aiohttp is None else also + tuple(getattr(aiohttp, name) for name in names)


def _from_proxy(answer: Answer) -> bool:
    """An answer a proxy made, refusing its credentials: 407, or a 401 asking for the proxy's."""
    return answer.status == 407 or (answer.status == 401 and "Proxy-Authenticate" in answer.headers)


def _proxy_refused(status: int | None, **said: Any) -> AccessDeniedError | None:
    if status not in (401, 407):
        return None
    return AccessDeniedError(
        f"the proxy refused the credentials ({status}); check the user and password of proxy=", **said
    )


def _what(exc: BaseException) -> str:
    """What went wrong, for a message: the lean client's own errors by their text alone (no
    internal class named), any other by its class and text."""
    return str(exc) if isinstance(exc, WireError) else f"{type(exc).__name__}: {exc}"


def _cause(error: Exception, cause: BaseException, redactor: Redactor) -> BaseException | None:
    """What to chain ``error`` to: ``cause``, or nothing when the cause's text holds a secret
    (a traceback prints the whole chain)."""
    if redactor and redactor.holds_secret(f"{cause!r} {cause}"):
        if sys.version_info >= (3, 11):  # notes are 3.11+; the chain is cut either way
            error.add_note("the client's own error is withheld: its text holds a secret")
        return None
    return cause

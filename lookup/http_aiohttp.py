"""The aiohttp client of :class:`~lookup.HttpLookup` and :class:`~lookup.HttpWrite`: for HEAD,
through a proxy, or when ``KAW_HTTP=aiohttp`` (:func:`lookup.http_client.make_transport` says
when). A module of its own so that aiohttp is imported only by a process that uses it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
import yarl

from .http_options import ClientOptions, tls_context
from .http_wire import Answer
from .parts import suspend

__all__ = ["AiohttpTransport", "make_session"]


class AiohttpTransport:
    """One request through an aiohttp session (redirects not followed: the caller does),
    through the proxy that :meth:`ClientOptions.proxy_for` names for its origin: an explicit
    ``proxy=``, else the environment's (``NO_PROXY`` honoured).

    The proxy is looked up once per origin here rather than by aiohttp's ``trust_env``, which
    looks it up (and reads ``~/.netrc``) in a thread for every request: 2.5x the CPU per
    request (``./run bench http_clients``). ``~/.netrc`` is not read: credentials go only
    where the lookup's options send them."""

    def __init__(
        self,
        max_connections: int,
        request_timeout: float,
        options: ClientOptions,
        *,
        watch_resends: bool = False,
    ) -> None:
        # aiohttp resends an idempotent request itself when its kept-alive connection closes
        # before the answer; a trace counting the sendings tells (a write's outcome needs it)
        self._watch_resends = watch_resends
        traces = [_sendings_counted()] if watch_resends else []
        self.session = make_session(max_connections, request_timeout, options, traces)
        self._options = options
        self._proxies: dict[tuple[str, str | None, int | None], str | None] = {}

    def _proxy_for(self, url: yarl.URL) -> str | None:
        origin = (url.scheme, url.host, url.port)
        if origin not in self._proxies:
            proxy = self._options.proxy_for(str(url.origin()))
            self._proxies[origin] = proxy.reveal() if proxy is not None else None
        return self._proxies[origin]

    async def request(
        self,
        method: str,
        url: yarl.URL,
        params: list[tuple[str, str]] | None,
        headers: Mapping[str, str] | None,
        data: Any,
    ) -> Answer:
        await suspend()  # may be started outside a task: aiohttp's timeouts need the caller's
        proxy = self._proxy_for(url)
        sendings = {"count": 0} if self._watch_resends else None
        async with self.session.request(
            method,
            url,
            params=params,
            headers=headers or None,
            data=data,
            allow_redirects=False,
            proxy=proxy,
            trace_request_ctx=sendings,
        ) as response:
            resent = sendings is not None and sendings["count"] > 1
            return Answer(response.status, response.headers, await response.read(), resent)

    async def aclose(self) -> None:
        await self.session.close()


def _sendings_counted() -> aiohttp.TraceConfig:
    """A trace that counts a request's sendings in the dict given as its ``trace_request_ctx``."""

    async def sent(_session: Any, context: Any, _params: Any) -> None:
        if isinstance(context.trace_request_ctx, dict):
            context.trace_request_ctx["count"] += 1

    trace = aiohttp.TraceConfig()
    trace.on_request_headers_sent.append(sent)
    return trace


def make_session(
    max_connections: int,
    request_timeout: float,
    options: ClientOptions,
    traces: Sequence[aiohttp.TraceConfig] = (),
) -> aiohttp.ClientSession:
    """A session of the running loop: TLS verified (the system's CAs plus ``ca_file``, the
    client certificate for mTLS), no cookie jar; proxies are the transport's to give."""
    # aiohttp's default of 100 connections would silently cap concurrency
    connector = aiohttp.TCPConnector(
        limit=max_connections, limit_per_host=0, ttl_dns_cache=300, ssl=tls_context(options)
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=request_timeout),
        raise_for_status=False,
        trust_env=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        trace_configs=list(traces) or None,
    )

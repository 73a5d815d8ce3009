"""How an :class:`HttpLookup` reaches its service: TLS trust and client certificate, and the
proxy. One frozen value, checked when the lookup is made, pickled to the workers (paths and a
secret, never a live context).

- TLS is always verified against the system's CA store; ``ca_file`` *adds* a bundle to it (a
  private CA), never replaces it. ``client_cert`` (and ``client_key`` when the key is a file of
  its own) is presented to a server that asks for one (mTLS).
- A proxy: ``proxy=`` given, or ``HTTP_PROXY`` / ``HTTPS_PROXY`` / ``ALL_PROXY`` in the worker's
  environment unless ``NO_PROXY`` names the host (the rules of Python's ``urllib.request``,
  which requests and aiohttp follow too). A proxied lookup goes through aiohttp (``CONNECT`` for
  https); the lean client does not speak to proxies, and is never used for one.
"""

from __future__ import annotations

import ssl
import urllib.parse
import urllib.request
from dataclasses import dataclass

from .exceptions import LookupOptionError
from .secrets import Secret

__all__ = ["ClientOptions", "env_proxy_for", "tls_context"]


@dataclass(frozen=True)
class ClientOptions:
    ca_file: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    proxy: Secret | None = None  # its URL may hold credentials

    def __post_init__(self) -> None:
        for name in ("ca_file", "client_cert", "client_key"):
            path = getattr(self, name)
            if path is not None and not isinstance(path, str):
                raise LookupOptionError(name, f"{name}={path!r}; allowed: a file path (str) or None")
        if self.client_key is not None and self.client_cert is None:
            raise LookupOptionError(
                "client_key", "client_key= without client_cert=: give the certificate too"
            )
        if self.proxy is not None:
            scheme = urllib.parse.urlsplit(self.proxy.reveal()).scheme
            if scheme not in ("http", "https"):
                raise LookupOptionError("proxy", "proxy=: allowed: an http:// or https:// proxy URL")

    @classmethod
    def of(
        cls, ca_file: str | None, client_cert: str | None, client_key: str | None, proxy: str | Secret | None
    ) -> ClientOptions:
        """The options as :class:`HttpLookup` takes them (a proxy URL given as a plain str)."""
        return cls(ca_file, client_cert, client_key, Secret(proxy) if isinstance(proxy, str) else proxy)

    def secret_texts(self) -> list[str]:
        """What of the options a message must never show: the proxy URL and its password."""
        if self.proxy is None:
            return []
        proxy = self.proxy.reveal()
        password = urllib.parse.urlsplit(proxy).password
        return [proxy, *([password] if password else [])]

    def proxy_for(self, url: str) -> Secret | None:
        """The proxy a request to ``url`` goes through, if any (explicit, then environment)."""
        if self.proxy is not None:
            return self.proxy
        found = env_proxy_for(url)
        return Secret(found) if found is not None else None


def env_proxy_for(url: str) -> str | None:
    """The environment's proxy for ``url`` (``HTTP_PROXY``/``HTTPS_PROXY``/``ALL_PROXY``,
    lower or upper case), or None when there is none or ``NO_PROXY`` names its host."""
    parts = urllib.parse.urlsplit(url)
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if not proxy or not parts.hostname:
        return None
    host = parts.hostname if parts.port is None else f"{parts.hostname}:{parts.port}"
    if urllib.request.proxy_bypass(host):  # NO_PROXY (on POSIX, from the environment only)
        return None
    return proxy


def tls_context(options: ClientOptions) -> ssl.SSLContext:
    """A verifying context: the system's CAs plus ``ca_file``, and the client certificate."""
    context = ssl.create_default_context()
    if options.ca_file is not None:
        context.load_verify_locations(cafile=options.ca_file)
    if options.client_cert is not None:
        context.load_cert_chain(options.client_cert, options.client_key)
    return context

"""Errors of the lookups. aiohttp and redis errors are converted here, at the boundary.

::

    keyed_async_wait.KeyedAsyncWaitError      base of every error of this library
    └── LookupServiceError                    base of the lookups'; .lookup_key, .retryable
        ├── LookupTimeoutError (TimeoutError)      the service did not answer in time      retryable
        ├── ServiceUnavailableError               refused, reset, 5xx, 503                 retryable
        │   ├── RateLimitedError                  429; .retry_after seconds                retryable
        │   └── CircuitOpenError                  not called: the circuit is open          not retryable
        │                                         (.retry_after: until its probe)
        ├── BadResponseError                      other 4xx, bad JSON, wrong fields;       not retryable
        │   │                                     .status and a snippet of the body
        │   └── WrongTypeError                    a Redis value of the wrong type          not retryable
        ├── CertificateError                      TLS: the service's certificate is not    not retryable
        │                                         trusted (give ca_file=)
        ├── AccessDeniedError                     the service (or a proxy) refused the     not retryable
        │                                         credentials: a wrong password, an ACL
        │                                         user without the command, a proxy's 407
        ├── RequestError                          a request that cannot be made: a URL a   not retryable
        │                                         template rendered is not a valid URL
        ├── TemplateError (KeyError)              the record lacks a field a template names not retryable
        └── VersionError                          a write's version is NULL or has no order   not retryable

    keyed_async_wait.ConfigError (ValueError)
    └── LookupOptionError                     a bad option of a lookup, when it is made; names it

A message says what was asked: ``lookup of KEY from SERVICE: ...``, or ``write of KEY to
SERVICE: ...`` for a write. No message holds a secret (a token, a password, a secret header or
parameter): the lookups redact them before an error is made, and chain the client's own error
only when it holds none.

``retryable`` is what the operator's default retry predicate reads; ``retry_after`` is what its
retry strategy waits at least.
"""

from __future__ import annotations

from typing import Any

from keyed_async_wait.core.exceptions import ConfigError, KeyedAsyncWaitError

__all__ = [
    "AccessDeniedError",
    "BadResponseError",
    "CertificateError",
    "CircuitOpenError",
    "LookupOptionError",
    "LookupServiceError",
    "LookupTimeoutError",
    "RateLimitedError",
    "RequestError",
    "ServiceUnavailableError",
    "TemplateError",
    "VersionError",
    "WrongTypeError",
]


BODY_LIMIT = 200  # characters of an answer an error shows, by default


def snippet(body: Any, limit: int = BODY_LIMIT) -> str:
    text = body.decode("utf-8", "replace") if isinstance(body, (bytes, bytearray)) else str(body)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: max(0, limit - 3)] + "..."


class LookupServiceError(KeyedAsyncWaitError):
    """A lookup (or a write) failed. ``lookup_key`` says what was looked up or written (not the
    operator's key); ``action`` whether it was a ``"lookup"`` or a ``"write"``."""

    retryable = True

    def __init__(
        self, message: str, *, lookup_key: Any = None, service: str = "", action: str = "lookup"
    ) -> None:
        self.lookup_key = lookup_key
        self.service = service
        self.action = action
        where = (" to " if action == "write" else " from ") + service if service else ""
        super().__init__(f"{action} of {lookup_key!r}{where}: {message}")


class LookupTimeoutError(LookupServiceError, TimeoutError):
    """The service did not answer within the request timeout."""


class ServiceUnavailableError(LookupServiceError):
    """Connection refused or reset, or a 5xx answer."""

    def __init__(
        self,
        message: str,
        *,
        lookup_key: Any = None,
        service: str = "",
        status: int | None = None,
        retry_after: float | None = None,
        action: str = "lookup",
    ) -> None:
        self.status = status
        self.retry_after = retry_after
        super().__init__(message, lookup_key=lookup_key, service=service, action=action)


class RateLimitedError(ServiceUnavailableError):
    """429 Too Many Requests; ``retry_after`` says when to come back, if the service said."""


class CircuitOpenError(ServiceUnavailableError):
    """The lookup did not call: after sustained failures its circuit is open for a cool-off.
    Not retryable (a retry now would only fail again): with ``on_error="defer"`` the record is
    parked for later instead of burning its attempts."""

    retryable = False


class BadResponseError(LookupServiceError):
    """An answer that will not get better by asking again."""

    retryable = False

    def __init__(
        self,
        message: str,
        *,
        lookup_key: Any = None,
        service: str = "",
        status: int | None = None,
        body: Any = None,
        body_limit: int = BODY_LIMIT,
        action: str = "lookup",
    ) -> None:
        self.status = status
        self.body_snippet = snippet(body, body_limit) if body is not None and body_limit > 0 else None
        detail = f" (status {status})" if status is not None else ""
        if self.body_snippet:
            detail += f"; body: {self.body_snippet}"
        super().__init__(message + detail, lookup_key=lookup_key, service=service, action=action)


class WrongTypeError(BadResponseError):
    """A Redis key holds a value of another type than the command expects."""


class CertificateError(LookupServiceError):
    """The service's TLS certificate is not trusted: asking again will not help."""

    retryable = False


class AccessDeniedError(LookupServiceError):
    """The service, or a proxy on the way, refused the credentials (a wrong password, an ACL user
    not allowed the command, a proxy's 407): asking again will not help."""

    retryable = False


class RequestError(LookupServiceError):
    """A request that cannot be made (a URL a template rendered for the record is not valid):
    asking again will not help."""

    retryable = False


class TemplateError(LookupServiceError, KeyError):
    """A template names a field the record does not have (or has as None)."""

    retryable = False

    def __init__(self, template: str, field: str, record: Any) -> None:
        self.template = template
        self.field = field
        available = sorted(record) if isinstance(record, dict) else type(record).__name__
        LookupServiceError.__init__(
            self,
            f"template {template!r} needs field {field!r}, which the record lacks or has as None "
            f"(record fields: {available})",
            lookup_key=None,
        )

    def __str__(self) -> str:
        return str(self.args[0])


class LookupOptionError(ConfigError):
    """A lookup's option is not allowed: raised when the lookup is made (on the driver), its
    message naming the option and what is allowed. A ``ConfigError`` (and a ``ValueError``), as
    every bad option of this library is."""

    def __init__(self, name: str, message: str) -> None:
        self.name, self.value, self.allowed = name, None, message
        KeyedAsyncWaitError.__init__(self, message)


class VersionError(LookupServiceError):
    """A write's version is NULL or of a kind without an order here (names the column and
    what is allowed); not retryable."""

    retryable = False

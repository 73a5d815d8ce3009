"""Errors of the lookups. aiohttp and redis errors are converted here, at the boundary.

::

    LookupServiceError                 base; .lookup_key, .retryable
    ├── LookupTimeoutError (TimeoutError)      the service did not answer in time      retryable
    ├── ServiceUnavailableError               refused, reset, 5xx, 503                 retryable
    │   └── RateLimitedError                  429; .retry_after seconds                retryable
    ├── BadResponseError                      other 4xx, bad JSON, wrong fields;       not retryable
    │   │                                     .status and a snippet of the body
    │   └── WrongTypeError                    a Redis value of the wrong type          not retryable
    └── TemplateError (KeyError)              the record lacks a field a template names not retryable

``retryable`` is what the operator's default retry predicate reads; ``retry_after`` is what its
retry strategy waits at least.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BadResponseError",
    "LookupServiceError",
    "LookupTimeoutError",
    "RateLimitedError",
    "ServiceUnavailableError",
    "TemplateError",
    "WrongTypeError",
]


def snippet(body: Any, limit: int = 200) -> str:
    text = body.decode("utf-8", "replace") if isinstance(body, (bytes, bytearray)) else str(body)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class LookupServiceError(Exception):
    """A lookup failed. ``lookup_key`` says what was looked up (not the operator's key)."""

    retryable = True

    def __init__(self, message: str, *, lookup_key: Any = None, service: str = "") -> None:
        self.lookup_key = lookup_key
        self.service = service
        where = f" from {service}" if service else ""
        super().__init__(f"lookup of {lookup_key!r}{where}: {message}")


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
    ) -> None:
        self.status = status
        self.retry_after = retry_after
        super().__init__(message, lookup_key=lookup_key, service=service)


class RateLimitedError(ServiceUnavailableError):
    """429 Too Many Requests; ``retry_after`` says when to come back, if the service said."""


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
    ) -> None:
        self.status = status
        self.body_snippet = snippet(body) if body is not None else None
        detail = f" (status {status})" if status is not None else ""
        if self.body_snippet:
            detail += f"; body: {self.body_snippet}"
        super().__init__(message + detail, lookup_key=lookup_key, service=service)


class WrongTypeError(BadResponseError):
    """A Redis key holds a value of another type than the command expects."""


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

"""redis-py's errors turned into lookup errors, at the boundary (the lookups' and the writes')."""

from __future__ import annotations

from typing import Any

from redis import exceptions as redis_errors

from .exceptions import BadResponseError, LookupTimeoutError, ServiceUnavailableError, WrongTypeError

__all__ = ["converted_errors", "response_error"]


def response_error(key: Any, exc: redis_errors.ResponseError) -> BadResponseError:
    message = str(exc)
    if message.startswith("WRONGTYPE"):
        return WrongTypeError(f"wrong type: {message}", lookup_key=key, service="redis")
    return BadResponseError(f"Redis error: {message}", lookup_key=key, service="redis")


class converted_errors:
    """Turns redis-py errors into lookup errors, at the boundary."""

    def __init__(self, key: Any) -> None:
        self.key = key

    def __enter__(self) -> None:
        return None

    def __exit__(self, typ: Any, exc: Any, tb: Any) -> None:
        if exc is None:
            return
        if isinstance(exc, redis_errors.TimeoutError):
            raise LookupTimeoutError(
                f"Redis did not answer: {exc}", lookup_key=self.key, service="redis"
            ) from exc
        if isinstance(exc, (redis_errors.ConnectionError, OSError)):
            raise ServiceUnavailableError(
                f"Redis unavailable: {type(exc).__name__}: {exc}", lookup_key=self.key, service="redis"
            ) from exc
        if isinstance(exc, redis_errors.ResponseError):
            raise response_error(self.key, exc) from exc

"""redis-py's errors turned into lookup errors, at the boundary (every Redis part's).

===========================================  ====================================  =========
redis-py raises                              becomes                               retried
===========================================  ====================================  =========
TimeoutError                                 LookupTimeoutError                    yes
AuthenticationError, NOPERM (an ACL user     AccessDeniedError, naming what was    no
not allowed the command or key, also         refused
inside a script)
ConnectionError on a TLS certificate (not    CertificateError (ca_file=, or        no
trusted, or the client's refused)            client_cert= and client_key=)
ConnectionError, OSError, READONLY (a        ServiceUnavailableError               yes
master that failed over), TRYAGAIN,
CLUSTERDOWN, MasterNotFoundError, a cluster
no node of which answers
WRONGTYPE                                    WrongTypeError                        no
any other error answer                       BadResponseError                      no
===========================================  ====================================  =========
"""

from __future__ import annotations

import re
import ssl
from typing import Any

from redis import exceptions as redis_errors

from .exceptions import (
    AccessDeniedError,
    BadResponseError,
    CertificateError,
    LookupServiceError,
    LookupTimeoutError,
    ServiceUnavailableError,
    WrongTypeError,
)

__all__ = ["converted", "converted_errors", "gate_error", "response_error"]

# answers that say "not now" (a failover, a reshard, a cluster that is healing): worth a retry
_TRANSIENT = ("READONLY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "LOADING")
# the same answers as redis-py parses them (its classes; the code word gone from the message),
# as a pipeline's answers hand them over
_TRANSIENT_ANSWERS = (redis_errors.ReadOnlyError, redis_errors.ClusterDownError, redis_errors.TryAgainError)


_ECHOED = re.compile(r",? with args beginning with:.*", re.S)


def transient(exc: BaseException) -> bool:
    """Whether Redis answered so while it changes (a failover, a reshard, a restart): worth
    asking again."""
    return isinstance(exc, _TRANSIENT_ANSWERS) or said(exc).startswith(_TRANSIENT)


def said(exc: BaseException) -> str:
    """What Redis (or redis-py) said, without the arguments an unknown command's answer echoes
    (``HELLO 3 AUTH user password`` on a server without HELLO would show the password)."""
    return _ECHOED.sub(" (its arguments not shown)", str(exc))


def response_error(key: Any, exc: redis_errors.ResponseError, action: str = "lookup") -> LookupServiceError:
    """One error answer of Redis (of a pipeline, a script) as a lookup error."""
    message = said(exc)
    if message.startswith("WRONGTYPE"):
        return WrongTypeError(f"wrong type: {message}", lookup_key=key, service="redis", action=action)
    denied = message.startswith("NOPERM") or _denied_in_script(message)
    if denied or isinstance(exc, redis_errors.NoPermissionError):
        return AccessDeniedError(
            f"the Redis user may not do this ({message}); grant it the command (see the Redis guide)",
            lookup_key=key,
            service="redis",
            action=action,
        )
    if transient(exc):
        return ServiceUnavailableError(
            f"Redis is not ready: {message}", lookup_key=key, service="redis", action=action
        )
    return BadResponseError(f"Redis error: {message}", lookup_key=key, service="redis", action=action)


# What an ACL refusal inside a script says (a write batch's script on a Redis Cluster names its
# keys as arguments, so Redis checks them command by command): Redis 6.2 and 7.0-7.0.x "The
# user executing the script can't ...", 7.2 and on "ACL failure in script: ..."
_SCRIPT_DENIALS = ("The user executing the script can't", "ACL failure in script")


def _denied_in_script(message: str) -> bool:
    return any(phrase in message for phrase in _SCRIPT_DENIALS)


def _certificate_problem(exc: BaseException) -> str | None:
    """What TLS refused, when a connection failed on a certificate (redis-py keeps the ssl
    error's text): ours not trusting the server's, or the server refusing ours."""
    seen: BaseException | None = exc
    while seen is not None:
        text = str(seen)
        if isinstance(seen, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in text:
            return "TLS certificate of Redis not trusted; give ca_file= for a private CA"
        if "ALERT" in text.upper() and isinstance(seen, ssl.SSLError):  # the server said no
            reason = text.split("]", 2)[1].strip() if text.count("]") >= 2 else text
            return (
                f"Redis refused the TLS handshake ({reason[:120]}): it may want a client "
                "certificate (give client_cert= and client_key= that its CA signed), or a TLS "
                "version it speaks"
            )
        seen = seen.__cause__ or seen.__context__
    return None


def converted(exc: BaseException, key: Any, action: str = "lookup") -> LookupServiceError | None:
    """The lookup error for a redis-py error (None for one that is not redis-py's or the socket's)."""
    if isinstance(exc, LookupServiceError):
        return exc
    if isinstance(exc, redis_errors.TimeoutError):
        return LookupTimeoutError(
            f"Redis did not answer: {said(exc)}", lookup_key=key, service="redis", action=action
        )
    if isinstance(exc, redis_errors.AuthenticationError):
        return AccessDeniedError(
            f"Redis refused the credentials ({type(exc).__name__}: {said(exc)}); check the user and the "
            "password (the URL's, or password_env's)",
            lookup_key=key,
            service="redis",
            action=action,
        )
    problem = _certificate_problem(exc) if isinstance(exc, (redis_errors.ConnectionError, OSError)) else None
    if problem is not None:
        return CertificateError(
            problem,
            lookup_key=key,
            service="redis",
            action=action,
        )
    if isinstance(exc, (redis_errors.ConnectionError, OSError)):
        return ServiceUnavailableError(
            f"Redis unavailable: {type(exc).__name__}: {said(exc)}",
            lookup_key=key,
            service="redis",
            action=action,
        )
    if isinstance(exc, redis_errors.ResponseError):
        return response_error(key, exc, action)
    if isinstance(exc, redis_errors.RedisClusterException):
        return _cluster_error(exc, key, action)
    return None


def _cluster_error(exc: redis_errors.RedisClusterException, key: Any, action: str) -> LookupServiceError:
    """A cluster client that could not start: its cause when it has one (an ACL user not
    allowed CLUSTER SLOTS reads as "Cluster mode is not enabled" in redis-py's words)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, redis_errors.ResponseError):
            return response_error(key, seen, action)
        seen = seen.__cause__ or seen.__context__
    return ServiceUnavailableError(
        f"Redis Cluster not reachable: {said(exc)}", lookup_key=key, service="redis", action=action
    )


class converted_errors:
    """Turns redis-py errors into lookup errors, at the boundary (``action``: "lookup" or "write")."""

    def __init__(self, key: Any, action: str = "lookup") -> None:
        self.key = key
        self.action = action

    def __enter__(self) -> None:
        return None

    def __exit__(self, typ: Any, exc: Any, tb: Any) -> None:
        if exc is None or isinstance(exc, LookupServiceError):
            return
        error = converted(exc, self.key, self.action)
        if error is not None:
            raise error from exc


def gate_error(exc: Exception, what: str, shown: str, lookup_key: Any, service: str) -> BaseException:
    """The error of a call that could not ask ``what`` (a budget, a job-wide rate, kept in
    the Redis at ``shown``) whether it may start: credentials or a certificate as they are (not
    retried), else a retryable "not called" (no call starts without it). Raised ``from None``:
    the client's error may carry the URL with its password."""
    error = converted(exc, lookup_key)
    if error is None:
        return exc
    if not error.retryable:
        return error
    return ServiceUnavailableError(
        f"not called: {what} at {shown} cannot be reached ({type(exc).__name__}), and no call "
        "starts without it",
        lookup_key=lookup_key,
        service=service,
    )

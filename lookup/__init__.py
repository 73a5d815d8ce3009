"""HTTP and Redis lookups and writes: ready backends for the keyed async wait operator, and
:class:`Lookup` over a service of your own.

The lookup key (what is looked up, e.g. ``user_id``) is independent of the operator's ordering
key (e.g. the upsert key ``order_id``).
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time, each name is imported on first use
    from .base import Lookup
    from .budget import Budget, Cost
    from .cache import PartialCache
    from .declared import DeclaredSources
    from .exceptions import (
        AccessDeniedError,
        BadResponseError,
        CertificateError,
        CircuitOpenError,
        LookupOptionError,
        LookupServiceError,
        LookupTimeoutError,
        RateLimitedError,
        RequestError,
        ServiceUnavailableError,
        TemplateError,
        VersionError,
        WrongTypeError,
    )
    from .fields import Field
    from .http_lookup import HttpLookup
    from .http_write import HttpWrite
    from .journal import StepJournal
    from .limits import Limits, SharedRate
    from .redis_connect import RedisConnection
    from .redis_lookup import RedisLookup
    from .redis_write import RedisWrite
    from .secrets import Secret
    from .service import Service
    from .shared_cache import SharedCache
    from .writes import Write

# Each public name and the module it lives in. Imported on first use (PEP 562), so that a Spark
# worker that unpickles an HttpLookup imports neither redis nor aiohttp when it uses neither:
# measured, those two imports cost a worker about 0.3 CPU s, paid again by every worker process.
_HOMES = {
    "AccessDeniedError": "exceptions",
    "BadResponseError": "exceptions",
    "Budget": "budget",
    "CertificateError": "exceptions",
    "CircuitOpenError": "exceptions",
    "Cost": "budget",
    "DeclaredSources": "declared",
    "Field": "fields",
    "HttpLookup": "http_lookup",
    "HttpWrite": "http_write",
    "Limits": "limits",
    "Lookup": "base",
    "LookupOptionError": "exceptions",
    "LookupServiceError": "exceptions",
    "LookupTimeoutError": "exceptions",
    "PartialCache": "cache",
    "RateLimitedError": "exceptions",
    "RedisConnection": "redis_connect",
    "RedisLookup": "redis_lookup",
    "RedisWrite": "redis_write",
    "RequestError": "exceptions",
    "Secret": "secrets",
    "Service": "service",
    "ServiceUnavailableError": "exceptions",
    "SharedCache": "shared_cache",
    "SharedRate": "limits",
    "StepJournal": "journal",
    "TemplateError": "exceptions",
    "VersionError": "exceptions",
    "Write": "writes",
    "WrongTypeError": "exceptions",
}


def __getattr__(name: str) -> object:
    module = _HOMES.get(name)
    if module is None:
        raise AttributeError(f"module 'lookup' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # the next access is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "AccessDeniedError",
    "BadResponseError",
    "Budget",
    "CertificateError",
    "CircuitOpenError",
    "Cost",
    "DeclaredSources",
    "Field",
    "HttpLookup",
    "HttpWrite",
    "Limits",
    "Lookup",
    "LookupOptionError",
    "LookupServiceError",
    "LookupTimeoutError",
    "PartialCache",
    "RateLimitedError",
    "RedisConnection",
    "RedisLookup",
    "RedisWrite",
    "RequestError",
    "Secret",
    "Service",
    "ServiceUnavailableError",
    "SharedCache",
    "SharedRate",
    "StepJournal",
    "TemplateError",
    "VersionError",
    "Write",
    "WrongTypeError",
]

"""HTTP and Redis lookups and writes: ready backends for the keyed async wait operator, and
:class:`Lookup` over a service of your own.

The lookup key (what is looked up, e.g. ``user_id``) is independent of the operator's ordering
key (e.g. the upsert key ``order_id``).
"""

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

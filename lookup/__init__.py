"""HTTP and Redis lookups and writes: ready ``AsyncFunction``s for the keyed async wait operator.

The lookup key (what is looked up, e.g. ``user_id``) is independent of the operator's ordering
key (e.g. the upsert key ``order_id``).
"""

from .base import Lookup, LookupStats
from .cache import MISS, PartialCache
from .declared import DeclaredSources
from .exceptions import (
    BadResponseError,
    CertificateError,
    CircuitOpenError,
    LookupOptionError,
    LookupServiceError,
    LookupTimeoutError,
    RateLimitedError,
    ServiceUnavailableError,
    TemplateError,
    VersionError,
    WrongTypeError,
)
from .fields import Field
from .http_lookup import HttpLookup
from .http_write import HttpWrite
from .journal import StepJournal
from .limits import Limits, SharedRate, ThrottleStats
from .redis_connect import RedisConnection
from .redis_lookup import RedisLookup
from .redis_write import RedisWrite
from .secrets import Secret
from .template import Template
from .writes import Write, WriteStats

__all__ = [
    "MISS",
    "BadResponseError",
    "CertificateError",
    "CircuitOpenError",
    "DeclaredSources",
    "Field",
    "HttpLookup",
    "HttpWrite",
    "Limits",
    "Lookup",
    "LookupOptionError",
    "LookupServiceError",
    "LookupStats",
    "LookupTimeoutError",
    "PartialCache",
    "RateLimitedError",
    "RedisConnection",
    "RedisLookup",
    "RedisWrite",
    "Secret",
    "ServiceUnavailableError",
    "SharedRate",
    "StepJournal",
    "Template",
    "TemplateError",
    "ThrottleStats",
    "VersionError",
    "Write",
    "WriteStats",
    "WrongTypeError",
]

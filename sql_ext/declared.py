"""Lookup sources declared in the SQL itself, for the table function:

    SELECT * FROM async_lookup(TABLE(orders), 'http',
                               url => 'http://svc/users/{user_id}', fields => 'name string, tier string')
    SELECT * FROM async_lookup(TABLE(lines), 'redis',
                               url => 'redis://cache:6379/0', key => 'price:{sku}', fields => 'price double')

``'http'`` takes ``url`` (a template), optionally ``batch_url`` and ``key`` (a batch endpoint:
a POST of the keys) and ``method``; ``'redis'`` takes ``url`` and ``key`` (a template; GET of a
JSON value). ``fields`` lists the result columns as ``name type [path] [optional]`` (types:
string, int, bigint, long, double, float, boolean; the path is dotted, into the JSON answer; an
``optional`` field may be absent from an answer, any other must be there).

Declared sources are off unless the Python code that calls :func:`sql_ext.install` passes a
:class:`lookup.DeclaredSources` allow-list, and a URL must be under it. Secrets
are not accepted in SQL text (it ends up in plans and logs): register such a source in Python.
Errors of declared sources show no part of a service's answer.

The spec becomes the source while Spark analyzes the query, so a bad one fails before any
lookup; its token is derived from the spec, so each worker process keeps one instance of it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from keyed_async_wait.core.exceptions import ConfigError

from .sources import LookupSource, make_source

__all__ = ["DECLARED_KINDS", "DECLARED_OPTIONS", "Declarations", "declared_source"]

DECLARED_KINDS = ("http", "redis")
_OPTIONS = {"http": ("url", "batch_url", "key", "method", "fields"), "redis": ("url", "key", "fields")}
DECLARED_OPTIONS = ("url", "key", "fields", "batch_url", "method")  # every kind's, in one list
_FIELD_TYPES = {
    "string": "string",
    "int": "int",
    "bigint": "int",
    "long": "int",
    "double": "float",
    "float": "float",
    "boolean": "bool",
    "bool": "bool",
}
Declared = tuple[str, str, str | None, bool]  # a declared field: name, type, path, optional
_ENABLE = (
    "declared sources are off: the Python code that calls sql_ext.install() enables them with "
    "declared_sources=DeclaredSources(http=[URL prefixes], redis=[Redis URLs]) (from lookup)"
)


@runtime_checkable
class Declarations(Protocol):
    """What the Python code that installs the functions allows a SQL user to declare
    (``lookup.DeclaredSources``): it checks a declaration's URLs and makes its lookup."""

    def declare(
        self, kind: str, options: Mapping[str, Any], fields: list[tuple[str, str, str | None, bool]]
    ) -> Any: ...


def _fields(text: Any) -> list[Declared]:
    if not isinstance(text, str) or not text.strip():
        raise ConfigError("fields", text, "result columns as 'name type [path], ...', e.g. 'name string'")
    out = []
    for part in text.split(","):
        words = part.split()
        optional = bool(words) and words[-1].lower() == "optional"
        if optional:
            words = words[:-1]
        if len(words) not in (2, 3) or words[1].lower() not in _FIELD_TYPES:
            raise ConfigError(
                "fields",
                part.strip(),
                f"'name type [path] [optional]' with a type of {', '.join(sorted(_FIELD_TYPES))}",
            )
        out.append(
            (words[0], _FIELD_TYPES[words[1].lower()], words[2] if len(words) == 3 else None, optional)
        )
    return out


def declared_source(kind: str, options: Mapping[str, Any], allowed: Declarations | None) -> LookupSource:
    """The source a SQL call declares; ConfigError naming the argument on anything wrong, or on
    a service ``allowed`` (the list the Python code gave to install) does not name."""
    from pyspark.sql.types import BooleanType, DoubleType, LongType, StringType, StructField, StructType

    given = {name: value for name, value in options.items() if value is not None}
    unknown = sorted(set(given) - set(_OPTIONS[kind]))
    if unknown:
        raise ConfigError(
            unknown[0], given[unknown[0]], f"for a '{kind}' source: {', '.join(_OPTIONS[kind])}"
        )
    for required in ("url", "fields") + (("key",) if kind == "redis" else ()):
        if required not in given:
            raise ConfigError(required, None, f"a '{kind}' source declared in SQL needs {required} => '...'")
    if allowed is None:
        raise ConfigError("url", given["url"], _ENABLE)
    if kind == "http" and str(given.get("method", "GET")).upper() != "GET":
        raise ConfigError(
            "method", given["method"], "'GET' (a declared source only reads; batch_url takes a POST)"
        )
    fields = _fields(given["fields"])
    target = {name: str(value) for name, value in given.items() if name not in ("fields", "method")}
    lookup = allowed.declare(kind, target, fields)
    spark_types = {"string": StringType(), "int": LongType(), "float": DoubleType(), "bool": BooleanType()}
    schema = StructType([StructField(name, spark_types[kind_], True) for name, kind_, _, _ in fields])
    spec = repr(sorted((k, str(v)) for k, v in given.items()))
    token = "sql:" + hashlib.blake2b(f"{kind}{spec}".encode(), digest_size=12).hexdigest()
    ddl = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in schema.fields)
    return make_source(kind, lookup, output_schema=ddl, token=token, parsed=schema)

"""Named lookup sources: what a SQL function name stands for.

A source is pickled into the registered functions and lives once per worker process (its
token names it there), so its clients are made lazily in the worker's event loop.
"""

from __future__ import annotations

import copy
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from keyed_async_wait.core.config import AsyncLookupConfig
from keyed_async_wait.core.exceptions import ConfigError
from keyed_async_wait.runtime.function import declared_inputs, declared_output_schema
from keyed_async_wait.spark.compat import parse_schema
from lookup import Lookup

__all__ = ["LookupSource", "make_source"]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class LookupSource:
    """A registered lookup: the function, the record fields it reads, its result columns."""

    name: str
    function: Any
    inputs: tuple[str, ...]
    schema_ddl: str  # the result columns, e.g. "name string, tier string"
    result_columns: tuple[str, ...]
    result_schema: Any  # the parsed StructType (parsing DDL needs a SparkContext, workers have none)
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    # a lookup's key fields: a NULL in one is a miss without a call (SQL's rule for a join key);
    # any other function sees its NULL arguments as None
    null_keys: tuple[str, ...] = ()

    def instance_for(self, conf: AsyncLookupConfig) -> tuple[str, Any]:
        """``(token, function)`` for a task with these settings: a lookup without a cache or
        limits of its own gets those the settings describe (one per process and setting)."""
        token, function = self._limited(conf)
        # a lookup only (any other function has no cache to fill), and one without its own
        if conf.cache != "PARTIAL" or not isinstance(function, Lookup) or function.cache is not None:
            return token, function
        from lookup.cache import PartialCache

        settings = (
            conf.cache_max_rows or 10_000,
            conf.cache_expire_after_write,
            conf.cache_expire_after_access,
            conf.cache_missing_key,
        )
        function = copy.copy(function)
        function.cache = PartialCache(
            settings[0],
            expire_after_write=settings[1],
            expire_after_access=settings[2],
            cache_missing_key=settings[3],
        )
        return f"{token}:{settings}", function

    def _limited(self, conf: AsyncLookupConfig) -> tuple[str, Any]:
        """The function with the limits the settings describe, if it is a lookup without its own."""
        wanted = conf.rate_limit is not None or conf.adaptive_concurrency or conf.breaker_failures is not None
        if not wanted or not isinstance(self.function, Lookup) or self.function.limits is not None:
            return self.token, self.function
        from lookup.limits import Limits

        limits = Limits(
            rate=conf.rate_limit,
            adaptive=conf.adaptive_concurrency,
            max_concurrency=conf.buffer_capacity,
            breaker_failures=conf.breaker_failures,
            breaker_cool_off=conf.breaker_cool_off,
        )
        function = copy.copy(self.function)
        function.limits = limits
        return f"{self.token}:{limits}", function


def make_source(
    name: str,
    function: Any,
    *,
    inputs: Sequence[str] | None = None,
    output_schema: str | None = None,
) -> LookupSource:
    """Check a source before anything is registered; errors name the parameter."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError("name", name, "a SQL identifier (letters, digits, _; not starting with a digit)")
    if inputs is None:
        inputs = declared_inputs(function)
        if not inputs:
            raise ConfigError(
                f"{name}: inputs", None, "the record fields the lookup reads, e.g. inputs=['user_id']"
            )
    inputs = tuple(inputs)
    if output_schema is None:
        output_schema = declared_output_schema(function)
        if output_schema is None:
            raise ConfigError(
                f"{name}: output_schema", None, "a DDL string of the result columns, e.g. 'name string'"
            )
    try:
        parsed = parse_schema(output_schema)
    except Exception as exc:
        raise ConfigError(f"{name}: output_schema", output_schema, f"a valid DDL string ({exc})") from exc
    null_keys = inputs if isinstance(function, Lookup) else ()
    return LookupSource(
        name, function, inputs, output_schema, tuple(parsed.fieldNames()), parsed, null_keys=null_keys
    )

"""Named lookup sources: what a SQL function name stands for.

A source is pickled into the registered functions and lives once per worker process (its
token names it there), so its clients are made lazily in the worker's event loop.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from keyed_async_wait.core.config import SettingsGroup
from keyed_async_wait.core.exceptions import ConfigError
from keyed_async_wait.runtime.backend import adapt_function
from keyed_async_wait.spark.compat import parse_schema
from keyed_async_wait.spark.session import other_groups

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
    # the settings groups known where the functions were installed (the tasks check against them)
    known: tuple[SettingsGroup, ...] = ()


def make_source(
    name: str,
    function: Any,
    *,
    inputs: Sequence[str] | None = None,
    output_schema: str | None = None,
    token: str | None = None,
    parsed: Any = None,
) -> LookupSource:
    """Check a source before anything is registered; errors name the parameter. ``parsed``:
    the StructType of ``output_schema`` when it is made already (where there is no session to
    parse DDL: a source declared in SQL, made while Spark analyzes the query)."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError("name", name, "a SQL identifier (letters, digits, _; not starting with a digit)")
    backend = adapt_function(function)
    if inputs is None:
        inputs = backend.input_fields
        if not inputs:
            raise ConfigError(
                f"{name}: inputs", None, "the record fields the lookup reads, e.g. inputs=['user_id']"
            )
    inputs = tuple(inputs)
    if output_schema is None:
        output_schema = backend.output_schema
        if output_schema is None:
            raise ConfigError(
                f"{name}: output_schema", None, "a DDL string of the result columns, e.g. 'name string'"
            )
    try:
        parsed = parsed if parsed is not None else parse_schema(output_schema)
    except Exception as exc:
        raise ConfigError(f"{name}: output_schema", output_schema, f"a valid DDL string ({exc})") from exc
    return LookupSource(
        name,
        function,
        inputs,
        output_schema,
        tuple(parsed.fieldNames()),
        parsed,
        token=token or uuid.uuid4().hex,
        null_keys=inputs if backend.null_key_is_miss else (),
        known=other_groups(),
    )

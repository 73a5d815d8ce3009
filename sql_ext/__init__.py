"""Async lookups from Spark SQL, configured like Flink's ``table.exec.async-lookup.*``.

::

    ext = sql_ext.install(spark, {"users": HttpLookup("http://svc/users/{user_id}", fields=[...])})
    spark.sql("SET `spark.sql.exec.async-lookup.output-mode`=ALLOW_UNORDERED")  # backquotes: hyphens
    spark.sql("SELECT o.*, users(o.user_id) AS u FROM orders o")                # scalar, ORDERED
    spark.sql("SELECT * FROM async_lookup(TABLE(orders), 'users', upsert_key => 'order_id', "
              "order_by => 'seq')")                                              # FLIP-519's modes

Settings (``spark.conf.set``, the session builder, or SQL ``SET`` with the key in backquotes)
are read by the tasks through their local properties; see ``keyed_async_wait.core.config``.
"""

from __future__ import annotations

from typing import Any

from .exceptions import ConfigError, TableArgumentError, UnknownSourceError

__all__ = [
    "AsyncLookupSQL",
    "ConfigError",
    "TableArgumentError",
    "UnknownSourceError",
    "install",
]


def __getattr__(name: str) -> Any:  # the Spark parts import pyspark: only when asked for
    if name in ("install", "AsyncLookupSQL"):
        from . import session as module

        return getattr(module, name)
    if name == "Decision":  # what AsyncLookupSQL.decide returns: moved in 0.2.0
        import warnings

        warnings.warn(
            "sql_ext.Decision is deprecated and goes in the next release: import it from sql_ext.modes",
            DeprecationWarning,
            stacklevel=2,
        )
        from .modes import Decision

        return Decision
    raise AttributeError(f"module 'sql_ext' has no attribute {name!r}")

"""Errors of the SQL extension.

::

    ConfigError (keyed_async_wait; ValueError)   a bad setting; names the key and the allowed values
    ├── UnknownSourceError                    a lookup name that is not registered; names the known ones
    └── TableArgumentError                    a table-function argument that does not fit the table
                                              (a missing upsert key, order or change column)

Both are raised before any lookup runs: table-function arguments while Spark analyzes the
query, the ``spark.sql.exec.async-lookup.*`` settings when a task starts.
"""

from __future__ import annotations

from keyed_async_wait.core.exceptions import ConfigError

__all__ = ["ConfigError", "TableArgumentError", "UnknownSourceError"]


class UnknownSourceError(ConfigError):
    """The SQL names a lookup source that :func:`sql_ext.install` did not register."""


class TableArgumentError(ConfigError):
    """An argument of ``async_lookup(TABLE(...), ...)`` names columns the table lacks."""

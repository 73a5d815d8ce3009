"""Errors raised by the keyed async wait operator.

::

    KeyedAsyncWaitError                      base of every error raised here
    ├── ConfigError (ValueError)             a bad operator parameter; names it and the allowed values
    │   ├── UnknownSettingError              a spark.sql.exec.async-lookup.* key that does not exist;
    │   │                                    names it and the closest known key
    │   └── lookup.LookupOptionError         a bad option of a lookup (lookup/exceptions.py)
    ├── RecordKeyError (KeyError)            a record's key is missing or None, or has no stable hash
    ├── RecordFailedError                    an action failed for good; names the key and the attempts,
    │   │                                    chained (``__cause__``) to the last exception
    │   └── RecordTimeoutError (TimeoutError)  the per-record timeout expired (retries included)
    ├── ResultTypeError (TypeError)          an action returned something that is not a result list
    ├── StepError                            a chain step failed; names the step (runtime/chain.py)
    ├── ResultSchemaError (TypeError)        a result does not fit the output schema; names the
    │                                        column and the record
    ├── StateError                           parked state missing or damaged; names the path and
    │                                        the micro-batch
    ├── SnapshotError                        a snapshot cannot be taken or restored (e.g. unpicklable record)
    ├── SparkVersionError                    a feature the running pyspark cannot carry; names the
    │                                        feature, the version it needs and the one running
    └── lookup.LookupServiceError            a lookup or a write failed (lookup/exceptions.py: its
                                             own tree, each marked retryable or not)

    sql_ext.TableArgumentError and sql_ext.UnknownSourceError are ConfigErrors of the SQL
    functions (sql_ext/exceptions.py).

    (internal, never raised to a caller) ValueMismatch: a value a column cannot hold, turned into
    a ResultSchemaError naming the column and the key (spark/values.py)
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ConfigError",
    "KeyedAsyncWaitError",
    "RecordFailedError",
    "RecordKeyError",
    "RecordTimeoutError",
    "ResultSchemaError",
    "ResultTypeError",
    "SnapshotError",
    "SparkVersionError",
    "StateError",
    "UnknownSettingError",
]


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe_record(key: Any, record: Any, target: str | None = None) -> str:
    """A record for a message: by its key, or (in the modes without one) by a short rendering of
    its values, so that an error always says which record; ``target``, when known, is what the
    action does for it (a lookup's own key: ``GET https://host/users/7``, ``Redis key user:7``)."""
    call = f" ({target})" if target else ""
    if key is not None:
        return f"record with key {_short(key)}{call}"
    if isinstance(record, dict):  # the operator's own fields (a chain's progress) are no input
        record = {k: v for k, v in record.items() if not str(k).startswith("_kaw")}
    return f"record {_short(record)}{call}"


class KeyedAsyncWaitError(Exception):
    """Base class of every error raised by ``keyed_async_wait``."""


class ConfigError(KeyedAsyncWaitError, ValueError):
    """A parameter is out of range or of the wrong kind."""

    def __init__(self, name: str, value: Any, allowed: str) -> None:
        self.name = name
        self.value = value
        self.allowed = allowed
        super().__init__(f"{name}={_short(value)} is not allowed; allowed: {allowed}")


class UnknownSettingError(ConfigError):
    """A key in our settings namespace that is no setting (a typo is never silently ignored)."""

    def __init__(self, name: str, value: Any, closest: str | None, known: str) -> None:
        self.name, self.value, self.closest = name, value, closest
        self.allowed = known
        hint = f"; did you mean {closest}" if closest else ""
        KeyedAsyncWaitError.__init__(
            self, f"unknown setting {name}={_short(value)}{hint}; known settings: {known}"
        )


class RecordKeyError(KeyedAsyncWaitError, KeyError):
    """The key selector found no usable key in a record."""

    def __init__(self, message: str, record: Any = None) -> None:
        self.record = record
        super().__init__(message)

    def __str__(self) -> str:  # KeyError quotes its argument; we want the plain sentence
        return str(self.args[0])


class RecordFailedError(KeyedAsyncWaitError):
    """An action failed and no retry is left.

    ``key``, ``attempts`` and ``record`` say which record, ``target`` what the action did for
    it when the action says (a lookup's URL, secrets redacted, or its Redis key); the cause is
    chained.
    """

    retryable = False

    def __init__(self, key: Any, attempts: int, record: Any, reason: str, target: str | None = None) -> None:
        self.key = key
        self.attempts = attempts
        self.record = record
        self.reason = reason
        self.target = target
        super().__init__(
            f"{describe_record(key, record, target)} failed after {attempts} attempt"
            f"{'' if attempts == 1 else 's'}: {reason}"
        )


class RecordTimeoutError(RecordFailedError, TimeoutError):
    """The per-record timeout expired before the action (with its retries) finished."""

    def __init__(
        self, key: Any, attempts: int, record: Any, timeout: float, target: str | None = None
    ) -> None:
        self.timeout = timeout
        super().__init__(key, attempts, record, f"timed out after {timeout:g} s (retries included)", target)


class ResultTypeError(KeyedAsyncWaitError, TypeError):
    """An action returned a value the operator cannot turn into results."""


class ResultSchemaError(KeyedAsyncWaitError, TypeError):
    """A result does not fit the declared output schema; names the column and the key."""


class StateError(KeyedAsyncWaitError):
    """The parked state is missing or damaged; names the path and the micro-batch, and says how
    to get out (``kaw-state``)."""

    def __init__(self, message: str, *, path: str, batch_id: int | None) -> None:
        self.path, self.batch_id = path, batch_id
        where = f" (micro-batch {batch_id})" if batch_id is not None else ""
        super().__init__(
            f"parked state at {path}{where}: {message}. Nothing ran. Inspect it with "
            f"`kaw-state verify <checkpoint>`; `kaw-state rewind` re-runs micro-batches from the source "
            "(exactly-once kept, if the source still has them), `kaw-state accept-loss` goes on without "
            "the damaged rows (see the operations guide, 'Parked state: kaw-state')"
        )


class SnapshotError(KeyedAsyncWaitError):
    """A snapshot cannot be taken or restored."""


class SparkVersionError(KeyedAsyncWaitError):
    """A feature needs a newer Spark than the one running (raised when the call is made)."""

    def __init__(self, feature: str, needs: str, running: str, instead: str = "") -> None:
        self.feature, self.needs, self.running = feature, needs, running
        hint = f"; {instead}" if instead else ""
        super().__init__(f"{feature} needs pyspark {needs} or newer; this is pyspark {running}{hint}")

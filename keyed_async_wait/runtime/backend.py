"""The one protocol the engine reads an action through: :class:`Backend`.

Whatever runs per record (a lookup, a write, a chain, a class of your own, a plain ``async
def``) is read once, by :func:`adapt_function`, into a :class:`FunctionAdapter`: every member
below that the action lacks takes its default there, so the runtime, the Spark edge and the SQL
functions never ask what kind of object they hold, and never import a concrete one.

======================  ==============================  ===========================================
member                  default                         what the engine does with it
======================  ==============================  ===========================================
``invoke(record)``      (required)                      one attempt for one record: a result list,
                                                        a result, or None / [] for a miss
``invoke_batch(rs)``    None: one record at a time      one call for many ready records (FLIP-425's
                                                        active buffer); one result list or
                                                        exception per record
``timeout(record)``     None: a timeout error           the results of a record whose time ran out
``open()``/``close()``  nothing                         once per worker process, in its event loop
``eager_start``         False                           run ``invoke`` to its first suspension
                                                        before making a task
``describe_call(r)``    None                            what the action does for a record (a
                                                        lookup's own key), in that record's errors
``input_fields()``      ()                              the record fields it reads: checked at the
                                                        call; SQL binds arguments to them
``output_schema()``     None                            its result columns (Spark DDL)
``counters()``          {}                              cumulative counts in this process; a task
                                                        reports its share (log line, metrics)
``gauges()``            {}                              values as they are now (the task log)
``columnar()``          None                            the backlog gear's column-wise form
                                                        (:class:`Columnar`)
``configured(s)``       ``("", self)``                  the action under a session's
                                                        ``spark.sql.exec.async-lookup.*`` settings
                                                        (SQL): an identity and the action to run
``writes``              False                           it changes a store (SQL asks for
                                                        ``allow_writes=True``)
``null_key_is_miss``    False                           a NULL input field is a miss without a call
                                                        (SQL's rule for a join key)
``superseded(r)``       absent                          KEY_ORDERED: only the newest record waiting
                                                        behind a key runs; the older get these
                                                        results (a write fenced by version)
``bind_release(f)``     absent                          given ``release(record)``: the action lets
                                                        its key go before it ends (a chain)
======================  ==============================  ===========================================

The small protocols (:class:`DeclaresInputs`, ...) name parts of it for type checkers and tests.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Hashable, Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from ..core.exceptions import ConfigError, ResultTypeError

__all__ = [
    "Backend",
    "Columnar",
    "DeclaresInputs",
    "DeclaresOutputSchema",
    "DescribesCalls",
    "FunctionAdapter",
    "ReleasesKeysEarly",
    "adapt_function",
    "check_release",
    "counters_of",
    "declared_inputs",
    "declared_output_schema",
]


class Backend(Protocol):
    """What the engine reads from an action (see the module doc for the optional members)."""

    async def invoke(self, record: Any) -> Sequence[Any] | None: ...


class Columnar(Protocol):
    """A read-only lookup's backlog form: keys read column-wise, each distinct key fetched once."""

    def column_keys(self, batch: Any) -> list[Hashable]:
        """The lookup key of every row of an Arrow record batch (raises if a row has none)."""
        ...

    async def results_for_keys(self, keys: list[Hashable], chunk: int) -> list[Any]:
        """For distinct keys: each key's result list (``[]`` for a miss) or its error."""
        ...

    def memoized(self) -> contextlib.AbstractContextManager[None]:
        """Within the block each key is fetched at most once (a backlog run's answers are fixed)."""
        ...


@runtime_checkable
class DeclaresOutputSchema(Protocol):
    """A function that knows its result columns (a lookup with ``fields=``, a chain of them):
    the waits and the SQL functions take them as the output schema when none is given."""

    def output_schema(self) -> str | None: ...


@runtime_checkable
class DeclaresInputs(Protocol):
    """A function that knows which record fields it reads (a lookup's templates): a field the
    input lacks is an error at the call, not a failure in every task."""

    def input_fields(self) -> Sequence[str]: ...


@runtime_checkable
class DescribesCalls(Protocol):
    """An action that says what it does for a record (a lookup's own key, secrets redacted):
    that record's errors name it."""

    def describe_call(self, record: Any) -> str | None: ...


@runtime_checkable
class ReleasesKeysEarly(Protocol):
    """An action that may let its key go before it ends (a chain with ``release_after``):
    ``bind_release`` is then given the runtime's ``release(record)``; None when it does not."""

    @property
    def bind_release(self) -> Callable[[Any], None] | None: ...


def declared_output_schema(function: Any) -> str | None:
    """``function``'s result columns as a DDL string, or None when it declares none."""
    declare = getattr(function, "output_schema", None)
    return declare() if callable(declare) else None


def declared_inputs(function: Any) -> tuple[str, ...]:
    """The record fields ``function`` reads, or () when it declares none."""
    declare = getattr(function, "input_fields", None)
    return tuple(declare()) if callable(declare) else ()


def counters_of(function: Any) -> dict[str, int]:
    """What an action has counted in this process so far (its ``counters()``; {} without)."""
    counters = _member(function, "counters")
    return dict(counters()) if counters is not None else {}


def _plain_results(value: Any) -> list[Any]:
    if value is None:
        return []
    if type(value) is list:
        return value
    if isinstance(value, tuple):
        return list(value)
    return [value]


def _declared_results(value: Any) -> list[Any]:
    if type(value) is list:
        return value
    if value is None:
        return []
    if isinstance(value, (tuple, Sequence)) and not isinstance(value, (str, bytes, dict)):
        return list(value)
    raise ResultTypeError(
        f"invoke() must return a list of results (or None for a miss), got {type(value).__name__}"
    )


def _nothing() -> Mapping[str, Any]:
    return {}


class FunctionAdapter:
    """An action as the engine reads it (:class:`Backend`, every default filled in).

    ``call(record)`` returns an awaitable of the raw value and ``to_results(raw)`` turns it into
    a list of results; ``call_batch`` and ``fallback`` are None when the action has none.
    ``instance`` is the object adapted (None for an ``async def``).
    """

    __slots__ = (
        "bind_release",
        "call",
        "call_batch",
        "close",
        "columnar",
        "configured",
        "counters",
        "describe",
        "eager",
        "fallback",
        "gauges",
        "input_fields",
        "instance",
        "name",
        "null_key_is_miss",
        "open",
        "output_schema",
        "superseded",
        "to_results",
        "writes",
    )

    def __init__(
        self,
        *,
        name: str,
        call: Callable[[Any], Awaitable[Any]],
        to_results: Callable[[Any], list[Any]],
        call_batch: Callable[[list[Any]], Awaitable[Any]] | None = None,
        fallback: Callable[[Any], Any] | None = None,
        open: Callable[[], Awaitable[None]] | None = None,
        close: Callable[[], Awaitable[None]] | None = None,
        eager: bool = False,
        bind_release: Callable[[Any], None] | None = None,
        describe: Callable[[Any], str | None] | None = None,
        instance: Any = None,
        counters: Callable[[], Mapping[str, int]] = _nothing,
        gauges: Callable[[], Mapping[str, Any]] = _nothing,
        columnar: Columnar | None = None,
        configured: Callable[[Mapping[str, str]], tuple[str, Any]] | None = None,
        input_fields: tuple[str, ...] = (),
        output_schema: str | None = None,
        writes: bool = False,
        null_key_is_miss: bool = False,
        superseded: Callable[[Any], Any] | None = None,
    ) -> None:
        self.name = name
        self.instance = instance
        self.bind_release = bind_release
        self.eager = eager
        self.call = call
        self.to_results = to_results
        self.call_batch = call_batch
        self.fallback = fallback
        self.open = open
        self.close = close
        self.describe = describe
        self.counters = counters
        self.gauges = gauges
        self.columnar = columnar
        self.configured = configured
        self.input_fields = input_fields
        self.output_schema = output_schema
        self.writes = writes
        self.null_key_is_miss = null_key_is_miss
        self.superseded = superseded

    def replaced(self, **changes: Any) -> FunctionAdapter:
        """A copy with ``changes`` (slot names), every other slot as here."""
        values = {name: getattr(self, name) for name in self.__slots__}
        unknown = set(changes) - set(values)
        if unknown:
            raise TypeError(f"FunctionAdapter has no {sorted(unknown)[0]!r}")
        values.update(changes)
        return FunctionAdapter(**values)

    @contextlib.contextmanager
    def memoized(self) -> Iterator[None]:
        """Each lookup key fetched at most once within the block (a no-op without a columnar form)."""
        if self.columnar is None:
            yield
            return
        with self.columnar.memoized():
            yield


def check_release(adapter: FunctionAdapter, on_error: str) -> None:
    """A function that releases its key early cannot be deferred: deferral parks the key."""
    if adapter.bind_release is not None and on_error == "defer":
        raise ConfigError(
            "on_error",
            "defer",
            "'fail' or 'emit' with a function that releases its key early (a chain's release_after): "
            "a deferral parks the key, which the function has already let go",
        )


def _member(function: Any, name: str) -> Any:
    """An optional callable member, or None (a non-callable attribute of that name is not one)."""
    member = getattr(function, name, None)
    return member if callable(member) else None


def adapt_function(function: Any) -> FunctionAdapter:
    """Read ``function`` through the :class:`Backend` protocol: an object with ``async
    invoke(record)`` (every optional member found by name, or its default), or an ``async def``."""
    if isinstance(function, FunctionAdapter):
        return function
    invoke = _member(function, "invoke")
    if invoke is not None:
        columnar = _member(function, "columnar")
        return FunctionAdapter(
            name=type(function).__name__,
            call=invoke,
            to_results=_declared_results,
            call_batch=_member(function, "invoke_batch"),
            fallback=_member(function, "timeout"),
            open=_member(function, "open"),
            close=_member(function, "close"),
            eager=bool(getattr(function, "eager_start", False)),
            bind_release=getattr(function, "bind_release", None),
            describe=_member(function, "describe_call"),
            instance=function,
            counters=_member(function, "counters") or _nothing,
            gauges=_member(function, "gauges") or _nothing,
            columnar=columnar() if columnar is not None else None,
            configured=_member(function, "configured"),
            input_fields=declared_inputs(function),
            output_schema=declared_output_schema(function),
            writes=bool(getattr(function, "writes", False)),
            null_key_is_miss=bool(getattr(function, "null_key_is_miss", False)),
            superseded=_member(function, "superseded"),
        )
    if callable(function):
        return FunctionAdapter(
            name=getattr(function, "__name__", type(function).__name__),
            call=function,
            to_results=_plain_results,
            eager=bool(getattr(function, "eager_start", False)),
        )
    raise ConfigError(
        "function", function, "an AsyncFunction, an object with async invoke(record), or an async def"
    )

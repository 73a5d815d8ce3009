"""The action the operator runs per record: :class:`AsyncFunction` or a plain ``async def``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from ..core.exceptions import ConfigError, ResultTypeError

__all__ = [
    "AsyncFunction",
    "DeclaresInputs",
    "DeclaresOutputSchema",
    "DescribesCalls",
    "FunctionAdapter",
    "ReleasesKeysEarly",
    "adapt_function",
    "check_release",
    "declared_inputs",
    "declared_output_schema",
]


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
    return function.output_schema() if isinstance(function, DeclaresOutputSchema) else None


def declared_inputs(function: Any) -> tuple[str, ...]:
    """The record fields ``function`` reads, or () when it declares none."""
    return tuple(function.input_fields()) if isinstance(function, DeclaresInputs) else ()


IN = TypeVar("IN")
OUT = TypeVar("OUT")


class AsyncFunction(Generic[IN, OUT]):
    """An asynchronous action per record (Flink's ``AsyncFunction``).

    Override :meth:`invoke`; optionally :meth:`invoke_batch` (then the operator gathers ready
    records into batches), :meth:`timeout` (a fallback result instead of a timeout error),
    and :meth:`open` / :meth:`close`, which run inside the event loop that runs the actions,
    so clients belong there.
    """

    async def open(self) -> None:
        """Called once in the event loop before the first record."""

    async def close(self) -> None:
        """Called once in the event loop after the last record, also after a failure."""

    async def invoke(self, record: IN) -> Sequence[OUT] | None:
        """The results for one record: a list (empty, or None, for a miss)."""
        raise NotImplementedError(f"{type(self).__name__} must implement invoke(record)")

    #: True when :meth:`invoke` may be started eagerly: its code up to the first suspension then
    #: runs outside any task, so it must suspend (``await asyncio.sleep(0)``) before anything
    #: that needs ``asyncio.current_task()`` (``asyncio.timeout``, aiohttp requests). A call that
    #: finishes without suspending (a cache hit) then costs no task at all.
    eager_start = False

    # Optional, detected by the operator:
    #   async def invoke_batch(self, records: list[IN]) -> list[Sequence[OUT] | BaseException]
    #   def timeout(self, record: IN) -> Sequence[OUT] | None


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


class FunctionAdapter:
    """What the operator calls: one shape for every kind of action.

    ``call(record)`` returns an awaitable of the raw value and ``to_results(raw)`` turns it into
    a list of results; ``call_batch`` and ``fallback`` are None when the action has none.
    """

    __slots__ = (
        "bind_release",
        "call",
        "call_batch",
        "close",
        "describe",
        "eager",
        "fallback",
        "instance",
        "name",
        "open",
        "to_results",
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
    ) -> None:
        self.name = name
        # the object adapted (a lookup, a chain, an AsyncFunction), None for an async def: what
        # the Spark layer asks for its counters
        self.instance = instance
        # given the runtime's release(record) -> bool, or None (a function that releases its key
        # before it ends: a chain with release_after)
        self.bind_release = bind_release
        self.eager = eager
        self.call = call
        self.to_results = to_results
        self.call_batch = call_batch
        self.fallback = fallback
        self.open = open
        self.close = close
        # what the action does for a record (a lookup's own key), named in that record's errors
        self.describe = describe

    def replaced(self, **changes: Any) -> FunctionAdapter:
        """A copy with ``changes`` (slot names), every other slot as here."""
        values = {name: getattr(self, name) for name in self.__slots__}
        unknown = set(changes) - set(values)
        if unknown:
            raise TypeError(f"FunctionAdapter has no {sorted(unknown)[0]!r}")
        values.update(changes)
        return FunctionAdapter(**values)


def check_release(adapter: FunctionAdapter, on_error: str) -> None:
    """A function that releases its key early cannot be deferred: deferral parks the key."""
    if adapter.bind_release is not None and on_error == "defer":
        raise ConfigError(
            "on_error",
            "defer",
            "'fail' or 'emit' with a function that releases its key early (a chain's release_after): "
            "a deferral parks the key, which the function has already let go",
        )


def adapt_function(function: Any) -> FunctionAdapter:
    """Accept an :class:`AsyncFunction`, any object with ``async invoke``, or an ``async def``."""
    if isinstance(function, FunctionAdapter):
        return function
    invoke = getattr(function, "invoke", None)
    if invoke is not None and callable(invoke):
        cls = type(function)
        fallback = getattr(function, "timeout", None)
        if fallback is not None and getattr(cls, "timeout", None) is getattr(AsyncFunction, "timeout", None):
            fallback = None
        return FunctionAdapter(
            name=cls.__name__,
            call=invoke,
            to_results=_declared_results,
            call_batch=getattr(function, "invoke_batch", None),
            fallback=fallback if callable(fallback) else None,
            open=getattr(function, "open", None),
            close=getattr(function, "close", None),
            eager=bool(getattr(function, "eager_start", False)),
            bind_release=function.bind_release if isinstance(function, ReleasesKeysEarly) else None,
            describe=function.describe_call if isinstance(function, DescribesCalls) else None,
            instance=function,
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

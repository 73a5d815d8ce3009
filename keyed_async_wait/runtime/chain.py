"""A chain of named async steps per record, usable wherever a function is (the operator, the
three waits, ``key_ordered_stream``, SQL): FLIP-455's declared steps, resumable at the step
reached.

    chain = Chain(
        Step("customer", customers),                   # an HTTP lookup by the record's user_id
        Step("region", regions),                       # a Redis lookup by the customer's zip
    )
    AsyncDataStream.key_ordered_wait(orders, chain, "order_id")

Each step gets the record's fields with the earlier steps' result fields over them, and adds
its own; a step with no result (a miss) ends the chain for the record (later steps' fields are
null; a miss at the first step is a miss of the chain). The pure bookkeeping is
:class:`keyed_async_wait.core.chain.ChainProgress`; this module awaits.

Invariants:

- per-key order spans the chain: the operator sees one invocation per record, so the next
  record of a key starts once this one has finished its last step;
- steps pipeline across records: each record moves on as its own step ends, so B's first step
  runs while A is in its second;
- a step that finished for a record never runs again for it (its result is in the record's
  progress): a retry, a deferral, parked state or a snapshot resumes at the step reached, so
  at-least-once holds only for the step that was in flight;
- a step whose function batches (``invoke_batch``) gets the records that reach it in the same
  loop turn (or within ``linger`` seconds) as one batch call, at most ``batch_size`` records.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from ..core.chain import PROGRESS_FIELD, ChainProgress, check_step_names, ddl_names
from ..core.exceptions import ConfigError, KeyedAsyncWaitError, ResultTypeError
from .backend import FunctionAdapter, adapt_function, declared_inputs, declared_output_schema
from .function import AsyncFunction

__all__ = ["Chain", "Step", "StepError", "StepStats"]


@dataclass(frozen=True)
class Step:
    """One named step: a lookup or any async function (``async def``, an object with ``async
    invoke``); ``fields`` names its result columns when its function declares none."""

    name: str
    function: Any
    fields: tuple[str, ...] | None = None


@dataclass
class StepStats:
    """What one step did in this process (read-only for callers)."""

    calls: int = 0  # records the step was called for
    batches: int = 0  # batch calls (a step that batches)
    failures: int = 0
    misses: int = 0
    retries: int = 0  # calls for a record whose earlier call of this step did not finish
    resumed: int = 0  # records that arrived with this step already finished (not called again)
    seconds: float = 0.0  # summed call latency

    @property
    def mean_latency(self) -> float:
        return self.seconds / self.calls if self.calls else 0.0


class StepError(KeyedAsyncWaitError):
    """A step failed: names the step, keeps the cause's ``retryable`` and ``retry_after``, so
    retries and deferral treat it as they treat the cause (chained as ``__cause__``)."""

    def __init__(self, step: str, cause: BaseException) -> None:
        self.step = step
        self.retryable = bool(getattr(cause, "retryable", not isinstance(cause, ResultTypeError)))
        self.retry_after = getattr(cause, "retry_after", None)
        super().__init__(f"step {step!r}: {type(cause).__name__}: {cause}")


class _Batcher:
    """Gathers the records that reach a batching step together into one batch call."""

    def __init__(self, call_batch: Any, size: int, linger: float, stats: StepStats) -> None:
        self._call_batch, self._size, self._linger = call_batch, size, linger
        self._stats = stats  # its batch calls are counted there
        self._pending: list[tuple[Any, asyncio.Future[Any]]] = []
        self._timer: asyncio.Handle | None = None
        self._running: set[asyncio.Task[None]] = set()
        self.batches = 0

    async def submit(self, view: Any) -> Any:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending.append((view, future))
        if len(self._pending) >= self._size:
            self._flush()
        elif self._timer is None:
            self._timer = (
                loop.call_later(self._linger, self._flush) if self._linger else loop.call_soon(self._flush)
            )
        return await future

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._pending = self._pending[: self._size], self._pending[self._size :]
        if self._pending:
            self._timer = asyncio.get_running_loop().call_soon(self._flush)
        live = [(view, future) for view, future in batch if not future.done()]
        if live:
            self.batches += 1
            self._stats.batches += 1
            task = asyncio.get_running_loop().create_task(self._run(live))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _run(self, batch: list[tuple[Any, asyncio.Future[Any]]]) -> None:
        try:
            answers = await self._call_batch([view for view, _ in batch])
            for (_, future), answer in zip(batch, answers, strict=True):
                if future.done():
                    continue
                if isinstance(answer, BaseException):
                    future.set_exception(answer)
                else:
                    future.set_result(answer)
        except Exception as exc:  # noqa: BLE001 - every record of the batch gets it
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
        finally:  # cancelled: so are the records waiting for it
            for _, future in batch:
                future.cancel()

    async def aclose(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for _, future in self._pending:
            future.cancel()
        self._pending = []
        tasks = list(self._running)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Chain(AsyncFunction[Any, dict[str, Any]]):
    """Named steps run one after another per record (see the module's invariants).

    Parameters
    ----------
    *steps : Step
        The steps, in order; names are identifiers, each used once.
    batch_size : int
        The most records in one batch call of a step that batches.
    linger : float
        Seconds a batching step waits for more records before calling (0: the same loop turn).
    release_after : str, optional
        The step after which the record's key is released (KEY_ORDERED): the next record of
        the key starts then, and the rest of this record's chain runs unordered for the key.
        Not with ``on_error="defer"`` (a deferral parks the key the chain has let go).
    """

    def __init__(
        self, *steps: Step, batch_size: int = 100, linger: float = 0.0, release_after: str | None = None
    ) -> None:
        if any(not isinstance(step, Step) for step in steps):
            raise ConfigError("steps", steps, "Step(name, function) objects")
        check_step_names([step.name for step in steps])
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError("batch_size", batch_size, "an integer >= 1")
        if not isinstance(linger, (int, float)) or linger < 0:
            raise ConfigError("linger", linger, "seconds >= 0")
        self.steps = tuple(steps)
        self.names = [step.name for step in steps]
        if release_after is not None and release_after not in self.names:
            raise ConfigError("release_after", release_after, f"one of the steps: {', '.join(self.names)}")
        self.release_after = release_after
        self._release: Any = None  # the running operator's release(record), when release_after
        # awaited with (record, progress) after each finished step, before the next starts
        # (key_ordered_stream's step journal sets it for a task)
        self.progress_sink: Any = None
        self.batch_size, self.linger = batch_size, float(linger)
        self.fields = {step.name: _fields_of(step) for step in steps}
        self.stats = {step.name: StepStats() for step in steps}
        self._adapters: list[FunctionAdapter] | None = None
        self._batchers: dict[str, _Batcher] = {}

    def __repr__(self) -> str:
        return f"Chain({', '.join(self.names)})"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_adapters"], state["_batchers"], state["_release"] = None, {}, None
        state["progress_sink"] = None
        state["stats"] = {name: StepStats() for name in self.names}
        return state

    @property
    def bind_release(self) -> Any:
        """What an operator calls with its ``release(record)`` (only with ``release_after``)."""
        return self._bind if self.release_after is not None else None

    def _bind(self, release: Any) -> None:
        self._release = release

    # ------------------------------------------------------------------ what Spark asks

    def output_schema(self) -> str | None:
        """The steps' result columns (a Spark DDL string), when every step declares them."""
        parts = []
        for step in self.steps:
            ddl = declared_output_schema(step.function)
            if not ddl:
                return None
            parts.append(ddl)
        return ", ".join(parts)

    def input_fields(self) -> tuple[str, ...]:
        """The record fields the steps' templates read, less those an earlier step produces."""
        produced: set[str] = set()
        needed: list[str] = []
        for step in self.steps:
            for name in declared_inputs(step.function):
                if name not in produced and name not in needed:
                    needed.append(name)
            produced.update(self.fields[step.name])
        return tuple(needed)

    @property
    def writes(self) -> bool:
        """Whether any step changes a store (SQL then asks for ``allow_writes=True``)."""
        return any(adapt_function(step.function).writes for step in self.steps)

    @property
    def superseded(self) -> Any:
        """When the last step is a write that coalesces (``coalesce=True``): the results of a
        record skipped for a newer one of its key (no step ran for it), else None."""
        last = adapt_function(self.steps[-1].function).superseded if self.steps else None
        if last is None:
            return None

        def superseded(record: Any) -> list[dict[str, Any]]:
            out: dict[str, Any] = dict.fromkeys(f for name in self.names for f in self.fields[name])
            out.update(adapt_function(self.steps[-1].function).to_results(last(record))[0])
            return [out]

        return superseded

    def counters(self) -> dict[str, int]:
        """The steps' counts (their backends' ``counters()``), summed, in this process so far."""
        total: dict[str, int] = {}
        for step in self.steps:
            for name, value in adapt_function(step.function).counters().items():
                total[name] = total.get(name, 0) + value
        return total

    def gauges(self) -> dict[str, str]:
        """Per step, what it did in this process so far: calls, failures, retries, misses,
        records resumed past it, mean latency."""
        return {
            f"step[{name}]": f"calls:{s.calls},failures:{s.failures},retries:{s.retries},misses:{s.misses},"
            f"resumed:{s.resumed},mean:{s.mean_latency * 1000:.1f}ms"
            for name, s in self.stats.items()
        }

    # ------------------------------------------------------------------ running

    async def open(self) -> None:
        self._adapters = [adapt_function(step.function) for step in self.steps]
        self._batchers = {
            step.name: _Batcher(adapter.call_batch, self.batch_size, self.linger, self.stats[step.name])
            for step, adapter in zip(self.steps, self._adapters, strict=True)
            if adapter.call_batch is not None
        }
        for adapter in self._adapters:
            if adapter.open is not None:
                await adapter.open()

    async def close(self) -> None:
        batchers, self._batchers = self._batchers, {}
        for batcher in batchers.values():
            await batcher.aclose()
        adapters, self._adapters = self._adapters or [], None
        for adapter in adapters:
            if adapter.close is not None:
                await adapter.close()

    async def invoke(self, record: Any) -> list[dict[str, Any]]:
        if self._adapters is None:
            await self.open()
        progress = ChainProgress.of(record)
        if isinstance(record, dict):  # carried as it grows: a retry, parking or snapshot sees it
            record[PROGRESS_FIELD] = progress
        index = progress.next_step(self.names)
        for name in progress.done:
            self.stats[name].resumed += 1
        if self.release_after in progress.done:  # resumed past it: let the key go at once
            self._let_key_go(record)
        view = progress.view(record)  # grows with each step's result
        while index is not None:
            step, adapter = self.steps[index], self._adapters[index]  # type: ignore[index]
            result = await self._run_step(step, adapter, progress, view)
            progress.finish(step.name, result)
            if result and view is not record:
                view.update(result)
            if self.progress_sink is not None:
                try:
                    await self.progress_sink(record, progress)
                except Exception as exc:  # the step is done (kept in memory); its retry resumes after it
                    raise StepError(step.name, exc) from exc
            if step.name == self.release_after:
                self._let_key_go(record)
            index = progress.next_step(self.names)
        if isinstance(record, dict):
            record.pop(PROGRESS_FIELD, None)  # finished: the output does not carry it
        out = progress.output(self.fields)
        return [] if out is None else [out]

    def _let_key_go(self, record: Any) -> None:
        if self._release is not None:
            self._release(record)

    async def _run_step(
        self, step: Step, adapter: FunctionAdapter, progress: ChainProgress, view: Any
    ) -> dict[str, Any] | None:
        stats = self.stats[step.name]
        if progress.started(step.name):
            stats.retries += 1
        stats.calls += 1
        started = time.perf_counter()
        try:
            batcher = self._batchers.get(step.name)
            raw = await (batcher.submit(view) if batcher is not None else adapter.call(view))
            results = adapter.to_results(raw)
        except Exception as exc:
            stats.failures += 1
            raise StepError(step.name, exc) from exc
        finally:
            stats.seconds += time.perf_counter() - started
        if not results:
            stats.misses += 1
            return None
        if len(results) > 1 or not isinstance(results[0], dict):
            stats.failures += 1
            got = f"{len(results)} results" if len(results) > 1 else type(results[0]).__name__
            raise StepError(step.name, ResultTypeError(f"a chain step gives one dict or a miss, got {got}"))
        return dict(results[0])


def _fields_of(step: Step) -> tuple[str, ...]:
    if step.fields is not None:
        return tuple(step.fields)
    ddl = declared_output_schema(step.function)
    return tuple(ddl_names(ddl)) if ddl else ()

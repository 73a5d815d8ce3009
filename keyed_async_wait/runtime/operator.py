"""The public operator: Flink's async wait operator with a key-ordered mode (FLIP-12/425/519)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterable, Iterable
from typing import Any

from ..core.elements import OutputMode, Watermark
from ..core.exceptions import ConfigError
from ..core.keys import DEFAULT_MAX_PARALLELISM
from ..core.latency import LatencyHistogram
from ..core.parking import PARKED, DeferPolicy, ParkedItem
from ..core.retry import RetryStrategy
from ..core.snapshot import SnapshotRecord
from ..core.spec import DEFAULT_BATCH_SIZE, DEFAULT_CAPACITY, OnClose, OnError, Output, WaitSpec
from .backend import adapt_function, check_release
from .consume import outputs_of
from .operator_state import OperatorState
from .overflow import MemoryOverflow, Overflow
from .runtime import Runtime
from .stats import OperatorStats, stats_of

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_CAPACITY",
    "DEFAULT_SET_ASIDE",
    "KeyedAsyncWaitOperator",
    "OperatorStats",
]

DEFAULT_SET_ASIDE = 100_000  # records a bare operator keeps set aside in memory at most


class KeyedAsyncWaitOperator(OperatorState):
    """Run an async action per record, concurrently, in ORDERED, UNORDERED or KEY_ORDERED mode.

    ``async for out in operator.process(source)`` reads a sync or async iterable of records and
    :class:`Watermark` objects and yields results and watermarks. ``function`` is an
    :class:`AsyncFunction` or an ``async def f(record)`` returning a result, a list of results or
    None.

    Parameters (keyword only):

    * ``mode``: an :class:`OutputMode` (or its name).
    * ``key``: field name, list of field names, callable, or ``WHOLE_RECORD``; required for
      KEY_ORDERED, optional otherwise (used for snapshots and error messages).
    * ``capacity``: records inside at most (running, retrying, blocked, finished but not taken;
      :meth:`process_batches` takes finished records as they finish, up to ``capacity`` more).
    * ``blocked_capacity`` (KEY_ORDERED, default 10,000): records that may wait behind their
      keys, outside ``capacity``, so that a hot key never holds the other keys back; past it a
      hot key's further records are set aside and come back in order (in memory here, up to
      ``set_aside_capacity``; Spark tasks spill them to local disk; ``key_ordered_stream``
      parks them), and other records waiting count against ``capacity``. 0: every record
      behind its key counts against it.
    * ``set_aside_capacity`` (KEY_ORDERED; default 100,000): records this operator keeps set
      aside in memory at most; at it the source is not read until some come back
      (back-pressure). The source is then never read more than ``2 * capacity +
      blocked_capacity + set_aside_capacity`` records ahead of the outputs (``3 * capacity``
      through :meth:`process_batches`); records already read of other keys run meanwhile.
      ``None``: no bound.
    * ``timeout``: seconds per record from the first attempt to the end, retries included.
    * ``retry``: a :class:`RetryStrategy`.
    * ``on_error``: ``"fail"`` ends the run at the first failure; ``"emit"`` yields a
      :class:`FailedRecord` in its place and goes on.
    * ``batch_size`` / ``buffer_timeout``: the active buffer of an action with ``invoke_batch``
      (``batch_size=None``: no batching). ``buffer_timeout=0``: a batch leaves when no more records
      are at hand; larger: wait up to that long to fill it; ``None`` (backlog): only full batches,
      unless the intake must wait or no batch is in flight (no timer at all).
    * ``output``: ``"results"`` yields each result; ``"pairs"`` ``(record, results)`` per record.
    * ``on_close``: what happens to running actions when the consumer stops early.
    * ``max_parallelism``: the number of key groups of snapshots.
    * ``eager_start``: run each action up to its first suspension before making a task (default:
      the function's ``eager_start``); see :attr:`AsyncFunction.eager_start`.
    * ``track_latency``: count each record's latency in :attr:`latency` (a LatencyHistogram).
    * ``emit_parked`` (KEY_ORDERED, ``output="pairs"``, ``process_batches``): a parked record
      (deferred, behind a parked key, or not started when :meth:`hold` was called) leaves as a
      :class:`ParkedItem` output the moment it is parked, instead of piling up in
      :attr:`leftover`; input read after a hold leaves the same way, as fast as it is read. A
      source chunk that is a :class:`ParkedBatch` replays parked records.
    """

    _overflow: Overflow | None  # where a run keeps what it sets aside (None: unbounded memory)

    def __init__(
        self,
        function: Any,
        *,
        mode: OutputMode | str,
        key: Any = None,
        capacity: int = DEFAULT_CAPACITY,
        blocked_capacity: int | None = None,
        timeout: float | None = None,
        retry: RetryStrategy | None = None,
        on_error: OnError = "fail",
        batch_size: int | None = DEFAULT_BATCH_SIZE,
        buffer_timeout: float | None = 0.0,
        output: Output = "results",
        on_close: OnClose = "cancel",
        max_parallelism: int = DEFAULT_MAX_PARALLELISM,
        eager_start: bool | None = None,
        track_latency: bool = False,
        defer: DeferPolicy | None = None,
        emit_parked: bool = False,
        set_aside_capacity: int | None = DEFAULT_SET_ASIDE,
    ) -> None:
        self._init(
            function,
            WaitSpec.of(
                mode,
                key=key,
                capacity=capacity,
                blocked_capacity=blocked_capacity,
                timeout=timeout,
                retry=retry,
                on_error=on_error,
                defer=defer,
                batch_size=batch_size,
                buffer_timeout=buffer_timeout,
                output=output,
                on_close=on_close,
                max_parallelism=max_parallelism,
                eager_start=eager_start,
                track_latency=track_latency,
                emit_parked=emit_parked,
            ),
        )
        self._overflow = MemoryOverflow(_set_aside_limit(set_aside_capacity))

    @classmethod
    def from_spec(
        cls, function: Any, spec: WaitSpec, overflow: Overflow | None = None
    ) -> KeyedAsyncWaitOperator:
        """An operator with ``spec`` (already checked, e.g. on a Spark driver); ``overflow``:
        where its one run keeps the records it sets aside (default: in memory)."""
        op = cls.__new__(cls)
        op._init(function, spec)
        op._overflow = overflow
        return op

    def _init(self, function: Any, spec: WaitSpec) -> None:
        self.spec = spec
        self.function = adapt_function(function)
        check_release(self.function, spec.on_error)
        if spec.eager_start is not None:
            self.function.eager = spec.eager_start
        # seconds per record, first attempt to result, over every run (fixed size)
        self.latency: LatencyHistogram | None = LatencyHistogram() if spec.track_latency else None
        self._runtime: Runtime | None = None
        self._replay: list[SnapshotRecord | Watermark] = []
        self._last_stats: OperatorStats | None = None
        self._parked_replay: list[ParkedItem] = []
        self._leftover: list[ParkedItem] = []
        self._overflow = None

    def __repr__(self) -> str:
        s = self.spec
        return (
            f"KeyedAsyncWaitOperator({self.function.name}, mode={s.mode.name}, key={_shown(s.key)}, "
            f"capacity={s.capacity}, timeout={s.timeout})"
        )

    # ------------------------------------------------------------------ processing

    async def process(self, source: Iterable[Any] | AsyncIterable[Any]) -> AsyncGenerator[Any, None]:
        """Yield results (or ``(record, results)`` pairs) and watermarks for ``source``."""
        runtime = await self._begin()
        intake = runtime.feed(source, batches=False)
        pairs = self.spec.output == "pairs"
        emit_errors = self.spec.on_error != "fail"
        try:
            out, handed_out = runtime.ctl.out, runtime.handed_out
            while True:
                if runtime.failure is not None:
                    raise runtime.failure
                while out:
                    entry = out.popleft()
                    if entry.watermark:
                        handed_out(entry)
                        yield entry.record
                        continue
                    if entry.failure is not None:
                        handed_out(entry)
                        if emit_errors and entry.failure is not PARKED:
                            yield entry.failure
                        continue
                    if pairs:
                        handed_out(entry)
                        yield (entry.record, entry.results)
                        continue
                    results = entry.results
                    assert results is not None
                    last = len(results) - 1
                    if last < 0:
                        handed_out(entry)
                        continue
                    for i in range(entry.emitted, last):
                        entry.emitted = i + 1
                        yield results[i]
                    entry.emitted = last + 1
                    handed_out(entry)
                    yield results[last]
                if runtime.failure is not None:
                    raise runtime.failure
                if runtime.finished:
                    return
                await runtime.wait_output()
        finally:
            await self._end(runtime, intake)

    async def process_batches(
        self,
        source: Iterable[Iterable[Any]] | AsyncIterable[Iterable[Any]],
        *,
        min_chunk: int = 1,
        linger: float = 0.0,
    ) -> AsyncGenerator[list[Any], None]:
        """Like :meth:`process`, over batches: reads iterables of records, yields lists of outputs.

        Cheaper per record; what a caller with columnar batches (Arrow) wants. With ``linger``
        (seconds), a chunk of fewer than ``min_chunk`` outputs waits up to that long for more
        before it is yielded (fewer, larger chunks for a consumer with a cost per chunk).

        Finished records are taken for the next chunk as they finish, a few at a time, and
        their places refilled in the same step from up to ``capacity`` records read ahead (a
        place does not wait for this generator's turn, nor for the rest of its round); at most
        ``capacity`` of them wait for the caller, past that they count against the capacity.
        A snapshot taken while the caller holds a chunk holds them, with their results.
        """
        runtime = await self._begin()
        intake = runtime.feed(source, batches=True)
        pairs = self.spec.output == "pairs"
        emit_errors = self.spec.on_error != "fail"
        try:
            out, run = runtime.ctl.out, runtime.run
            while True:
                if runtime.failure is not None:
                    raise runtime.failure
                ready = len(out) + len(run.taken)
                if ready and ready < min_chunk and linger > 0 and not runtime.finished:
                    await self._linger(runtime, min_chunk, linger)
                if runtime.spill:  # emit_parked: parked records leave as they are parked
                    yield runtime.take_spill()
                    continue
                if out or run.taken:
                    yield outputs_of(runtime.hand_out_all(), pairs, emit_errors, runtime.plain_output)
                    continue
                if runtime.finished:
                    if runtime.spill is not None and runtime.holding:
                        rest = runtime.leftover()  # held records that never started
                        if rest:
                            yield rest
                    return
                await runtime.wait_output()
        finally:
            await self._end(runtime, intake)

    @staticmethod
    async def _linger(runtime: Runtime, min_chunk: int, linger: float) -> None:
        """Wait up to ``linger`` seconds for ``min_chunk`` outputs, while there is room (finished
        records taken for the consumer wait outside the capacity, at most ``capacity`` of
        them; past that they count against it)."""
        out, run, loop = runtime.ctl.out, runtime.run, runtime.loop
        deadline = loop.time() + linger
        while (
            len(out) + len(run.taken) < min_chunk
            and run.room_left() > 0
            and runtime.failure is None
            and not runtime.finished
        ):
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            await runtime.wait_output(remaining)

    async def _begin(self) -> Runtime:
        if self._runtime is not None:
            raise RuntimeError("this operator is already processing a source; use one per stream")
        runtime = Runtime(
            self.spec, self.function, self._replay, self._parked_replay, self.latency, self._overflow
        )
        self._replay, self._parked_replay = [], []
        self._runtime = runtime
        if self.function.open is not None:
            try:
                await self.function.open()
            except BaseException:
                self._runtime = None
                raise
        return runtime

    async def _end(self, runtime: Runtime, intake: asyncio.Task[None]) -> None:
        try:
            await runtime.close(intake, wait_running=self.spec.on_close == "wait")
        finally:
            keep = runtime.spill is None and (runtime.holding or runtime.ctl.parked)
            self._leftover = runtime.leftover() if keep else []
            runtime.run.overflow.close()  # what it held is in the leftover now, or not needed
            self._last_stats = stats_of(runtime)
            self._runtime = None
            if self.function.close is not None:
                await self.function.close()


def _shown(key: Any) -> str:
    """A key as it was given (one field by its name)."""
    return repr(key[0] if isinstance(key, tuple) and len(key) == 1 else key)


def _set_aside_limit(value: Any) -> int | None:
    """``set_aside_capacity`` as a bound (None: no bound), checked when the operator is made."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError("set_aside_capacity", value, "an integer >= 0, or None (no bound)")
    return value

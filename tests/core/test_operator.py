"""Behaviour of the operator: modes, timeouts, retries, errors, batching, keys, shutdown."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import pytest

from keyed_async_wait import (
    WHOLE_RECORD,
    AsyncFunction,
    ConfigError,
    RecordFailedError,
    RecordKeyError,
    RecordTimeoutError,
    ResultTypeError,
    RetryStrategy,
    lookup_miss,
)
from keyed_async_wait.operator import FailedRecord, KeyedAsyncWaitOperator, OutputMode, Watermark

from .helpers import Flaky, TurnsAction, collect, ids, next_turn, run


def recs(n: int, keys: int = 3, lat: int = 0) -> list[dict]:
    return [{"id": i, "k": i % keys, "lat": lat} for i in range(n)]


# ---------------------------------------------------------------- functions and results


def test_plain_function_may_return_one_result_a_list_or_none() -> None:
    async def f(r: dict) -> Any:
        return {0: None, 1: r["id"], 2: [r["id"], r["id"]]}[r["id"] % 3]

    out = run(collect(KeyedAsyncWaitOperator(f, mode="ordered"), recs(6)))
    assert out == [1, 2, 2, 4, 5, 5]


def test_async_function_with_open_and_close_in_the_loop() -> None:
    events: list[str] = []

    class Fn(AsyncFunction[dict, int]):
        async def open(self) -> None:
            asyncio.get_running_loop()  # raises outside a loop
            events.append("open")

        async def invoke(self, record: dict) -> list[int]:
            return [record["id"] * 10]

        async def close(self) -> None:
            events.append("close")

    out = run(collect(KeyedAsyncWaitOperator(Fn(), mode=OutputMode.ORDERED), recs(3)))
    assert out == [0, 10, 20]
    assert events == ["open", "close"]


def test_invoke_returning_a_non_list_is_a_clear_error() -> None:
    class Bad(AsyncFunction[dict, int]):
        async def invoke(self, record: dict) -> Any:
            return 5

    op = KeyedAsyncWaitOperator(Bad(), mode="ordered", key="k")
    with pytest.raises(RecordFailedError, match=r"key 0 .*must return a list") as info:
        run(collect(op, recs(1)))
    assert isinstance(info.value.__cause__, ResultTypeError)


def test_sync_function_is_rejected_per_record_with_a_clear_error() -> None:
    def not_async(r: dict) -> dict:
        return r

    op = KeyedAsyncWaitOperator(not_async, mode="unordered", key="k")
    with pytest.raises(RecordFailedError, match="must return an awaitable"):
        run(collect(op, recs(1)))


def test_async_source_and_pairs_output() -> None:
    async def source() -> AsyncIterator[Any]:
        for r in recs(5):
            await next_turn()
            yield r

    async def f(r: dict) -> Any:
        return None if r["id"] == 2 else r["id"]

    op = KeyedAsyncWaitOperator(f, mode="ordered", output="pairs")
    out = run(collect(op, source()))
    assert [(r["id"], res) for r, res in out] == [(0, [0]), (1, [1]), (2, []), (3, [3]), (4, [4])]


# ---------------------------------------------------------------- watermarks


def test_pending_watermark_does_not_stall_intake() -> None:
    """A record after a watermark starts while one before it still runs; it leaves after it."""

    async def main() -> list[Any]:
        release = asyncio.Event()
        started_after_watermark = asyncio.Event()

        async def f(r: dict) -> int:
            if r["id"] == 0:
                await release.wait()
            else:
                started_after_watermark.set()
            return r["id"]

        async def release_when_second_started() -> None:
            await started_after_watermark.wait()
            release.set()

        helper = asyncio.create_task(release_when_second_started())
        op = KeyedAsyncWaitOperator(f, mode="key_ordered", key="id")
        out = await collect(op, [{"id": 0}, Watermark(1), {"id": 1}])
        await helper
        return out

    assert run(main(), bound=5) == [0, Watermark(1), 1]


# ---------------------------------------------------------------- timeouts


def test_timeout_raises_a_timeout_error_naming_the_key() -> None:
    async def hang(r: dict) -> int:
        await asyncio.Event().wait()
        return 0

    op = KeyedAsyncWaitOperator(hang, mode="key_ordered", key="k", timeout=0.05)
    with pytest.raises(TimeoutError, match=r"key 0 .*timed out after 0\.05 s") as info:
        run(collect(op, recs(1)), bound=5)
    assert isinstance(info.value, RecordTimeoutError)
    assert info.value.key == 0


def test_timeout_fallback_from_the_function() -> None:
    class WithFallback(AsyncFunction[dict, str]):
        async def invoke(self, record: dict) -> list[str]:
            if record["id"] == 1:
                await asyncio.Event().wait()
            return ["ok"]

        def timeout(self, record: dict) -> list[str]:
            return ["fallback"]

    op = KeyedAsyncWaitOperator(WithFallback(), mode="ordered", timeout=0.05)
    assert run(collect(op, recs(3)), bound=5) == ["ok", "fallback", "ok"]
    assert op.stats.timeouts == 1


def test_timeout_counts_retries_too() -> None:
    calls = 0

    async def always_fails(r: dict) -> int:
        nonlocal calls
        calls += 1
        raise Flaky("down")

    retry = RetryStrategy.fixed_delay(1000, 0.01)
    op = KeyedAsyncWaitOperator(always_fails, mode="unordered", timeout=0.1, retry=retry)
    with pytest.raises(RecordTimeoutError):
        run(collect(op, recs(1)), bound=5)
    assert 2 <= calls < 1000


# ---------------------------------------------------------------- retries


def test_fixed_delay_retries_then_succeeds() -> None:
    action = TurnsAction(fail={(0, 1), (0, 2)})
    op = KeyedAsyncWaitOperator(action, mode="ordered", retry=RetryStrategy.fixed_delay(3, 0.0))
    assert ids(run(collect(op, recs(2)))) == [0, 1]
    assert action.attempts[0] == 3
    assert op.stats.retries == 2


def test_exhausted_retries_fail_with_key_attempts_and_cause() -> None:
    action = TurnsAction(fail={(1, 1), (1, 2)})
    op = KeyedAsyncWaitOperator(action, mode="ordered", key="k", retry=RetryStrategy.fixed_delay(2, 0.0))
    with pytest.raises(RecordFailedError, match="key 1 failed after 2 attempts: Flaky") as info:
        run(collect(op, recs(3)))
    assert isinstance(info.value.__cause__, Flaky)
    assert info.value.attempts == 2


def test_non_retryable_errors_are_not_retried() -> None:
    class Permanent(Exception):
        retryable = False

    calls = 0

    async def f(r: dict) -> int:
        nonlocal calls
        calls += 1
        raise Permanent("400 bad request")

    op = KeyedAsyncWaitOperator(f, mode="ordered", retry=RetryStrategy.fixed_delay(5, 0.0))
    with pytest.raises(RecordFailedError, match="after 1 attempt: Permanent"):
        run(collect(op, recs(1)))
    assert calls == 1


def test_lookup_miss_is_retried_and_the_last_result_kept() -> None:
    seen: dict[int, int] = {}

    async def f(r: dict) -> Any:
        seen[r["id"]] = seen.get(r["id"], 0) + 1
        if r["id"] == 0 and seen[0] < 3:
            return None  # miss, found on the third attempt
        if r["id"] == 1:
            return None  # never found
        return r["id"]

    retry = RetryStrategy.fixed_delay(4, 0.0, retry_on_result=lookup_miss)
    op = KeyedAsyncWaitOperator(f, mode="ordered", output="pairs", retry=retry)
    out = run(collect(op, recs(3)))
    assert [res for _, res in out] == [[0], [], [2]]
    assert seen == {0: 3, 1: 4, 2: 1}


def test_exponential_backoff_delays_grow_and_are_capped() -> None:
    r = RetryStrategy.exponential_backoff(6, 0.1, 0.5, 2.0)
    delays = [r.next_delay(a, 0.0, exception=Flaky(), now=0.0) for a in range(1, 7)]
    assert delays == [0.1, 0.2, 0.4, 0.5, 0.5, None]
    jittered = RetryStrategy.exponential_backoff(3, 0.1, 1.0, jitter=0.05)
    for _ in range(20):
        d = jittered.next_delay(1, 0.0, exception=Flaky(), now=0.0)
        assert d is not None and 0.1 <= d <= 0.15


def test_key_ordered_retrying_record_holds_its_key() -> None:
    action = TurnsAction(fail={(0, 1), (0, 2)})
    op = KeyedAsyncWaitOperator(action, mode="key_ordered", key="k", retry=RetryStrategy.fixed_delay(3, 0.01))
    records = [{"id": 0, "k": "a", "lat": 1}, {"id": 1, "k": "a"}, {"id": 2, "k": "b"}]
    out = run(collect(op, records))
    assert action.starts_per_key["a"] == [0, 0, 0, 1]
    assert ids(out).index(0) < ids(out).index(1)
    assert ids(out)[0] == 2  # key b did not wait for key a's retries


# ---------------------------------------------------------------- error output


def test_error_output_keeps_going_and_loses_nothing() -> None:
    action = TurnsAction(fail={(1, 1), (1, 2), (4, 1)})
    op = KeyedAsyncWaitOperator(
        action, mode="ordered", key="k", retry=RetryStrategy.fixed_delay(2, 0.0), on_error="emit"
    )
    out = run(collect(op, recs(6)))
    failed = [x for x in out if isinstance(x, FailedRecord)]
    assert [f.record["id"] for f in failed] == [1]
    assert failed[0].error_type == "Flaky" and failed[0].attempts == 2 and failed[0].key == 1
    assert [x["id"] if isinstance(x, dict) else "F" for x in out] == [0, "F", 2, 3, 4, 5]


# ---------------------------------------------------------------- keys


def test_missing_or_none_key_is_a_clear_error() -> None:
    async def f(r: dict) -> int:
        return 1

    op = KeyedAsyncWaitOperator(f, mode="key_ordered", key="order_id")
    with pytest.raises(RecordKeyError, match="key field 'order_id' is missing or None"):
        run(collect(op, [{"order_id": 1}, {"order_id": None}]))
    with pytest.raises(RecordKeyError, match="'customer'"):
        run(
            collect(
                KeyedAsyncWaitOperator(f, mode="key_ordered", key=["order_id", "customer"]), [{"order_id": 1}]
            )
        )


def test_whole_record_and_composite_and_callable_keys() -> None:
    action = TurnsAction()
    records = [{"id": i, "k": (i % 2, i % 3), "lat": 1, "tags": [i % 2]} for i in range(12)]
    for key in (WHOLE_RECORD, ["id", "lat"], lambda r: r["k"], "k"):
        op = KeyedAsyncWaitOperator(action, mode="key_ordered", key=key)
        assert sorted(ids(run(collect(op, records)))) == list(range(12))


def test_key_ordered_without_a_key_is_a_config_error() -> None:
    async def f(r: dict) -> int:
        return 1

    with pytest.raises(ConfigError, match=r"key=None .*KEY_ORDERED needs a key"):
        KeyedAsyncWaitOperator(f, mode="key_ordered")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mode": "sideways"}, "mode='sideways' .*ORDERED, UNORDERED, KEY_ORDERED"),
        ({"mode": "ordered", "capacity": 0}, "capacity=0 .*>= 1"),
        ({"mode": "ordered", "timeout": -1}, "timeout=-1"),
        ({"mode": "ordered", "on_error": "ignore"}, "on_error='ignore' .*'fail', 'emit'"),
        ({"mode": "ordered", "key": 3}, "key=3 .*field name"),
        ({"mode": "ordered", "retry": 3}, "retry=3 .*RetryStrategy"),
    ],
)
def test_bad_parameters_name_the_parameter_and_the_allowed_values(kwargs: dict, match: str) -> None:
    async def f(r: dict) -> int:
        return 1

    with pytest.raises(ConfigError, match=match):
        KeyedAsyncWaitOperator(f, **kwargs)


# ---------------------------------------------------------------- batching


class BatchAction(AsyncFunction[dict, dict]):
    def __init__(self, fail_ids: set[int] = frozenset(), turns: int = 1) -> None:  # type: ignore[assignment]
        self.batches: list[list[int]] = []
        self.fail_ids = set(fail_ids)
        self.turns = turns
        self.running_keys: set[Any] = set()
        self.overlap = False

    async def invoke(self, record: dict) -> list[dict]:
        raise AssertionError("batched action must be called through invoke_batch")

    async def invoke_batch(self, records: list[dict]) -> list[Any]:
        keys = [r["k"] for r in records]
        if len(set(keys)) != len(keys) or self.running_keys & set(keys):
            self.overlap = True
        self.running_keys |= set(keys)
        self.batches.append([r["id"] for r in records])
        for _ in range(self.turns):
            await next_turn()
        self.running_keys -= set(keys)
        return [Flaky(str(r["id"])) if r["id"] in self.fail_ids else [r] for r in records]


def test_batches_carry_at_most_one_record_per_key() -> None:
    action = BatchAction()
    op = KeyedAsyncWaitOperator(action, mode="key_ordered", key="k", capacity=50, batch_size=8)
    out = run(collect(op, recs(40, keys=5)))
    assert sorted(ids(out)) == list(range(40))
    assert not action.overlap
    assert max(len(b) for b in action.batches) <= 8
    assert len(action.batches) < 40  # records really were gathered
    assert op.stats.batches == len(action.batches)


def test_batch_records_fail_and_retry_one_by_one() -> None:
    action = BatchAction(fail_ids={3})
    op = KeyedAsyncWaitOperator(
        action, mode="ordered", retry=RetryStrategy.fixed_delay(2, 0.0), on_error="emit", capacity=20
    )
    out = run(collect(op, recs(6)))
    assert [x["id"] if isinstance(x, dict) else x.record["id"] for x in out] == list(range(6))
    assert isinstance(out[3], FailedRecord) and out[3].attempts == 2


def test_batch_returning_the_wrong_count_is_a_clear_error() -> None:
    class Short(AsyncFunction[dict, dict]):
        async def invoke(self, record: dict) -> list[dict]:
            return [record]

        async def invoke_batch(self, records: list[dict]) -> list[Any]:
            return [[r] for r in records[:-1]]

    op = KeyedAsyncWaitOperator(Short(), mode="unordered", capacity=10)
    with pytest.raises(RecordFailedError, match="sent 3 records, got 2 values"):
        run(collect(op, recs(3)))


def test_process_batches_yields_lists() -> None:
    action = BatchAction(turns=0)
    op = KeyedAsyncWaitOperator(action, mode="ordered", capacity=100)
    chunks = run(_collect_batches(op, [recs(10), recs(15)]))
    assert [x["id"] for chunk in chunks for x in chunk] == list(range(10)) + list(range(15))


async def _collect_batches(op: KeyedAsyncWaitOperator, source: Any) -> list[list[Any]]:
    return [chunk async for chunk in op.process_batches(source)]


# ---------------------------------------------------------------- capacity and shutdown


def test_capacity_pauses_intake_and_stats_show_blocked_keys() -> None:
    async def main() -> None:
        gate = asyncio.Event()
        started = asyncio.Event()
        pulled = 0

        def source() -> Any:
            nonlocal pulled
            for r in recs(20, keys=2):
                pulled += 1
                yield r

        async def f(r: dict) -> int:
            started.set()
            await gate.wait()
            return r["id"]

        # blocked_capacity=0: records behind their keys count against the capacity
        op = KeyedAsyncWaitOperator(f, mode="key_ordered", key="k", capacity=5, blocked_capacity=0)
        async with aclosing(op.process(source())) as outputs:
            first = asyncio.ensure_future(outputs.__anext__())
            await started.wait()
            for _ in range(5):
                await next_turn()
            stats = op.stats
            assert pulled == 5 and stats.inside == 5
            assert stats.in_flight == 2 and stats.blocked_keys == 2 and stats.blocked_records == 3
            gate.set()
            assert await first == 0
            rest = [x async for x in outputs]
        assert sorted(rest) == list(range(1, 20))

    run(main(), bound=5)


@pytest.mark.parametrize("on_close", ["cancel", "wait"])
def test_stopping_early_leaves_no_task_behind(on_close: str) -> None:
    finished: list[int] = []
    cancelled: list[int] = []

    async def main() -> None:
        before = asyncio.all_tasks()

        async def f(r: dict) -> int:
            try:
                for _ in range(r["id"] % 4 * 3):
                    await next_turn()
            except asyncio.CancelledError:
                cancelled.append(r["id"])
                raise
            finished.append(r["id"])
            return r["id"]

        op = KeyedAsyncWaitOperator(f, mode="unordered", capacity=8, on_close=on_close, timeout=5)
        async with aclosing(op.process(recs(100))) as outputs:
            async for x in outputs:
                if x >= 3:
                    break
        assert asyncio.all_tasks() == before

    run(main(), bound=5)
    gc.collect()
    if on_close == "cancel":
        assert cancelled
    else:
        assert not cancelled


def test_a_failure_cancels_the_rest_cleanly() -> None:
    async def main() -> None:
        before = asyncio.all_tasks()

        async def f(r: dict) -> int:
            if r["id"] == 3:
                raise ValueError("boom")
            await asyncio.Event().wait()
            return 0

        op = KeyedAsyncWaitOperator(f, mode="unordered", capacity=10, key="k")
        with pytest.raises(RecordFailedError, match="ValueError: boom"):
            await collect(op, recs(10))
        assert asyncio.all_tasks() == before

    run(main(), bound=5)


def test_a_source_error_reaches_the_consumer() -> None:
    def source() -> Any:
        yield {"id": 0, "k": 0}
        raise OSError("source broke")

    async def f(r: dict) -> int:
        return 1

    with pytest.raises(OSError, match="source broke"):
        run(collect(KeyedAsyncWaitOperator(f, mode="ordered"), source()))


def test_long_same_key_chains_of_instant_records_do_not_recurse() -> None:
    async def instant(r: dict) -> int:
        return r["id"]

    op = KeyedAsyncWaitOperator(instant, mode="key_ordered", key="k", capacity=20_000)
    out = run(collect(op, recs(20_000, keys=1)))
    assert out == list(range(20_000))


def test_retry_after_on_the_exception_sets_the_least_delay() -> None:
    class Busy(Exception):
        retry_after = 2.5

    r = RetryStrategy.fixed_delay(3, 0.1)
    assert r.next_delay(1, 0.0, exception=Busy(), now=0.0) == 2.5
    assert r.next_delay(1, 0.0, exception=Flaky(), now=0.0) == 0.1

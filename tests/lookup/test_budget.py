"""One budget for the whole job, in a real Redis, against the real test service: calls in
flight and per second held across event loops (as across worker processes), a killed worker's
places returned, the service's RateLimit headers followed as they shrink and grow the quota,
two jobs sharing by weight, cost units charged and settled, and a Redis that cannot be reached
stopping the calls rather than letting them run unlimited."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from dataclasses import dataclass
from typing import Any

import pytest

from keyed_async_wait import RecordFailedError, RetryStrategy
from keyed_async_wait.app.quota import Quota
from keyed_async_wait.core.exceptions import ConfigError
from keyed_async_wait.operator import KeyedAsyncWaitOperator
from lookup import Budget, Cost, Field, HttpLookup, HttpWrite, Limits, ServiceUnavailableError
from lookup.quota_headers import CALLS, ServiceQuota

from ..core.helpers import run
from .loops import assert_rate_held, in_threads

RETRY = RetryStrategy.fixed_delay(20, 0.05)


def users(url: str, limits: Limits, **params: str) -> HttpLookup:
    query = {"seq": "{seq}", **params}
    return HttpLookup(f"{url}/users/{{user_id}}", params=query, fields=[Field("name")], limits=limits)


async def through(fn: HttpLookup, rows: list[dict[str, Any]], capacity: int = 50) -> list[Any]:
    op = KeyedAsyncWaitOperator(fn, mode="unordered", output="pairs", capacity=capacity, retry=RETRY)
    try:
        return [pair async for pair in op.process(rows)]
    finally:
        await fn.aclose()


def rows(start: int, count: int, **extra: Any) -> list[dict[str, Any]]:
    return [{"seq": n, "user_id": n % 500, **extra} for n in range(start, start + count)]


def test_calls_in_flight_are_held_for_the_whole_job(service: Any, redis_url: str) -> None:
    url, state = service
    state.latency = 0.02
    budget = Budget(redis_url, f"t{uuid.uuid4().hex[:8]}", in_flight=6)
    done = in_threads(3, lambda i: run(through(users(url, Limits(budget=budget)), rows(i * 100, 100))))
    assert sorted(r["seq"] for part in done for r, _ in part) == list(range(300))
    assert 3 <= state.peak_in_flight <= 6  # three loops of 50 each: six at most, job-wide


def test_calls_per_second_are_held_for_the_whole_job(service: Any, redis_url: str) -> None:
    url, state = service
    state.record_calls = True
    rate = 100.0
    budget = Budget(redis_url, f"t{uuid.uuid4().hex[:8]}", rate=rate, headroom=0)
    in_threads(2, lambda i: run(through(users(url, Limits(budget=budget)), rows(i * 80, 80))))
    starts = sorted(start for _, start, _, _ in state.calls)
    assert len(starts) == 160
    assert_rate_held(starts, rate, burst=1)  # any window of calls, both loops together
    assert starts[-1] - starts[0] >= 159 / rate * 0.9  # one budget: two per-loop ones take half


def test_a_killed_workers_places_come_back_within_the_lease(redis_url: str) -> None:
    """A process takes every place in flight and is killed with SIGKILL mid-call: nothing gives
    its leases back, yet they expire ``lease`` seconds after their last renewal."""
    name = f"t{uuid.uuid4().hex[:8]}"
    child = textwrap.dedent(
        f"""
        import asyncio, sys
        from lookup import Budget
        async def main():
            client = Budget({redis_url!r}, {name!r}, in_flight=3, lease=1.0).connect()
            for _ in range(3):
                await client.acquire(1, lookup_key=None, service="test")
            print("held", flush=True)
            await asyncio.Event().wait()
        asyncio.run(main())
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)

        async def acquire() -> float:
            client = Budget(redis_url, name, in_flight=3, lease=1.0).connect()
            loop = asyncio.get_running_loop()
            started = loop.time()
            try:
                await client.acquire(1, lookup_key=None, service="test")
                return loop.time() - started
            finally:
                await client.aclose()

        waited = run(acquire(), bound=10)
        assert 0.2 <= waited <= 3.0, waited  # the dead leases expired (1 s after the last renewal)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


class ChangingQuota(Quota):
    """A quota that changes as calls are admitted: ``phases`` of (calls per second, admitted
    calls before the next phase)."""

    def __init__(self, phases: list[tuple[int, int]]) -> None:
        super().__init__(calls=phases[0][0], window=1.0)
        self.phases, self.phase_at = phases, []

    def admit(self, units: float, now: float | None = None) -> tuple[bool, dict[str, str]]:
        _, until = self.phases[0]
        if self.admitted >= until and len(self.phases) > 1:
            self.phases = self.phases[1:]
            self.calls = self.phases[0][0]
            self.phase_at.append(self.admitted)
        return super().admit(units, now)


@pytest.mark.paced
def test_the_job_follows_the_services_headers_as_the_quota_shrinks_and_grows(
    service: Any, redis_url: str
) -> None:
    url, state = service
    state.record_calls = True
    quota = state.quota = ChangingQuota([(40, 60), (15, 90), (80, 10_000)])
    budget = Budget(redis_url, f"t{uuid.uuid4().hex[:8]}", rate=1000)  # configured far too high
    in_threads(2, lambda i: run(through(users(url, Limits(budget=budget)), rows(i * 125, 125)), bound=40))
    starts = sorted(start for _, start, _, _ in state.calls)
    assert len(starts) == 250
    # each phase's calls per second, from the service's log (the first window's calls go out
    # before any answer told the quota, and the first answers of a phase still tell the old
    # one: some slack at each change). The upper bounds are the quota's; the lower ones only
    # show the job follows it down and up again (a busy machine asks more slowly than it may).
    # The first phase's bound has the most slack (those first calls, and the service's fixed
    # windows): it reads 42-46 calls a second here, 50.2 once on a loaded CI machine; a budget
    # that ignored the headers reads 264 (its calls bunched at the windows' edges)
    cut = [0, 60, 90, 250]
    rates = [(cut[p + 1] - cut[p] - 1) / (starts[cut[p + 1] - 1] - starts[cut[p]]) for p in range(3)]
    assert 18 <= rates[0] <= 56 and 7 <= rates[1] <= 17 and 40 <= rates[2] <= 84, rates
    assert quota.rejected <= 15, quota.rejected  # a handful at the changes, not one per call


def test_two_jobs_share_the_places_by_weight(service: Any, redis_url: str) -> None:
    url, state = service
    state.latency, state.record_calls = 0.02, True
    name = f"t{uuid.uuid4().hex[:8]}"
    jobs = [Budget(redis_url, name, in_flight=8, weight=1), Budget(redis_url, name, in_flight=8, weight=3)]

    def job(i: int) -> Any:
        return run(through(users(url, Limits(budget=jobs[i]), job=str(i)), rows(i * 1000, 400)), bound=40)

    in_threads(2, job)
    mine = {i: [(start, end) for _, start, end, q in state.calls if q["job"] == str(i)] for i in (0, 1)}
    # while both jobs asked: from the later one's first call (on a loaded machine one thread
    # may start well after the other, which then has every place) to the earlier one's end
    begin = max(min(start for start, _ in calls) for calls in mine.values())
    both = min(max(end for _, end in calls) for calls in mine.values())
    done = {i: sum(1 for start, end in calls if start >= begin and end <= both) for i, calls in mine.items()}
    assert 2.0 <= done[1] / done[0] <= 4.5, done  # weight 3 against 1
    assert state.peak_in_flight <= 8


def test_cost_units_are_charged_per_record_and_settled_by_the_answer(service: Any, redis_url: str) -> None:
    """Each record says it will cost 5 units (``tokens``); the service says it used 10; the
    budget of 200 units/s therefore lets about 20 calls a second through once settled."""
    url, state = service
    state.record_calls = True
    state.quota = Quota()  # no limit: it only reports the units the request declared
    budget = Budget(redis_url, f"t{uuid.uuid4().hex[:8]}", units_rate=200, headroom=0)
    cost = Cost(column="tokens", from_field="usage.units")
    fn = users(url, Limits(budget=budget, cost=cost), units="10")
    assert len(run(through(fn, rows(0, 60, tokens=5)), bound=30)) == 60
    starts = sorted(start for _, start, _, _ in state.calls)
    pace = (len(starts) - 1) / (starts[-1] - starts[0])
    assert 15 <= pace <= 26, pace  # 10 units a call against 200 a second, not 5 against 200
    with pytest.raises(ConfigError, match="cost column"):
        Cost(column="tokens").estimate([{"tokens": None}], 1)


def test_without_redis_no_call_starts_and_the_record_may_be_retried(service: Any) -> None:
    url, state = service
    budget = Budget("redis://:hunter2@127.0.0.1:1/0", "nowhere", in_flight=5)
    assert "hunter2" not in repr(budget) and "hunter2" not in repr(Limits(budget=budget))
    fn = users(url, Limits(budget=budget))
    op = KeyedAsyncWaitOperator(fn, mode="unordered", output="pairs")

    async def one() -> None:
        try:
            async for _ in op.process(rows(0, 1)):
                pass
        finally:
            await fn.aclose()

    with pytest.raises(RecordFailedError) as failed:
        run(one())
    cause = failed.value.__cause__
    assert isinstance(cause, ServiceUnavailableError) and cause.retryable
    assert "budget 'nowhere'" in str(failed.value) and "hunter2" not in str(failed.value)
    assert state.requests == 0


def test_a_budget_is_checked_when_made(redis_url: str) -> None:
    with pytest.raises(ConfigError, match="in_flight"):
        Budget(redis_url, "x", in_flight=0)
    with pytest.raises(ConfigError, match="budget name"):
        Budget(redis_url, "a b", rate=1)
    with pytest.raises(ConfigError, match="headroom"):
        Budget(redis_url, "x", rate=1, headroom=0.9)
    with pytest.raises(ConfigError, match="budget="):
        Limits(cost=Cost())


def test_units_given_back_are_never_lost_at_the_default_burst(service: Any, redis_url: str) -> None:
    """Each record is estimated at 50 units; the service says it used 5. At 500 units/s and
    the default burst (1 unit) the budget follows what was used: about 100 calls a second once
    settled, not the 10 the estimates allow (units given back are a credit the bucket's cap
    does not cut, and the charges learn what calls use)."""
    url, state = service
    state.record_calls = True
    state.quota = Quota()
    budget = Budget(redis_url, f"t{uuid.uuid4().hex[:8]}", units_rate=500, headroom=0)
    cost = Cost(column="tokens", from_field="usage.units")
    fn = users(url, Limits(budget=budget, cost=cost), units="5")
    assert len(run(through(fn, rows(0, 120, tokens=50)), bound=30)) == 120
    starts = sorted(start for _, start, _, _ in state.calls)
    pace = (len(starts) - 1) / (starts[-1] - starts[0])
    print("pace", pace)
    assert pace >= 40, pace  # the estimates alone allow 10 a second


@pytest.mark.paced
@pytest.mark.parametrize("form", ["x-ratelimit", "retry-after"])
def test_a_quota_in_any_form_and_short_window_is_followed(service: Any, redis_url: str, form: str) -> None:
    """60 calls per 2-second window, no rate configured: stated as X-RateLimit-* (an epoch
    reset, no window: learned from the resets) or only as a 429's Retry-After (learned from
    two windows' ends and what they admitted). What is left holds calls back however short
    the window; a cold start paces its first calls so that no burst overruns the quota."""
    url, state = service
    quota = state.quota = Quota(calls=60, window=2.0, form=form)
    budget = Budget(redis_url, f"t{uuid.uuid4().hex[:8]}", in_flight=40)
    in_threads(2, lambda i: run(through(users(url, Limits(budget=budget)), rows(i * 160, 160)), bound=60))
    asked = quota.admitted + quota.rejected
    assert quota.admitted == 320
    # X-RateLimit: none refused (two at most: a clock's tick, or a call a busy machine held
    # past a window's end, as CI saw once in 2026-11); Retry-After: those that tell the
    # windows (a cold start, then two at most in each of two windows), then none. A budget
    # that ignored the headers sees hundreds refused (384 with none, measured).
    assert quota.rejected <= (2 if form == "x-ratelimit" else 9), (quota.rejected, asked)
    # the share of the quota used, first admission to last: about 1.0 alone or beside two busy
    # processes; 0.78 once in a CI run (Retry-After), its 320 calls over 13.7 s, not 10.7. A
    # budget that held a whole window back after each 429 uses about half.
    assert quota.used() >= 0.7, quota.used()


def test_writes_hold_the_budget_they_share_with_the_lookups_of_the_service(
    service: Any, redis_url: str
) -> None:
    """An API that admits 40 calls per one-second window (IETF headers): fenced writes and
    lookups of the same service, in two loops sharing one budget with no rate given, stay
    within it together."""
    url, state = service
    quota = state.quota = Quota(calls=40, window=1.0)
    name = f"t{uuid.uuid4().hex[:8]}"
    write = HttpWrite(
        url + "/records/{id}",
        fields=["v"],
        version="v",
        limits=Limits(budget=Budget(redis_url, name, in_flight=20)),
    )

    def work(i: int) -> Any:
        if i == 0:
            op = KeyedAsyncWaitOperator(write, mode="key_ordered", key="id", output="pairs", retry=RETRY)

            async def writes() -> list[Any]:
                try:
                    return [pair async for pair in op.process({"id": n % 30, "v": n} for n in range(120))]
                finally:
                    await write.aclose()

            return run(writes(), bound=60)
        return run(
            through(users(url, Limits(budget=Budget(redis_url, name, in_flight=20))), rows(0, 120)), bound=60
        )

    written, looked_up = in_threads(2, work, bound=90)
    assert all(res[0]["applied"] for _, res in written) and len(looked_up) == 120
    assert quota.admitted == 240 and quota.rejected <= 1, quota.rejected
    # six windows' worth of calls: a window's share of slack at a busy start or end is 1/7
    # (0.84 seen once with the machine busy); a budget that held calls back would show far less
    assert quota.used() >= 0.8, quota.used()
    assert write.stats.applied == 120


def test_a_write_takes_only_limits() -> None:
    with pytest.raises(ConfigError, match="limits"):
        HttpWrite("http://x/{id}", fields=["a"], version="v", limits={"rate": 5})  # type: ignore[arg-type]


@dataclass
class RisingQuota(Quota):
    """A Retry-After-only quota that doubles once it has admitted ``rise_at`` calls."""

    rise_at: int = 0
    risen_at: float | None = None

    def admit(self, units: float, now: float | None = None) -> tuple[bool, dict[str, str]]:
        if self.risen_at is None and self.admitted >= self.rise_at and self.calls is not None:
            self.calls, self.risen_at = 2 * self.calls, time.monotonic()
        return super().admit(units, now)


@pytest.mark.paced
def test_a_retry_after_only_quota_that_rises_is_found(service: Any, redis_url: str) -> None:
    """A service that states nothing but Retry-After, 20 calls a one-second window, doubled
    mid-run: the budget probes its learned quota upward, so after the rise some window admits
    more than the old quota (a budget that only learned and cut would stay at or under 20),
    and the probes that find no more room cost a refusal or two each."""
    url, state = service
    state.record_calls = True
    quota = state.quota = RisingQuota(calls=20, window=1.0, form="retry-after", rise_at=160)
    budget = Budget(redis_url, f"t{uuid.uuid4().hex[:8]}", in_flight=40)
    in_threads(2, lambda i: run(through(users(url, Limits(budget=budget)), rows(i * 300, 300)), bound=120))
    assert quota.admitted == 600 and quota.risen_at is not None
    per_window: dict[int, int] = {}
    for _, start, _, _ in state.calls:
        if start >= quota.risen_at:
            per_window[math.floor(start)] = per_window.get(math.floor(start), 0) + 1
    assert max(per_window.values()) > 24, sorted(per_window.items())
    assert quota.rejected <= 30, quota.rejected  # the cold start, the learning, the probes


def test_a_pause_earns_the_pace_no_burst(redis_url: str) -> None:
    """Calls reserved at a stated pace of 20 a second and held back by a Retry-After pause keep
    their places in the pace: in the second after the pause the clients start no more calls
    than the pace allows (a pause that refilled the pace would add the held-back calls on top,
    and the service would refuse them at the window's end)."""
    budget = Budget(redis_url, f"t{uuid.uuid4().hex[:8]}", in_flight=40)
    stated = {CALLS: ServiceQuota(CALLS, remaining=100, reset=5.0, limit=20, window=1.0)}

    async def go() -> tuple[list[float], float]:
        loop = asyncio.get_running_loop()
        clients = [budget.connect() for _ in range(6)]
        starts: list[float] = []
        try:
            lease = await clients[0].acquire(1, lookup_key=0, service="s")
            await clients[0].release(lease, outcome="ok", latency=0.01, quotas=stated)

            async def calls(client: Any, count: int) -> None:
                for n in range(count):
                    lease = await client.acquire(1, lookup_key=n, service="s")
                    starts.append(loop.time())
                    await client.release(lease, outcome="ok", latency=0.0)

            workers = [loop.create_task(calls(client, 8)) for client in clients[1:]]
            lease = await clients[0].acquire(1, lookup_key=0, service="s")
            paused = await clients[0].release(lease, outcome="overload", latency=0.01, retry_after=1.0)
            resumed = loop.time() + paused
            await asyncio.wait_for(asyncio.gather(*workers), 30)
            return starts, resumed
        finally:
            for client in clients:
                await client.aclose()

    starts, resumed = run(go(), bound=60)
    assert len(starts) == 40
    after = sorted(at for at in starts if at >= resumed - 0.005)
    assert after, starts
    in_the_second = [at for at in after if at < after[0] + 1.0]
    # 20 a second less the 2% headroom; the first at once: at most 20 in any second
    assert len(in_the_second) <= 20, [round(at - resumed, 3) for at in after]


def test_once_a_retry_after_quota_is_learned_one_call_finds_the_windows_end(redis_url: str) -> None:
    """The refusal that completes the learning of a Retry-After-only quota pauses to the middle
    of the Retry-After's last second, not its end (those before it, 0.35 s before its end);
    then one call goes first, and the others follow once it is admitted (a refusal of it would
    pause to the Retry-After's end)."""
    budget = Budget(redis_url, f"t{uuid.uuid4().hex[:8]}", in_flight=40)

    async def go() -> None:
        loop = asyncio.get_running_loop()
        first, second = budget.connect(), budget.connect()
        try:
            pause = 0.0
            for window in range(3):  # three windows' ends: two lengths, averaged, teach it
                for n in range(20):
                    await first.release(f"{budget.group}|ok{window}-{n}", outcome="ok", latency=0.01)
                refused = f"{budget.group}|no{window}"
                pause = await first.release(refused, outcome="overload", latency=0.01, retry_after=1.0)
                if window < 2:
                    assert 0.6 < pause < 0.7, pause  # not learned yet: near the end
                    # the next window, as the service's clock runs: calls sent after the pause
                    await asyncio.sleep(pause + 0.02)
            assert 0.4 < pause < 0.6, pause
            lease = await asyncio.wait_for(first.acquire(1, lookup_key=1, service="s"), 5)
            other = loop.create_task(second.acquire(1, lookup_key=2, service="s"))
            done, _ = await asyncio.wait({other}, timeout=0.2)
            assert not done, "a second call started before the first was admitted"
            await first.release(lease, outcome="ok", latency=0.02)
            await first.release(await asyncio.wait_for(other, 5), outcome="ok", latency=0.02)
        finally:
            await first.aclose()
            await second.aclose()

    run(go(), bound=30)

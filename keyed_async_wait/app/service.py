"""A small aiohttp lookup service on loopback: the main job's embedded default, and what the tests,
the demo and the benchmarks call.

``GET /users/{id}`` answers a profile (404 for an unknown id), ``POST /users/batch`` answers
many (a JSON list of ids in, an object from id to profile out). ``GET /api/users/{id}`` is the
shape of many real APIs: behind a bearer token (``ServiceState.api_token``: 401 without it) and
the profile under ``"data"``. ``PUT``/``PATCH``/``POST``/
``DELETE /records/{key}`` is a store that fences writes by ``X-Record-Version`` as
:mod:`lookup.http_write` asks of a service (412 for a version not above the one it holds,
naming it in ``X-Record-Version``); ``POST /records`` is its collection (fenced per
``X-Record-Resource``). Latency, a log of every call (key, start, end) and faults (a status for
the next N calls with Retry-After, malformed JSON, answers slower than a client's timeout,
writes applied whose answer is then lost) are set on :class:`ServiceState`.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from .quota import Quota

__all__ = ["ServiceState", "profile_of", "run_service"]

TIERS = ("bronze", "silver", "gold")


def profile_of(user_id: int) -> dict[str, Any]:
    return {
        "id": user_id,
        "name": f"user-{user_id}",
        "tier": TIERS[user_id % 3],
        "score": round((user_id * 7919 % 1000) / 10, 1),
        "address": {"city": f"city-{user_id % 50}"},
    }


@dataclass
class ServiceState:
    """What the service does; tests change it while it runs (plain attributes, one writer)."""

    users: int = 100_000
    latency: float = 0.0
    jitter: float = 0.0  # up to this much extra latency, at random
    fail_status: int | None = None
    fail_count: int = 0  # how many calls still get fail_status (-1: every call)
    retry_after: str | None = None
    malformed: bool = False
    slow_ids: set[str] = field(default_factory=set)
    slow_seconds: float = 30.0
    down_ids: set[str] = field(default_factory=set)  # these ids answer 503 (an outage of their shard)
    down_query: dict[str, str] = field(default_factory=dict)  # requests with these parameters: 503
    slow_query: dict[str, str] = field(default_factory=dict)  # ... these: slow_seconds
    record_calls: bool = False
    quota: Quota | None = None  # a quota enforced and announced (RateLimit headers), see .quota
    max_concurrent: int | None = None  # above this many requests at once: 429 with Retry-After
    over_capacity_retry_after: str | None = None
    in_flight: int = 0
    peak_in_flight: int = 0
    # a new object each time a test resets the state: a request still running from before the
    # reset (held slow_seconds) leaves the next test's in_flight alone when it ends
    generation: object = field(default_factory=object, repr=False)
    rejected: int = 0  # 429s answered for being over capacity
    faults: int = 0  # answers with fail_status (an injected fault or outage)
    # (key, start, end, query): what was asked, when, and the request's query parameters
    calls: list[tuple[str, float, float, dict[str, str]]] = field(default_factory=list)
    requests: int = 0
    keys_asked: int = 0  # user ids asked for, one per GET and one per id of a batch
    keys_answered: int = 0  # ... of them, those asked in calls answered 200
    # the versioned store: key -> (version, body or None for a tombstone), and every write seen
    # as (key, version, applied, monotonic time)
    records: dict[str, tuple[str, Any]] = field(default_factory=dict)
    write_log: list[tuple[str, str, bool, float]] = field(default_factory=list)
    # this many applied writes then lose their answer: the connection closed, or lose_status
    lose_answers: int = 0
    lose_status: int | None = None
    started: threading.Event = field(default_factory=threading.Event)  # set as each request starts
    api_token: str = "demo-token"  # what GET /api/users/{id} wants as "Authorization: Bearer ..."

    def fail(self, status: int, count: int = -1, retry_after: str | None = None) -> None:
        self.fail_status, self.fail_count, self.retry_after = status, count, retry_after

    def heal(self) -> None:
        self.fail_status, self.fail_count, self.retry_after = None, 0, None


def _matches(wanted: dict[str, str], query: dict[str, str] | None) -> bool:
    return bool(wanted and query and wanted.items() <= query.items())


def _fault(state: ServiceState, key: str, query: dict[str, str]) -> web.Response | None:
    """The injected fault this request gets, if any."""
    if state.fail_status is not None and state.fail_count != 0:
        if state.fail_count > 0:
            state.fail_count -= 1
        state.faults += 1
        headers = {"Retry-After": state.retry_after} if state.retry_after else None
        return web.Response(status=state.fail_status, text="injected fault", headers=headers)
    if key in state.down_ids:
        return web.Response(status=503, text="shard down")
    if _matches(state.down_query, query):
        return web.Response(status=503, text="down for these parameters")
    return None


def _units(query: dict[str, str] | None) -> float:
    """The cost a request declares (``?units=``; 1 when it declares none or nonsense)."""
    try:
        return max(0.0, float((query or {}).get("units", 1)))
    except ValueError:
        return 1.0


def _versioned_store(state: ServiceState, answer: Any) -> Any:
    """``/records/{key}``: a store that fences writes by ``X-Record-Version`` (byte order), as
    :mod:`lookup.http_write` asks of a service; 412 for a version not above the one it holds,
    naming it in ``X-Record-Version``. ``POST /records``: the collection, fenced per
    ``X-Record-Resource``. With ``lose_answers`` a write is applied and its answer then lost."""

    async def record(request: web.Request) -> web.Response:
        # POST /records (a collection): the resource a header names, else each post its own
        key = request.match_info.get("key") or request.headers.get("X-Record-Resource")
        key = key or f"post-{len(state.write_log)}"
        version = request.headers.get("X-Record-Version", "")
        body = None if request.method == "DELETE" else await request.json()
        fault = await answer(key, {}, dict(request.query))  # latency, faults and the call log
        if fault.status != 200:
            return fault
        held = state.records.get(key)  # read, compared and written without a suspension between
        applied = not version or held is None or version > held[0]  # a fenced write, byte order
        state.write_log.append((key, version, applied, time.monotonic()))
        if not applied:  # the version it holds, echoed: a client knows its own earlier write
            held_version = held[0] if held else ""
            headers = {"X-Record-Version": held_version}
            return web.Response(status=412, text=f"holds version {held_version}", headers=headers)
        state.records[key] = (version, body)
        if state.lose_answers > 0:  # applied, but the client never hears so
            state.lose_answers -= 1
            if state.lose_status is not None:
                return web.Response(status=state.lose_status, text="applied, answer lost")
            assert request.transport is not None
            request.transport.abort()
        return web.Response(status=204)

    return record


def _answering(state: ServiceState) -> Any:
    """The coroutine every route answers through: capacity, quota, faults, latency, the log."""

    async def answer(key: str, payload: Any, query: dict[str, str] | None = None) -> web.Response:
        state.requests += 1
        state.started.set()
        start = time.monotonic()
        # the log this request started under: one still running when a test resets the state
        # lands in the old log, not in the next test's
        calls = state.calls if state.record_calls else None
        if state.max_concurrent is not None and state.in_flight >= state.max_concurrent:
            state.rejected += 1
            retry = state.over_capacity_retry_after
            return web.Response(
                status=429, text="over capacity", headers={"Retry-After": retry} if retry else None
            )
        quota = state.quota
        units = _units(query)
        if quota is not None:
            admitted, quota_headers = quota.admit(units)
            if not admitted:
                state.rejected += 1
                return web.Response(status=429, text="over quota", headers=quota_headers)
            try:
                return await answer_within(key, payload, query, calls, start, quota_headers, units)
            finally:
                quota.done()
        return await answer_within(key, payload, query, calls, start, {}, units)

    async def answer_within(
        key: str,
        payload: Any,
        query: dict[str, str] | None,
        calls: Any,
        start: float,
        headers: dict[str, str],
        units: float,
    ) -> web.Response:
        generation = state.generation
        state.in_flight += 1
        state.peak_in_flight = max(state.peak_in_flight, state.in_flight)
        try:
            fault = _fault(state, key, query or {})
            if fault is not None:
                return fault
            slow = key in state.slow_ids or _matches(state.slow_query, query)
            delay = state.slow_seconds if slow else state.latency
            if state.jitter:
                delay += random.random() * state.jitter
            if delay:
                await asyncio.sleep(delay)
            if payload is None:
                return web.Response(status=404, text="not found")
            if state.malformed:
                return web.Response(text="{not json", content_type="application/json")
            if state.quota is not None and isinstance(payload, dict):  # what the call used
                payload = {**payload, "usage": {"units": units}}
                headers = {**headers, "X-Units-Used": f"{units:g}"}
            return web.json_response(payload, headers=headers or None)
        finally:
            if state.generation is generation:
                state.in_flight -= 1
            if calls is not None:
                calls.append((key, start, time.monotonic(), query or {}))

    return answer


def _answered(state: ServiceState, keys: int, response: web.Response) -> web.Response:
    if response.status == 200:
        state.keys_answered += keys
    return response


def _app(state: ServiceState) -> web.Application:
    answer = _answering(state)

    async def user(request: web.Request) -> web.Response:
        key = request.match_info["user_id"]
        state.keys_asked += 1
        known = key.isdigit() and int(key) < state.users
        answered = await answer(key, profile_of(int(key)) if known else None, dict(request.query))
        return _answered(state, 1, answered)

    async def api_user(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {state.api_token}":
            return web.json_response({"error": "unauthorized"}, status=401)
        key = request.match_info["user_id"]
        state.keys_asked += 1
        known = key.isdigit() and int(key) < state.users
        answered = await answer(key, {"data": profile_of(int(key))} if known else None, dict(request.query))
        return _answered(state, 1, answered)

    async def batch(request: web.Request) -> web.Response:
        ids = await request.json()
        state.keys_asked += len(ids)
        out = {str(i): profile_of(int(i)) for i in ids if str(i).isdigit() and int(i) < state.users}
        return _answered(state, len(ids), await answer("batch:" + json.dumps(ids[:3]), out))

    record = _versioned_store(state, answer)

    async def stats(request: web.Request) -> web.Response:
        counts = {
            "requests": state.requests,
            "rejected": state.rejected,
            "peak_in_flight": state.peak_in_flight,
            "faults": state.faults,
        }
        if request.query.get("reset"):
            state.requests = state.rejected = state.peak_in_flight = state.faults = 0
        return web.json_response(counts)

    async def outage(request: web.Request) -> web.Response:
        """``POST /outage?seconds=S``: every call answers 503 for S seconds (for benchmarks)."""
        seconds = float(request.query["seconds"])
        state.fail(503)
        asyncio.get_running_loop().call_later(seconds, state.heal)
        return web.json_response({"outage": seconds})

    app = web.Application()
    app.add_routes(
        [
            web.get("/users/{user_id}", user),
            web.get("/api/users/{user_id}", api_user),
            web.post("/users/batch", batch),
            web.get("/stats", stats),
            web.post("/outage", outage),
            web.route("*", "/records/{key}", record),
            web.post("/records", record),
        ]
    )
    return app


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def run_service(
    state: ServiceState | None = None, port: int | None = None
) -> Iterator[tuple[str, ServiceState]]:
    """Run the service on 127.0.0.1 in a thread of its own; yields ``(base_url, state)``."""
    state = state or ServiceState()
    port = port or free_port()
    ready = threading.Event()
    stop: dict[str, Any] = {}
    failure: list[BaseException] = []

    def serve() -> None:
        loop = asyncio.new_event_loop()
        runner = web.AppRunner(_app(state), access_log=None, handle_signals=False)
        try:
            loop.run_until_complete(runner.setup())
            loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port, backlog=1024).start())
            stop["loop"], stop["event"] = loop, asyncio.Event()
            ready.set()
            loop.run_until_complete(stop["event"].wait())
        except BaseException as exc:  # noqa: BLE001 - reported to the starting thread
            failure.append(exc)
            ready.set()
        finally:
            loop.run_until_complete(runner.cleanup())
            loop.close()

    thread = threading.Thread(target=serve, name=f"lookup-service:{port}", daemon=True)
    thread.start()
    if not ready.wait(30) or failure:
        cause = failure[0] if failure else None
        raise RuntimeError(f"lookup service did not start on port {port}") from cause
    try:
        yield f"http://127.0.0.1:{port}", state
    finally:
        stop["loop"].call_soon_threadsafe(stop["event"].set)
        thread.join(30)


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Run the lookup service until interrupted.")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--latency", type=float, default=0.02)
    parser.add_argument("--max-concurrent", type=int, help="answer 429 above this many requests at once")
    args = parser.parse_args()
    state = ServiceState(
        latency=args.latency, max_concurrent=args.max_concurrent, over_capacity_retry_after=None
    )
    with run_service(state, args.port) as (url, _):
        print(f"serving {url}/users/{{id}} and POST {url}/users/batch; Ctrl-C stops", flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()

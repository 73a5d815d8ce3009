"""HttpLookup against real HTTP servers on loopback: the project's service and pytest-httpserver."""

from __future__ import annotations

import asyncio
import pickle
from typing import Any

import pytest
from pytest_httpserver import HTTPServer

from keyed_async_wait import RecordFailedError, RecordTimeoutError, RetryStrategy
from keyed_async_wait.app.service import ServiceState, free_port, profile_of
from keyed_async_wait.operator import KeyedAsyncWaitOperator
from lookup import (
    BadResponseError,
    Field,
    HttpLookup,
    LookupTimeoutError,
    PartialCache,
    RateLimitedError,
    ServiceUnavailableError,
)
from lookup.http_aiohttp import AiohttpTransport
from lookup.http_client import make_transport
from lookup.http_lean import LeanTransport
from lookup.http_options import ClientOptions

from ..core.helpers import run

pytestmark = pytest.mark.usefixtures("http_client")  # each test once per HTTP client

FIELDS = [Field("name"), Field("tier"), Field("score", "float"), Field("city", "string", "address.city")]


def orders(n: int, users: int = 10) -> list[dict[str, Any]]:
    return [{"order_id": i % 7, "seq": i, "user_id": i % users} for i in range(n)]


async def lookup_all(fn: HttpLookup, records: list[dict[str, Any]], **kw: Any) -> list[Any]:
    op = KeyedAsyncWaitOperator(fn, mode="key_ordered", key="order_id", output="pairs", **kw)
    try:
        return [pair async for pair in op.process(records)]
    finally:
        await fn.aclose()


def test_get_maps_declared_fields_and_keeps_the_ordering_key_apart(service: Any) -> None:
    url, _ = service
    fn = HttpLookup(f"{url}/users/{{user_id}}", fields=FIELDS)
    pairs = run(lookup_all(fn, orders(30)))
    assert len(pairs) == 30
    for record, results in pairs:
        p = profile_of(record["user_id"])
        city = p["address"]["city"]
        assert results == [{"name": p["name"], "tier": p["tier"], "score": p["score"], "city": city}]
    assert fn.output_schema() == "name string, tier string, score double, city string"


def test_404_is_a_miss_not_an_error(service: Any) -> None:
    url, _ = service
    fn = HttpLookup(f"{url}/users/{{user_id}}", fields=FIELDS)
    pairs = run(lookup_all(fn, [{"order_id": 1, "user_id": 10**9}]))
    assert pairs[0][1] == []
    assert fn.stats.misses == 1


def test_429_with_retry_after_is_retried_and_waits(service: Any) -> None:
    url, state = service
    state.fail(429, count=2, retry_after="0.2")
    fn = HttpLookup(f"{url}/users/{{user_id}}", fields=FIELDS)

    async def one() -> tuple[Any, float]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        out = await lookup_all(fn, [{"order_id": 1, "user_id": 3}], retry=RetryStrategy.fixed_delay(5, 0.01))
        return out, loop.time() - start

    pairs, took = run(one())
    assert pairs[0][1][0]["name"] == "user-3"
    assert took >= 0.4  # two Retry-After waits of 0.2 s, not two 0.01 s delays
    assert state.requests == 3


@pytest.mark.parametrize(
    ("status", "error", "retryable"),
    [
        (503, ServiceUnavailableError, True),
        (500, ServiceUnavailableError, True),
        (429, RateLimitedError, True),
        (400, BadResponseError, False),
        (403, BadResponseError, False),
    ],
)
def test_status_codes_map_to_errors(service: Any, status: int, error: type, retryable: bool) -> None:
    url, state = service
    state.fail(status)
    fn = HttpLookup(f"{url}/users/{{user_id}}")
    with pytest.raises(RecordFailedError) as info:
        run(lookup_all(fn, [{"order_id": 1, "user_id": 3}], retry=RetryStrategy.fixed_delay(2, 0.0)))
    cause = info.value.__cause__
    assert isinstance(cause, error) and cause.retryable is retryable
    assert cause.lookup_key == f"{url}/users/3"
    assert info.value.attempts == (2 if retryable else 1)


def test_slower_than_the_request_timeout_is_a_retryable_timeout(service: Any) -> None:
    url, state = service
    state.slow_ids = {"3"}
    state.slow_seconds = 5
    fn = HttpLookup(f"{url}/users/{{user_id}}", request_timeout=0.1)
    with pytest.raises(RecordFailedError) as info:
        run(lookup_all(fn, [{"order_id": 1, "user_id": 3}]))
    assert isinstance(info.value.__cause__, LookupTimeoutError)
    assert isinstance(info.value.__cause__, TimeoutError) and info.value.__cause__.retryable


@pytest.mark.parametrize("mode", ["ordered", "unordered"])
def test_a_record_timeout_names_the_record_and_the_request(service: Any, mode: str) -> None:
    """In the modes without an ordering key, a record's timeout names it by its values and by
    what the lookup asked for it (method and URL); a secret in the URL stays hidden."""
    url, state = service
    state.slow_ids = {"3"}
    state.slow_seconds = 5
    host = url.split("//", 1)[1]
    fn = HttpLookup(f"http://user:pa55word@{host}/users/{{user_id}}", params={"t": "{user_id}"})
    op = KeyedAsyncWaitOperator(fn, mode=mode, output="pairs", timeout=0.3)

    async def main() -> None:
        try:
            [_ async for _ in op.process([{"order_id": 1, "user_id": 3}])]
        finally:
            await fn.aclose()

    with pytest.raises(RecordTimeoutError) as info:
        run(main())
    message = str(info.value)
    assert message.startswith(f"record {{'order_id': 1, 'user_id': 3}} (GET http://{host}/users/3) failed")
    assert "pa55word" not in message and info.value.target == f"GET http://{host}/users/3"


def test_malformed_json_names_the_key_and_is_not_retried(service: Any) -> None:
    url, state = service
    state.malformed = True
    fn = HttpLookup(f"{url}/users/{{user_id}}")
    with pytest.raises(RecordFailedError, match=r"users/4.*not JSON.*body: \{not json") as info:
        run(lookup_all(fn, [{"order_id": 1, "user_id": 4}], retry=RetryStrategy.fixed_delay(3, 0.0)))
    assert info.value.attempts == 1


def test_connection_refused_is_unavailable() -> None:
    fn = HttpLookup(f"http://127.0.0.1:{free_port()}/users/{{user_id}}")
    with pytest.raises(RecordFailedError) as info:
        run(lookup_all(fn, [{"order_id": 1, "user_id": 4}]))
    assert isinstance(info.value.__cause__, ServiceUnavailableError)


def test_template_field_missing_is_named() -> None:
    fn = HttpLookup("http://127.0.0.1:1/users/{user_id}")
    with pytest.raises(RecordFailedError, match=r"needs field 'user_id'.*\['order_id'\]"):
        run(lookup_all(fn, [{"order_id": 1}]))


def test_answer_not_matching_declared_fields_is_named(service: Any) -> None:
    url, _ = service
    fn = HttpLookup(f"{url}/users/{{user_id}}", fields=[Field("name", "int")])
    with pytest.raises(
        RecordFailedError,
        match=r"field 'name' should be int, but the answer has a JSON string there: "
        r".*; declare Field\('name', 'string'\)",
    ):
        run(lookup_all(fn, [{"order_id": 1, "user_id": 2}]))


def test_secrets_reach_the_server_and_nowhere_else(httpserver: HTTPServer, monkeypatch: Any) -> None:
    monkeypatch.setenv("KAW_TEST_TOKEN", "s3cr3t-token")
    httpserver.expect_request("/users/1", headers={"Authorization": "Bearer s3cr3t-token"}).respond_with_json(
        {"name": "x"}
    )
    httpserver.expect_request("/users/2").respond_with_data("nope", status=400)
    fn = HttpLookup(httpserver.url_for("/users/{user_id}"), bearer_token_env="KAW_TEST_TOKEN")
    assert run(lookup_all(fn, [{"order_id": 1, "user_id": 1}]))[0][1] == [{"name": "x"}]
    with pytest.raises(RecordFailedError) as info:
        run(lookup_all(fn, [{"order_id": 1, "user_id": 2}]))
    for text in (repr(fn), str(info.value), str(info.value.__cause__)):
        assert "s3cr3t" not in text
    assert "***" in repr(fn)


def test_query_params_headers_and_json_body_templates(httpserver: HTTPServer) -> None:
    httpserver.expect_request(
        "/lookup",
        method="POST",
        query_string="region=eu",
        headers={"X-Tenant": "t9"},
        json={"user": 7, "tag": "u-7"},
    ).respond_with_json({"ok": True})
    fn = HttpLookup(
        httpserver.url_for("/lookup"),
        method="POST",
        params={"region": "{region}"},
        headers={"X-Tenant": "{tenant}"},
        json_body={"user": "{user_id}", "tag": "u-{user_id}"},
    )
    record = {"order_id": 1, "user_id": 7, "region": "eu", "tenant": "t9"}
    assert run(lookup_all(fn, [record]))[0][1] == [{"ok": True}]


def test_batch_endpoint_sends_many_keys_per_request(service: Any) -> None:
    url, state = service
    fn = HttpLookup(f"{url}/users/{{user_id}}", batch_url=f"{url}/users/batch", fields=FIELDS)
    records = [*orders(200, users=50), {"order_id": 3, "seq": 999, "user_id": 10**9}]
    pairs = run(lookup_all(fn, records, capacity=200))
    assert len(pairs) == 201
    for record, results in pairs:
        if record["user_id"] == 10**9:
            assert results == []
        else:
            assert results[0]["name"] == f"user-{record['user_id']}"
    assert state.requests < 201 / 5
    assert fn.stats.requests == state.requests


def test_in_flight_deduplication_makes_one_request(service: Any) -> None:
    url, state = service
    state.latency = 0.05
    fn = HttpLookup(f"{url}/users/{{user_id}}")
    records = [{"order_id": i, "user_id": 5} for i in range(20)]
    pairs = run(lookup_all(fn, records))
    assert all(res[0]["name"] == "user-5" for _, res in pairs)
    assert state.requests == 1 and fn.stats.deduplicated == 19


def test_cache_serves_repeats_without_requests(service: Any) -> None:
    url, state = service
    fn = HttpLookup(f"{url}/users/{{user_id}}", cache=PartialCache(100))
    run(lookup_all(fn, orders(10, users=5)))
    first = state.requests
    run(lookup_all(fn, orders(10, users=5)))
    assert first <= 5 and state.requests == first
    assert fn.stats.cache_hits >= 10


def test_connection_limit_is_sized_not_aiohttps_default(service: Any) -> None:
    url, state = service
    state.latency = 0.02
    fn = HttpLookup(f"{url}/users/{{user_id}}", max_connections=3, fields=FIELDS)
    pairs = run(lookup_all(fn, orders(24, users=24)))
    assert len(pairs) == 24 and all(results for _, results in pairs)
    assert state.peak_in_flight == 3  # the limit, and reached: 24 records were ready at once


def test_a_request_running_across_the_services_reset_leaves_the_next_count_alone(service: Any) -> None:
    """A request an earlier test left held in the service ends during the next test: the next
    test's ``in_flight`` stays its own (a CI run's connection-limit test read a peak of 2, not 3,
    when such a request ended during it)."""
    url, state = service
    state.slow_ids, state.slow_seconds = {"3"}, 0.2

    async def across_a_reset() -> list[Any]:
        fn = HttpLookup(f"{url}/users/{{user_id}}")
        held = asyncio.get_running_loop().create_task(lookup_all(fn, [{"order_id": 1, "user_id": 3}]))
        started = state.started
        assert await asyncio.to_thread(started.wait, 10.0)
        state.__dict__.update(ServiceState().__dict__)  # what the fixture does between tests
        return await held  # answered: its handler has ended

    assert len(run(across_a_reset())) == 1
    assert state.requests == 0 and state.in_flight == 0


def test_pickling_never_carries_a_live_session(service: Any) -> None:
    url, _ = service
    fn = HttpLookup(f"{url}/users/{{user_id}}", cache=PartialCache(10))
    run(lookup_all(fn, orders(3)))

    async def used_then_pickled() -> HttpLookup:
        fn.client()
        copy = pickle.loads(pickle.dumps(fn))
        await fn.aclose()
        return copy

    copy = run(used_then_pickled())
    assert copy._client is None and len(copy.cache) == 0
    pairs = run(lookup_all(copy, orders(3)))  # key-ordered: different keys leave as they finish
    assert sorted((r["user_id"], res[0]["name"]) for r, res in pairs) == [(i, f"user-{i}") for i in range(3)]


def test_a_2xx_without_a_declared_field_is_a_bad_response_naming_it(httpserver: HTTPServer) -> None:
    httpserver.expect_request("/users/1").respond_with_json({"name": "x", "tier": None})
    httpserver.expect_request("/users/2").respond_with_json({"name": "y", "address": None})
    fields = [Field("name"), Field("tier"), Field("city", path="address.city")]
    fn = HttpLookup(httpserver.url_for("/users/{user_id}"), fields=fields)
    with pytest.raises(RecordFailedError, match=r"users/1.*field 'city' \(path 'address.city'\) is missing"):
        run(lookup_all(fn, [{"order_id": 1, "user_id": 1}]))
    # a JSON null on the way is the service's own null; a missing key is not
    fn = HttpLookup(
        httpserver.url_for("/users/{user_id}"), fields=[Field("name"), Field("city", path="address.city")]
    )
    assert run(lookup_all(fn, [{"order_id": 1, "user_id": 2}]))[0][1] == [{"name": "y", "city": None}]
    optional = [Field("name"), Field("tier"), Field("city", path="address.city", optional=True)]
    fn = HttpLookup(httpserver.url_for("/users/{user_id}"), fields=optional)
    assert run(lookup_all(fn, [{"order_id": 1, "user_id": 1}]))[0][1] == [
        {"name": "x", "tier": None, "city": None}
    ]
    with pytest.raises(ValueError, match="exclude each other"):
        Field("x", required=True, optional=True)


def test_an_empty_2xx_is_a_bad_response_and_204_a_miss(httpserver: HTTPServer) -> None:
    httpserver.expect_request("/users/1").respond_with_data("", status=200)
    httpserver.expect_request("/users/2").respond_with_data("", status=204)
    httpserver.expect_request("/users/3").respond_with_json(None)
    fn = HttpLookup(httpserver.url_for("/users/{user_id}"), fields=[Field("name")])
    with pytest.raises(RecordFailedError, match=r"empty answer; a miss is status 404 or 204 \(status 200\)"):
        run(lookup_all(fn, [{"order_id": 1, "user_id": 1}]))
    pairs = run(lookup_all(fn, [{"order_id": 1, "user_id": 2}, {"order_id": 2, "user_id": 3}]))
    assert [results for _, results in pairs] == [[], []]


def test_a_batch_endpoint_answering_404_is_an_error_not_all_misses(httpserver: HTTPServer) -> None:
    httpserver.expect_request("/batch", method="POST").respond_with_data("no such route", status=404)
    fn = HttpLookup(httpserver.url_for("/users/{user_id}"), batch_url=httpserver.url_for("/batch"))
    with pytest.raises(RecordFailedError, match=r"batch endpoint answered 404"):
        run(lookup_all(fn, [{"order_id": 1, "user_id": 1}]))


def test_the_client_setting_is_checked_when_the_lookup_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAW_HTTP", "curl")
    with pytest.raises(ValueError, match="KAW_HTTP='curl'; allowed: auto, httptools, aiohttp"):
        HttpLookup("http://127.0.0.1:1/u/{id}")


def test_head_goes_through_aiohttp_as_the_parsers_cannot_frame_its_answer(http_client: str) -> None:
    async def kinds() -> tuple[type, type]:
        head, get = (
            make_transport("HEAD", 10, 1.0, ClientOptions(), "http://x/"),
            make_transport("GET", 10, 1.0, ClientOptions(), "http://x/"),
        )
        await head.aclose()
        await get.aclose()
        return type(head), type(get)

    head, get = run(kinds())
    assert head is AiohttpTransport
    assert get is (AiohttpTransport if http_client == "aiohttp" else LeanTransport)


def test_try_one_calls_once_outside_spark_and_closes_its_client(service: Any) -> None:
    url, state = service
    users = HttpLookup(f"{url}/users/{{user_id}}", fields=[Field("name"), Field("score", "float")])
    assert users.try_one({"user_id": 7}) == [{"name": "user-7", "score": profile_of(7)["score"]}]
    assert users.try_one({"user_id": 10**9}) == []  # the service's 404: a miss
    with pytest.raises(BadResponseError, match=r"declare Field\('score', 'float'\)"):
        HttpLookup(f"{url}/users/{{user_id}}", fields=[Field("score")]).try_one({"user_id": 7})
    assert state.requests == 3

    async def inside_a_running_loop() -> list[dict[str, Any]]:  # as in a notebook
        return users.try_one({"user_id": 8})

    assert asyncio.run(inside_a_running_loop()) == [{"name": "user-8", "score": profile_of(8)["score"]}]

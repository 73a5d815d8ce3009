"""Safe by default: credentials stay with their origin, secrets stay out of every text, record
values cannot climb a URL path, and TLS is verified (with a CA bundle of the user's choice)."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import trustme
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from keyed_async_wait import RecordFailedError
from keyed_async_wait.operator import FailedRecord, KeyedAsyncWaitOperator
from lookup import CertificateError, Field, HttpLookup, RedisLookup, Secret

from ..core.helpers import run
from ..redis_topologies import tls_proxy

pytestmark = pytest.mark.usefixtures("http_client")  # each test once per HTTP client

SECRETS = ("s3cr3t-token", "b4sic-pw", "k3y-in-header", "t0k-in-query")


async def lookup_all(fn: Any, records: list[dict[str, Any]], **kw: Any) -> list[Any]:
    op = KeyedAsyncWaitOperator(fn, mode="key_ordered", key="order_id", output="pairs", **kw)
    try:
        return [pair async for pair in op.process(records)]
    finally:
        await fn.aclose()


def _leaks(*texts: str) -> list[str]:
    return [secret for secret in SECRETS for text in texts if secret in text]


@pytest.fixture
def other_origin() -> Iterator[HTTPServer]:
    server = HTTPServer(host="127.0.0.1", port=0)
    server.start()
    yield server
    server.clear()
    if server.is_running():
        server.stop()


def _record_headers(seen: list[dict[str, str]]) -> Any:
    def handler(request: Request) -> Response:
        seen.append(dict(request.headers))
        return Response('{"name": "landed"}', content_type="application/json")

    return handler


def test_credentials_are_not_sent_to_another_origin_on_a_redirect(
    httpserver: HTTPServer, other_origin: HTTPServer
) -> None:
    elsewhere: list[dict[str, str]] = []
    here: list[dict[str, str]] = []
    httpserver.expect_request("/users/1").respond_with_response(
        Response(status=302, headers={"Location": other_origin.url_for("/landing")})
    )
    httpserver.expect_request("/users/2").respond_with_response(
        Response(status=307, headers={"Location": "/moved/2"})
    )
    httpserver.expect_request("/moved/2").respond_with_handler(_record_headers(here))
    other_origin.expect_request("/landing").respond_with_handler(_record_headers(elsewhere))
    for auth in (
        {"bearer_token": "s3cr3t-token"},
        {"basic_auth": ("alice", "b4sic-pw")},
    ):
        elsewhere.clear()
        here.clear()
        fn = HttpLookup(
            httpserver.url_for("/users/{user_id}"),
            headers={"X-Api-Key": Secret("k3y-in-header"), "X-Tenant": "{tenant}"},
            fields=[Field("name")],
            **auth,
        )
        records = [
            {"order_id": 1, "user_id": 1, "tenant": "t1"},
            {"order_id": 2, "user_id": 2, "tenant": "t2"},
        ]
        pairs = run(lookup_all(fn, records))
        assert [results for _, results in pairs] == [[{"name": "landed"}], [{"name": "landed"}]]
        (crossed,) = elsewhere
        assert "Authorization" not in crossed and "X-Api-Key" not in crossed and "X-Tenant" not in crossed
        (stayed,) = here  # a redirect within the origin keeps them
        assert (
            "Authorization" in stayed
            and stayed["X-Api-Key"] == "k3y-in-header"
            and stayed["X-Tenant"] == "t2"
        )


def test_secrets_in_headers_params_and_the_url_show_nowhere(httpserver: HTTPServer) -> None:
    def echo_everything(request: Request) -> Response:
        # a careless service echoing the request back in its error page
        return Response(f"bad request {dict(request.headers)} {request.query_string!r}", status=400)

    httpserver.expect_request("/users/1").respond_with_handler(echo_everything)
    port = httpserver.port
    fn = HttpLookup(
        f"http://alice:b4sic-pw@127.0.0.1:{port}/users/{{user_id}}",
        headers={"X-Api-Key": Secret("k3y-in-header")},
        params={"token": Secret("t0k-in-query"), "region": "{region}"},
        fields=[Field("name")],
    )
    with pytest.raises(RecordFailedError) as failure:
        run(lookup_all(fn, [{"order_id": 1, "user_id": 1, "region": "eu"}]))
    cause = failure.value.__cause__
    assert cause is not None
    assert not _leaks(repr(fn), str(failure.value), repr(failure.value), str(cause), repr(cause.args))
    assert "***" in str(cause)  # the echoed secrets were there, and were redacted
    # the same record as an error row (what the error column of a Spark output holds)
    emitted = run(lookup_all(fn, [{"order_id": 1, "user_id": 1, "region": "eu"}], on_error="emit"))
    (failed,) = [item for item in emitted if isinstance(item, FailedRecord)]
    assert not _leaks(failed.error_message, repr(failed.key))
    # and the secrets did reach the service
    (request, _), *_ = httpserver.log
    assert request.headers["X-Api-Key"] == "k3y-in-header" and request.args["token"] == "t0k-in-query"
    assert request.authorization is not None and request.authorization.password == "b4sic-pw"


def test_a_client_error_holding_a_secret_is_not_chained(httpserver: HTTPServer) -> None:
    # a redirect loop: aiohttp's own errors would name the URL, query and all
    httpserver.expect_request("/loop").respond_with_response(
        Response(status=302, headers={"Location": httpserver.url_for("/loop") + "?token=t0k-in-query"})
    )
    fn = HttpLookup(httpserver.url_for("/loop"), params={"token": Secret("t0k-in-query")}, key="{user_id}")
    with pytest.raises(RecordFailedError) as failure:
        run(lookup_all(fn, [{"order_id": 1, "user_id": 1}]))
    chain: list[BaseException] = []
    error: BaseException | None = failure.value
    while error is not None:
        chain.append(error)
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    assert "more than 10 redirects" in str(failure.value)
    assert not _leaks(*(f"{e!r} {e} {getattr(e, '__notes__', '')}" for e in chain))


def test_a_dot_segment_value_stays_a_name(service: Any) -> None:
    url, state = service
    state.record_calls = True
    fn = HttpLookup(url + "/users/{user_id}", params={"order": "{order_id}", "seq": "0"})
    pairs = run(lookup_all(fn, [{"order_id": 1, "user_id": ".."}, {"order_id": 2, "user_id": "../../x"}]))
    assert [results for _, results in pairs] == [[], []]  # misses of users named so, not other paths
    assert sorted(key for key, _, _, _ in state.calls) == ["..", "../../x"]


def test_a_line_break_in_a_header_value_cannot_add_a_header(httpserver: HTTPServer) -> None:
    httpserver.expect_request("/u").respond_with_json({"name": "x"})
    fn = HttpLookup(httpserver.url_for("/u"), headers={"X-Id": "{user_id}"}, key="{user_id}")
    records = [{"order_id": 1, "user_id": "1\r\nX-Evil: yes"}, {"order_id": 2, "user_id": "2\nX-Evil: yes"}]
    with pytest.raises((RecordFailedError, ValueError)) as failure:
        run(lookup_all(fn, records))
    assert "X-Id" in str(failure.value) or "header" in str(failure.value).lower()
    assert all("X-Evil" not in request.headers for request, _ in httpserver.log)


@pytest.fixture(scope="module")
def authority() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def https_server(authority: trustme.CA) -> Iterator[HTTPServer]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    authority.issue_cert("127.0.0.1").configure_cert(context)
    server = HTTPServer(host="127.0.0.1", port=0, ssl_context=context)
    server.start()
    yield server
    server.clear()
    if server.is_running():
        server.stop()


def test_tls_is_verified_and_a_ca_bundle_can_be_given(
    https_server: HTTPServer, authority: trustme.CA
) -> None:
    https_server.expect_request("/users/1").respond_with_json({"name": "secure"})
    url = https_server.url_for("/users/{user_id}")
    assert url.startswith("https://")
    with pytest.raises(RecordFailedError) as failure:
        run(lookup_all(HttpLookup(url, fields=[Field("name")]), [{"order_id": 1, "user_id": 1}]))
    assert isinstance(failure.value.__cause__, CertificateError) and failure.value.attempts == 1
    with authority.cert_pem.tempfile() as ca_file:
        fn = HttpLookup(url, fields=[Field("name")], ca_file=ca_file)
        assert run(lookup_all(fn, [{"order_id": 1, "user_id": 1}]))[0][1] == [{"name": "secure"}]


def test_rediss_with_a_ca_bundle(redis_url: str, authority: trustme.CA) -> None:
    host_port = redis_url.split("//", 1)[1].split("/", 1)[0]
    client = redis.Redis.from_url(redis_url)
    client.set("tls:1", '{"secure": true}')
    client.close()
    with tls_proxy(authority, int(host_port.rsplit(":", 1)[1])) as port, authority.cert_pem.tempfile() as ca:
        fn = RedisLookup(f"rediss://127.0.0.1:{port}/0", "tls:{id}", ca_file=ca, dedup=False)
        assert run(lookup_all(fn, [{"order_id": 1, "id": 1}]))[0][1] == [{"secure": True}]
        untrusted = RedisLookup(f"rediss://127.0.0.1:{port}/0", "tls:{id}", socket_timeout=2)
        with pytest.raises(RecordFailedError):
            run(lookup_all(untrusted, [{"order_id": 1, "id": 1}]))
    with pytest.raises(ValueError, match="give a rediss:// URL"):
        RedisLookup("redis://127.0.0.1:1/0", "k:{id}", ca_file="ca.pem")


def test_every_bad_lookup_option_is_one_kind_of_error() -> None:
    from keyed_async_wait import ConfigError
    from lookup import LookupOptionError, RedisLookup

    for make in (
        lambda: HttpLookup("http://x/{id}", max_connections=0),
        lambda: HttpLookup("http://x/{id}", batch_response="set"),
        lambda: HttpLookup("http://x/{id:>3}"),
        lambda: RedisLookup("redis://x:6379/0", "k:{id}", command="SET"),
        lambda: RedisLookup("redis://x:6379/0", "k:{id}", ca_file="ca.pem"),
        lambda: Field("a", "decimal"),
    ):
        with pytest.raises(LookupOptionError) as bad:
            make()
        assert isinstance(bad.value, ConfigError) and isinstance(bad.value, ValueError)

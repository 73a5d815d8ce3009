"""HttpWrite against the project's service, whose /records/{key} fences by X-Record-Version."""

from __future__ import annotations

import datetime as dt
import decimal
import random
from typing import Any

import pytest

from keyed_async_wait import RecordFailedError, RetryStrategy
from lookup import HttpWrite, LookupOptionError, Secret

from ..core.helpers import run
from .writing import write_all

pytestmark = pytest.mark.usefixtures("http_client")  # each test once per HTTP client


def test_writes_carry_their_version_and_stale_ones_are_counted_not_failed(service: Any) -> None:
    url, state = service
    fn = HttpWrite(url + "/records/{id}", fields=["name", "v"], version="v")
    updates = [{"id": 1, "v": v, "name": f"n{v}"} for v in (1, 3, 2)] + [{"id": 2, "v": 5, "name": "x"}]
    pairs = run(write_all(fn, updates))
    assert {(r["id"], r["v"]): res[0]["applied"] for r, res in pairs} == {
        (1, 1): True, (1, 3): True, (1, 2): False, (2, 5): True
    }  # fmt: skip
    assert state.records["1"][1] == {"name": "n3", "v": 3}
    assert (fn.stats.applied, fn.stats.stale) == (3, 1)
    rerun = HttpWrite(url + "/records/{id}", fields=["name", "v"], version="v")
    assert [res[0]["applied"] for _, res in run(write_all(rerun, updates))] == [False] * 4


def test_a_delete_is_versioned_and_an_older_upsert_after_it_is_refused(service: Any) -> None:
    url, state = service
    fn = HttpWrite(url + "/records/{id}", fields=["name"], version="v", deleted="gone")
    updates = [
        {"id": 4, "v": 1, "name": "a", "gone": False},
        {"id": 4, "v": 2, "name": None, "gone": True},
        {"id": 4, "v": 1, "name": "a", "gone": False},
    ]
    assert [res[0]["applied"] for _, res in run(write_all(fn, updates))] == [True, True, False]
    assert state.records["4"][1] is None  # the tombstone


def test_the_body_is_exact_json_and_the_headers_carry_version_and_idempotency_key(httpserver: Any) -> None:
    seen: list[Any] = []

    def handler(request: Any) -> Any:
        from werkzeug import Response

        seen.append((request.method, dict(request.headers), request.get_json()))
        return Response(status=204)

    httpserver.expect_request("/c/7").respond_with_handler(handler)
    fn = HttpWrite(
        httpserver.url_for("/c/{id}"), method="PATCH", fields=["at", "amount", "raw"], version="at",
        headers={"X-Api-Key": Secret("k3y")},
    )  # fmt: skip
    at = dt.datetime(2026, 11, 25, 12, 0, tzinfo=dt.timezone.utc)
    run(write_all(fn, [{"id": 7, "at": at, "amount": decimal.Decimal("10.10"), "raw": b"\x00\xff"}]))
    [(method, headers, body)] = seen
    assert method == "PATCH" and headers["X-Api-Key"] == "k3y"
    assert body == {"at": "2026-11-25T12:00:00+00:00", "amount": "10.10", "raw": "AP8="}
    version = headers["X-Record-Version"]
    assert version.startswith("t") and headers["Idempotency-Key"] == f"{httpserver.url_for('/c/7')}@{version}"
    assert "k3y" not in repr(fn)


def test_a_rejected_write_fails_its_record_naming_the_write(service: Any) -> None:
    url, state = service
    state.fail(400, count=1)
    fn = HttpWrite(url + "/records/{id}", fields=["v"], version="v")
    with pytest.raises(RecordFailedError, match=r"PUT http://127\.0\.0\.1:\d+/records/9"):
        run(write_all(fn, [{"id": 9, "v": 1}]))


def test_options_are_checked_when_the_write_is_made() -> None:
    with pytest.raises(LookupOptionError, match="version="):
        HttpWrite("http://x/{id}", fields=["a"])
    with pytest.raises(LookupOptionError, match="method="):
        HttpWrite("http://x/{id}", method="GET", fields=["a"], version="v")
    with pytest.raises(LookupOptionError, match="fields="):
        HttpWrite("http://x/{id}", version="v")


def test_records_are_posted_to_a_collection_url_unfenced_or_fenced_by_a_named_resource(
    service: Any,
) -> None:
    url, state = service
    events = [{"id": i % 3, "v": v, "name": f"e{v}"} for v, i in enumerate([0, 1, 2, 0, 1, 0])]
    unfenced = HttpWrite(url + "/records", method="POST", fields=["id", "name"], at_least_once=True)
    assert [res[0]["applied"] for _, res in run(write_all(unfenced, events))] == [True] * 6
    assert len(state.records) == 6 and all(k.startswith("post-") for k in state.records)  # each its own
    state.records.clear()
    fenced = HttpWrite(url + "/records", method="POST", fields=["name"], version="v", resource="ev-{id}")
    older = [{**e, "v": 0} for e in events[:3]]  # a re-run of older versions: refused as stale
    pairs = run(write_all(fenced, [*events, *older]))
    applied = sorted((r["name"], r["v"], res[0]["applied"]) for r, res in pairs)
    assert [a for _, v, a in applied if v == 0].count(True) == 1  # e0 once; its re-runs refused
    assert sum(a for _, _, a in applied) == 6 and len(applied) == 9
    assert {k: body["name"] for k, (_, body) in state.records.items()} == {
        "ev-0": "e5",
        "ev-1": "e4",
        "ev-2": "e2",
    }
    assert "resource='ev-{id}'" in repr(fenced)


def test_a_fenced_write_to_a_collection_needs_its_resource_named() -> None:
    with pytest.raises(LookupOptionError, match=r"names no field.*resource='\{id\}'.*at_least_once=True"):
        HttpWrite("http://x/events", method="POST", fields=["a"], version="v")
    with pytest.raises(LookupOptionError, match="resource="):
        HttpWrite("http://x/events", method="POST", fields=["a"], version="v", resource="fixed")


def test_racing_writes_of_a_key_never_take_the_service_back_in_time(service: Any) -> None:
    url, state = service
    state.jitter = 0.01
    versions = list(range(30))
    random.Random(5).shuffle(versions)
    fn = HttpWrite(url + "/records/{id}", fields=["v"], version="v")
    run(write_all(fn, [{"id": 3, "v": v} for v in versions], mode="unordered", capacity=30))
    assert state.records["3"][1] == {"v": 29}
    held = ""
    for _key, version, applied, _ in state.write_log:  # the store's own order: only ever forward
        if applied:
            assert version > held
            held = version


def test_coalesced_upserts_of_a_hot_key_end_at_the_newest_in_a_few_writes(service: Any) -> None:
    url, state = service
    state.latency = 0.02
    fn = HttpWrite(url + "/records/{id}", fields=["name", "v"], version="v", coalesce=True)
    updates = [{"id": 9, "v": v, "name": f"n{v}"} for v in range(300)]
    pairs = run(write_all(fn, updates))
    assert state.records["9"][1] == {"name": "n299", "v": 299}  # the newest, as without coalescing
    outcomes = [res[0]["outcome"] for _, res in pairs]
    assert outcomes[0] == "applied" and outcomes[-1] == "applied" and len(state.write_log) <= 3
    assert outcomes.count("superseded") == 300 - len(state.write_log) == fn.stats.superseded
    assert all(not res[0]["applied"] for _, res in pairs if res[0]["outcome"] == "superseded")
    versions = [v for _, v, applied, _ in state.write_log if applied]  # order-preserving text
    assert versions == sorted(versions)  # the service's log never goes back in time
    assert fn.output_schema() == "applied boolean, outcome string"


def test_coalescing_needs_a_version(service: Any) -> None:
    url, _ = service
    with pytest.raises(LookupOptionError, match="coalesce=True needs version="):
        HttpWrite(url + "/records/{id}", fields=["name"], at_least_once=True, coalesce=True)


@pytest.mark.parametrize("lost", ["closed", 503])
def test_a_write_whose_answer_was_lost_is_applied_when_its_retry_meets_its_own_version(
    service: Any, lost: Any
) -> None:
    """Each post is applied, then its answer lost (the connection closed, or a 503): the retry
    is refused naming the version the service holds, its own, so the record is applied, once."""
    url, state = service
    state.lose_answers, state.lose_status = 30, (None if lost == "closed" else lost)
    fn = HttpWrite(url + "/records", method="POST", fields=["name"], version="v", resource="{event_id}")
    events = [{"id": i, "event_id": f"ev-{i}", "v": 1, "name": f"n{i}"} for i in range(30)]
    pairs = run(write_all(fn, events, retry=RetryStrategy.fixed_delay(2, 0.01)))
    assert state.lose_answers == 0 and len(state.write_log) == 60  # every first answer lost
    assert sorted(key for key, _, applied, _ in state.write_log if applied) == sorted(
        e["event_id"] for e in events
    )  # the store applied each once
    assert [res[0]["applied"] for _, res in pairs] == [True] * 30
    assert (fn.stats.applied, fn.stats.stale) == (30, 0)
    rerun = HttpWrite(url + "/records", method="POST", fields=["name"], version="v", resource="{event_id}")
    assert [res[0]["applied"] for _, res in run(write_all(rerun, events))] == [False] * 30  # a re-run's


def test_a_retried_write_older_than_the_stored_one_stays_stale(service: Any) -> None:
    """A write whose first attempt failed (a 503) and whose retry is refused naming a newer
    version than its own was not applied: stale, as without the lost answer."""
    url, state = service
    fn = HttpWrite(url + "/records/{id}", fields=["v"], version="v", coalesce=True)
    assert [res[0]["outcome"] for _, res in run(write_all(fn, [{"id": 5, "v": 9}]))] == ["applied"]
    state.fail(503, count=1)
    fn = HttpWrite(url + "/records/{id}", fields=["v"], version="v", coalesce=True)
    pairs = run(write_all(fn, [{"id": 5, "v": 3}], retry=RetryStrategy.fixed_delay(2, 0.01)))
    assert state.faults == 1 and [res[0] for _, res in pairs] == [{"applied": False, "outcome": "stale"}]
    assert (fn.counters()["writes_applied"], fn.counters()["writes_stale"]) == (0, 1)
    assert state.records["5"][1] == {"v": 9}


def test_a_refusal_naming_no_version_leaves_a_retried_write_stale(httpserver: Any) -> None:
    """A service that applies, answers 503, and refuses the retry without naming the version it
    holds: the write cannot know the write held is its own, so it stays not applied."""
    from werkzeug import Response

    answers = iter([Response(status=503), Response(status=412)])
    httpserver.expect_request("/c/1").respond_with_handler(lambda request: next(answers))
    fn = HttpWrite(httpserver.url_for("/c/{id}"), fields=["v"], version="v")
    pairs = run(write_all(fn, [{"id": 1, "v": 2}], retry=RetryStrategy.fixed_delay(2, 0.01)))
    assert [res[0]["applied"] for _, res in pairs] == [False]
    assert len(httpserver.log) == 2 and (fn.stats.applied, fn.stats.stale) == (0, 1)


def test_a_put_the_client_resent_itself_after_a_lost_answer_is_applied(service: Any) -> None:
    """One write at a time, so each goes out on the kept-alive connection of the one before: the
    service applies it and closes the connection unanswered, the HTTP client resends the PUT
    itself (idempotent), and the resend is refused naming the write's own version: applied."""
    url, state = service
    state.lose_answers = 5
    fn = HttpWrite(url + "/records/{id}", fields=["name"], version="v")
    records = [{"id": i, "v": 1, "name": f"n{i}"} for i in range(8)]
    pairs = run(write_all(fn, records, capacity=1, retry=RetryStrategy.fixed_delay(2, 0.01)))
    assert state.lose_answers == 0 and len(state.write_log) == 8 + 5  # five sent twice
    applied = sorted(key for key, _, applied, _ in state.write_log if applied)
    assert applied == sorted(str(i) for i in range(8))
    assert [res[0]["applied"] for _, res in pairs] == [True] * 8
    assert (fn.stats.applied, fn.stats.stale) == (8, 0)

"""Keys of many records at once: the keys (or the error) one call per record gives."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keyed_async_wait.core.keys import keys_of_many, make_key_selector

from ..outcomes import outcome

VALUES = st.one_of(
    st.integers(),
    st.text(max_size=3),
    st.none(),
    st.floats(allow_nan=False),
    st.booleans(),
    st.lists(st.integers(), max_size=2),
    st.tuples(st.integers()),
)
RECORDS = st.lists(st.dictionaries(st.sampled_from(["k", "x"]), VALUES, max_size=2), max_size=6)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(RECORDS)
def test_keys_of_many_equals_one_call_per_record(records: list[dict[str, Any]]) -> None:
    selector = make_key_selector("k")
    assert selector is not None
    many = outcome(lambda: keys_of_many(selector, records))
    each = outcome(lambda: [selector(r) for r in records])
    assert repr(many) == repr(each)

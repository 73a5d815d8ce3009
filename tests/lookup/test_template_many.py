"""A template rendered for many records at once: the text (or the error) one render each gives."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lookup.template import Template

from ..outcomes import outcome

VALUES = st.one_of(st.integers(), st.text(max_size=3), st.none(), st.floats(allow_nan=False), st.booleans())
RECORDS = st.lists(st.dictionaries(st.sampled_from(["id", "x"]), VALUES, max_size=2), max_size=6)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(RECORDS, st.sampled_from(["price:{id}", "{id}", "a/{id}/b", "{id}-{x}"]))
def test_render_many_equals_one_render_per_record(records: list[dict[str, Any]], text: str) -> None:
    template = Template(text)
    many = outcome(lambda: template.render_many(records))
    each = outcome(lambda: [template.render(r) for r in records])
    assert many == each

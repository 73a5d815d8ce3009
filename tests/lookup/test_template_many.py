"""A template rendered for many records at once: the text (or the error) one render each gives."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from lookup.template import Template

VALUES = st.one_of(st.integers(), st.text(max_size=3), st.none(), st.floats(allow_nan=False), st.booleans())
RECORDS = st.lists(st.dictionaries(st.sampled_from(["id", "x"]), VALUES, max_size=2), max_size=6)


def outcome(call: Any) -> Any:
    try:
        return ("text", call())
    except Exception as exc:  # the error is what is compared
        return ("error", type(exc), str(exc))


@settings(max_examples=300)
@given(RECORDS, st.sampled_from(["price:{id}", "{id}", "a/{id}/b", "{id}-{x}"]))
def test_render_many_equals_one_render_per_record(records: list[dict[str, Any]], text: str) -> None:
    template = Template(text)
    many = outcome(lambda: template.render_many(records))
    each = outcome(lambda: [template.render(r) for r in records])
    assert many == each

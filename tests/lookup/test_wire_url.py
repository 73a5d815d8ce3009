"""The URL as it goes out: the quoting is skipped only where it would change nothing."""

from __future__ import annotations

import urllib.parse

import yarl
from hypothesis import given
from hypothesis import strategies as st

from lookup.http_client import _URL_SAFE, wire_url

URL_TEXT = st.text(
    alphabet=st.one_of(
        st.sampled_from("abcXYZ019_.-~/:@!$&'()*+,;=?#[]% \"<>\\^`{|}\t\n"),
        st.characters(codec="utf-8", exclude_categories=["Cs"]),
    ),
    max_size=40,
)


@given(URL_TEXT)
def test_wire_url_is_the_quoted_url(path: str) -> None:
    url = "http://127.0.0.1:8080/" + path
    expected = urllib.parse.quote(url, safe=_URL_SAFE)
    assert str(wire_url(url)) == str(yarl.URL(expected, encoded=True))


def test_a_plain_url_goes_out_as_rendered() -> None:
    assert str(wire_url("http://127.0.0.1:8080/users/42?x=1")) == "http://127.0.0.1:8080/users/42?x=1"
    assert str(wire_url("http://127.0.0.1:8080/a b/ü")) == "http://127.0.0.1:8080/a%20b/%C3%BC"


@given(st.lists(URL_TEXT, max_size=30))
def test_a_cached_url_is_the_url_parsed_again(paths: list[str]) -> None:
    for path in paths + paths[::-1]:  # each at least twice: the second comes from the cache
        url = "http://127.0.0.1:8080/" + path
        assert str(wire_url(url)) == str(wire_url.__wrapped__(url))
        assert wire_url(url) is wire_url(url)

"""Templates over a record's fields: ``"user:{user_id}"``, ``"http://svc/users/{user_id}"``."""

from __future__ import annotations

import string
from collections.abc import Callable
from operator import itemgetter
from typing import Any
from urllib.parse import quote

from .exceptions import LookupOptionError, TemplateError

__all__ = ["Template"]


def _quote_all(value: str) -> str:
    quoted = quote(value, safe="")
    # a value that is (or, to a server decoding %2F, holds) a dot segment would climb the path
    # ('/users/{id}' with id='..' asks for '/'): percent-encoded dots make it just a name
    if quoted in (".", "..") or ("%2F" in quoted and "." in quoted):
        return quoted.replace(".", "%2E")
    return quoted


class Template:
    """A compiled ``str.format``-style template whose fields come from a record.

    Only plain field names are allowed (no format specs or attribute access); a field that is
    missing or None in the record raises a :class:`TemplateError` naming it.
    """

    __slots__ = ("_fields", "_parts", "_quote", "text")

    def __init__(self, text: str, *, url_quote: bool = False) -> None:
        self.text = text
        self._quote: Callable[[str], str] = _quote_all if url_quote else str
        parts: list[tuple[str, str | None]] = []
        for literal, field, spec, conv in string.Formatter().parse(text):
            if field is not None and (spec or conv or not field.isidentifier()):
                raise LookupOptionError(
                    "template", f"template {text!r}: use plain field names like {{user_id}}, got {{{field}}}"
                )
            parts.append((literal, field))
        self._parts = parts
        self._fields = tuple(f for _, f in parts if f is not None)

    @property
    def fields(self) -> tuple[str, ...]:
        return self._fields

    def with_fields(self, name: str) -> Template:
        """This template, checked to name a field: one that names none renders the same text
        for every record (``"customer:{{cid}}"``: doubled braces are literal braces), so every
        record would read or write one key; a LookupOptionError names ``name`` instead."""
        if not self._fields:
            raise LookupOptionError(
                name,
                f"{name}={self.text!r} names no field, so every record would get the same {name}; name "
                "a field in braces, e.g. 'customer:{cid}' (a Redis Cluster hash tag around it: "
                "'customer:{{{cid}}}')",
            )
        return self

    def render_many(self, records: list[Any]) -> list[str]:
        """:meth:`render` for many records; one comprehension when the template has one field."""
        if len(self._fields) == 1 and self._quote is str:
            field = self._fields[0]
            prefix = self._parts[0][0]
            suffix = "".join(literal for literal, _ in self._parts[1:])
            try:
                values = list(map(itemgetter(field), records))
            except (KeyError, IndexError, TypeError):
                values = None
            if values is not None and None not in values:
                if suffix:
                    return [f"{prefix}{value}{suffix}" for value in values]
                return [f"{prefix}{value}" for value in values]
        return [self.render(record) for record in records]  # raises the precise error

    def render_values(self, values: list[Any]) -> list[str] | None:
        """A one-field template over that field's values (a column); None when it has other
        fields, or a value is None (then :meth:`render_many` names the record)."""
        if len(self._fields) != 1 or self._quote is not str or None in values:
            return None
        prefix = self._parts[0][0]
        suffix = "".join(literal for literal, _ in self._parts[1:])
        return [f"{prefix}{value}{suffix}" for value in values]

    def render(self, record: Any) -> str:
        out = []
        for literal, field in self._parts:
            out.append(literal)
            if field is not None:
                try:
                    value = record[field]
                except (KeyError, IndexError, TypeError):
                    raise TemplateError(self.text, field, record) from None
                if value is None:
                    raise TemplateError(self.text, field, record)
                # an int's text needs no quoting: most keys are ints, and quote() is slow
                out.append(str(value) if type(value) is int else self._quote(str(value)))
        return "".join(out)

    def __repr__(self) -> str:
        return f"Template({self.text!r})"

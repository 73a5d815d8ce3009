"""Secrets kept out of reprs, logs, errors and plans.

A :class:`Secret` holds a credential (a token, a password, an API key in a header or a query
parameter); its repr is ``Secret('***')``. :class:`Redactor` removes the secrets of one lookup
from any text before it becomes part of an error, and :func:`split_userinfo` takes
``user:password@`` out of a URL, so that the URL can be shown anywhere.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Iterable

from .exceptions import LookupOptionError

__all__ = ["REDACTED", "Redactor", "Secret", "redact_url", "split_userinfo"]

REDACTED = "***"


class Secret:
    """A value that never shows in a repr, a log line or an error."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        if not isinstance(value, str):
            raise TypeError(f"a Secret holds a str, got {type(value).__name__}")
        self._value = value

    @classmethod
    def from_env(cls, name: str, option: str | None = None) -> Secret:
        """The value of the environment variable ``name``; ``option``: the option that named it,
        for the error when it is not set."""
        value = os.environ.get(name)
        if value is None:
            said = f"{option}={name!r}: " if option else ""
            raise LookupOptionError(
                option or name, f"{said}environment variable {name} is not set (it should hold a secret)"
            )
        return cls(value)

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"Secret({REDACTED!r})"

    __str__ = __repr__

    def __reduce__(self) -> tuple[type[Secret], tuple[str]]:
        return (Secret, (self._value,))  # travels to the executors that need it, never printed


def split_userinfo(url: str) -> tuple[str, tuple[str, str] | None]:
    """``url`` without ``user:password@``, and the (decoded) pair when it had one."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, host = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    clean = urllib.parse.urlunsplit(parts._replace(netloc=host))
    return clean, (urllib.parse.unquote(user), urllib.parse.unquote(password))


def redact_url(url: str) -> str:
    """``url`` with any ``user:password@`` shown as ``***@``."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{REDACTED}@{host}"))


class Redactor:
    """Replaces every form a secret may take in a message (as given, URL-quoted) by ``***``."""

    __slots__ = ("_forms",)

    def __init__(self, secrets: Iterable[str]) -> None:
        forms: set[str] = set()
        for secret in secrets:
            if secret:
                forms.update(
                    {secret, urllib.parse.quote(secret, safe=""), urllib.parse.quote_plus(secret, safe="")}
                )
        self._forms = sorted(forms, key=len, reverse=True)  # longest first: no partial leftovers

    def __bool__(self) -> bool:
        return bool(self._forms)

    def redact(self, text: str) -> str:
        for form in self._forms:
            if form in text:
                text = text.replace(form, REDACTED)
        return text

    def holds_secret(self, text: str) -> bool:
        return any(form in text for form in self._forms)

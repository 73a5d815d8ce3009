"""Declared output fields: which values of an answer become which result columns, typed."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .exceptions import BODY_LIMIT, BadResponseError, LookupOptionError

__all__ = ["Field", "FieldMapper"]

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "int": (int,),
    "float": (float, int),
    "bool": (bool,),
    "json": (object,),
}
_EXACT: dict[str, type] = {"string": str, "int": int, "float": float, "bool": bool}  # as given
_ABSENT: Any = object()  # a path that is not in the answer (unlike a JSON null)

# a typed field over a store whose values are strings (Redis hashes, decode="raw") reads the
# string as the JSON literal of its type, and nothing else: no spaces, signs, or other spellings
_LITERALS: dict[str, re.Pattern[str]] = {
    "int": re.compile(r"-?(?:0|[1-9][0-9]*)"),
    "float": re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"),
    "bool": re.compile(r"true|false"),
}


def parse_literal(text: str, ftype: str) -> Any:
    """``text`` as a value of ``ftype`` (int, float, bool) by the strict rule above; raises
    ValueError naming what is allowed."""
    if _LITERALS[ftype].fullmatch(text) is None:
        allowed = {"int": "digits, an optional '-'", "float": "a JSON number", "bool": "true or false"}
        raise ValueError(f"{text!r} is not {ftype} ({allowed[ftype]}, nothing around it)")
    if ftype == "bool":
        return text == "true"
    return int(text) if ftype == "int" else float(text)


SPARK_TYPES = {"string": "string", "int": "bigint", "float": "double", "bool": "boolean", "json": "string"}


@dataclass(frozen=True)
class Field:
    """A result column: ``name``, its ``type`` (string, int, float, bool, json) and the ``path``
    into the answer (dots for nesting; default: the name).

    The path must be in every answer: an answer without it is a bad response naming the field
    and the lookup key, never a silent NULL. Its value may be JSON null (the service said so),
    unless ``required`` (present and not null). ``optional`` fields may be absent (NULL then).
    """

    name: str
    type: str = "string"
    path: str | None = None
    required: bool = False
    optional: bool = False

    def __post_init__(self) -> None:
        if self.type not in _TYPES:
            raise LookupOptionError(
                "field", f"field {self.name!r}: type={self.type!r}; allowed: {', '.join(_TYPES)}"
            )
        if self.required and self.optional:
            raise LookupOptionError("field", f"field {self.name!r}: required and optional exclude each other")

    @property
    def spark_type(self) -> str:
        return SPARK_TYPES[self.type]


def _parse(spec: Field | str | tuple[str, str] | tuple[str, str, str]) -> Field:
    if isinstance(spec, Field):
        return spec
    if isinstance(spec, str):
        return Field(spec)
    return Field(*spec)


class FieldMapper:
    """Turns one decoded answer (a dict) into a result dict of the declared fields.

    Paths and type checks are compiled once; a row then costs a dict lookup and a type check
    per field.
    """

    def __init__(
        self,
        fields: Sequence[Field | str | tuple[str, str]] | None,
        result_path: str | None = None,
        body_limit: int = BODY_LIMIT,
        from_strings: bool = False,
    ):
        self.fields = tuple(_parse(f) for f in fields) if fields else None
        self.from_strings = from_strings  # the store's values are strings: typed fields parse them
        self.result_path = result_path
        self.body_limit = body_limit  # how much of an answer an error may show
        self._compiled = [
            (f.name, tuple((f.path or f.name).split(".")), f.type, f.required, f.optional)
            for f in self.fields or ()
        ]
        # the common answer (a dict, top-level fields of exactly the declared type) in one pass;
        # anything else (nulls, ints for floats, nesting, json, a wrong type) takes the full path
        self._direct = (
            [(f.name, f.path or f.name, _EXACT[f.type]) for f in self.fields]
            if self.fields is not None
            and not result_path
            and all(f.type in _EXACT and "." not in (f.path or f.name) for f in self.fields)
            else None
        )

    def schema_ddl(self) -> str | None:
        if self.fields is None:
            return None
        return ", ".join(f"{f.name} {f.spark_type}" for f in self.fields)

    def map(self, answer: Any, lookup_key: Any, service: str) -> dict[str, Any] | Any:
        direct = self._direct
        if direct is not None and type(answer) is dict:
            out: dict[str, Any] = {}
            for name, key, kind in direct:
                found = answer.get(key)
                if type(found) is not kind:
                    break
                out[name] = found
            else:
                return out
        return self._map(answer, lookup_key, service)

    def map_all(self, answers: list[Any], keys: list[Any], service: str) -> list[Any]:
        """Per answer: a miss (None) or an error (an exception) as it is, else
        ``[map(answer, key, service)]``; raises what :meth:`map` raises for the first answer
        that does not map. Why: a batch of answers with one field of a plain type (the common
        lookup) is mapped in one comprehension, with no call per answer."""
        mapper, direct = self.map, self._direct
        if direct is None or len(direct) != 1:
            return [
                a if a is None or isinstance(a, BaseException) else [mapper(a, k, service)]
                for a, k in zip(answers, keys, strict=True)
            ]
        ((name, key, kind),) = direct
        return [
            [{name: found}]
            if type(a) is dict and type(found := a.get(key)) is kind
            else a
            if a is None or isinstance(a, BaseException)
            else [mapper(a, k, service)]
            for a, k in zip(answers, keys, strict=True)
        ]

    def _literal(self, name: str, text: str, ftype: str, where: tuple[Any, str, Any]) -> Any:
        """A string of a store whose values are strings, read as ``ftype`` (or an error)."""
        lookup_key, service, value = where
        try:
            return parse_literal(text, ftype)
        except ValueError as why:
            raise BadResponseError(
                f"field {name!r}: {why}",
                lookup_key=lookup_key,
                service=service,
                body=repr(value),
                body_limit=self.body_limit,
            ) from None

    def _map(self, answer: Any, lookup_key: Any, service: str) -> dict[str, Any] | Any:
        value = (
            _walk(answer, self.result_path, lookup_key, service, self.body_limit)
            if self.result_path
            else answer
        )
        if self.fields is None:
            return value
        if not isinstance(value, Mapping):
            raise BadResponseError(
                f"expected a JSON object with fields {[f.name for f in self.fields]}, got "
                f"{type(value).__name__}",
                lookup_key=lookup_key,
                service=service,
                body=repr(value),
                body_limit=self.body_limit,
            )
        out: dict[str, Any] = {}
        for name, parts, ftype, required, optional in self._compiled:
            found: Any = value
            for part in parts:
                if type(found) is dict or isinstance(found, Mapping):
                    found = found.get(part, _ABSENT)
                elif isinstance(found, list) and part.isdigit() and int(part) < len(found):
                    found = found[int(part)]
                else:
                    found = _ABSENT
                if found is None or found is _ABSENT:
                    break  # a null on the way is the service's null; an absent key is not
            if found is _ABSENT and not optional:
                raise BadResponseError(
                    f"field {name!r} (path {'.'.join(parts)!r}) is missing from the answer; declare "
                    f"Field({name!r}, optional=True) if the service may leave it out",
                    lookup_key=lookup_key,
                    service=service,
                    body=repr(value),
                    body_limit=self.body_limit,
                )
            if found is None or found is _ABSENT:
                if required:
                    raise BadResponseError(
                        f"required field {name!r} (path {'.'.join(parts)!r}) is null",
                        lookup_key=lookup_key,
                        service=service,
                        body=repr(value),
                        body_limit=self.body_limit,
                    )
                out[name] = None
                continue
            if self.from_strings and type(found) is str and ftype in _LITERALS:
                found = self._literal(name, found, ftype, (lookup_key, service, value))
            kind = type(found)
            if ftype == "string":
                ok = kind is str
            elif ftype == "float":
                ok = kind is float or kind is int
                found = float(found) if ok else found
            elif ftype == "int":
                ok = kind is int
            elif ftype == "bool":
                ok = kind is bool
            else:  # json
                ok = True
                if kind is not str:
                    found = json.dumps(found)
            if not ok:
                raise BadResponseError(
                    mismatch(name, ftype, found, ".".join(parts)),
                    lookup_key=lookup_key,
                    service=service,
                    body=repr(value),
                    body_limit=self.body_limit,
                )
            out[name] = found
        return out


# what a decoded JSON value is, the Field type that takes it, and another way to read it
_JSON_KINDS: dict[type, tuple[str, str, str]] = {
    str: ("a JSON string", "string", ""),
    bool: ("a JSON boolean", "bool", ""),
    int: ("a JSON number (an integer)", "int", " ('float' takes it too)"),
    float: ("a JSON number", "float", ""),
    dict: ("a JSON object", "json", " (the object as JSON text), or one field per value with path='a.b'"),
    list: ("a JSON array", "json", " (the array as JSON text), or path='a.0' for one element"),
}


def mismatch(name: str, declared: str, found: Any, path: str) -> str:
    """The message for a value of another type than its field declares: the JSON type met and
    the type to declare (``Field`` is strict: a number is never read as a string, nor a string
    as a number)."""
    met, declare, hint = _JSON_KINDS.get(type(found), (f"a {type(found).__name__}", "json", ""))
    where = f" (path {path!r})" if path != name else ""
    return (
        f"field {name!r}{where} should be {declared}, but the answer has {met} there: {found!r}; "
        f"declare Field({name!r}, {declare!r}){hint}"
    )


def _walk(value: Any, path: str, lookup_key: Any, service: str, body_limit: int = BODY_LIMIT) -> Any:
    for part in path.split("."):
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise BadResponseError(
                f"path {path!r} not found in the answer",
                lookup_key=lookup_key,
                service=service,
                body=repr(value),
                body_limit=body_limit,
            )
    return value

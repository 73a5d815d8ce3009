"""``kaw-enrich`` on your own data: a file, a folder or a table, looked up row by row over HTTP
or in Redis, written where you say; batch, or a stream of the files in a folder.

Every flag is checked in :func:`check` before Spark starts (a :class:`UsageError` names the flag,
what was given and what is allowed; ``kaw-enrich`` prints it as argparse does and exits 2). The
columns the flags name are checked against the input's schema in :func:`check_columns`, after it
is read and before anything is written. :func:`keyed_async_wait.app.own_job.run` then does the
job and returns its summary.
"""

from __future__ import annotations

import argparse
import os
import re
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lookup import Field, HttpLookup, RedisLookup, Secret
from lookup.exceptions import LookupOptionError
from lookup.fields import SPARK_TYPES
from lookup.template import Template

__all__ = [
    "DEMO_ONLY",
    "EPILOG",
    "OWN_DATA_ONLY",
    "Plan",
    "UsageError",
    "add_arguments",
    "check",
    "check_columns",
    "data_files",
    "local_path",
]

FORMATS = ("parquet", "csv", "json")
MODES = ("key_ordered", "ordered", "unordered")
FIELD_TYPES = tuple(SPARK_TYPES)  # what lookup.Field takes: string, int, float, bool, json
_EXTENSIONS = {".parquet": "parquet", ".csv": "csv", ".json": "json", ".jsonl": "json", ".ndjson": "json"}
_COMPRESSED = {".gz", ".bz2", ".snappy", ".zst", ".lz4", ".deflate", ".xz"}
_FIELD = re.compile(
    r"(?:(?P<column>[A-Za-z_][A-Za-z0-9_]*)=)?"
    r"(?P<path>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)(?::(?P<type>[a-z]+))?"
)
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_COLUMN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# flags of one path only (dest names): given on the other, they are an error naming both
DEMO_ONLY = ("rows", "orders", "latency", "shared_cache_ttl", "workdir")
OWN_DATA_ONLY = (
    *("format", "schema", "key", "order_by", "redis_key", "field", "result_path", "header"),
    *("bearer_env", "error_column", "output_format", "overwrite", "stream"),
)

EPILOG = """\
your own data (--input PATH or --table NAME; nothing else of the demo applies):

  HTTP with a bearer token (read from $USERS_TOKEN), over parquet, in key order per user:
    export USERS_TOKEN=...
    kaw-enrich --input orders.parquet --output enriched/ \\
      --http-url 'https://users.example.com/users/{user_id}' --bearer-env USERS_TOKEN \\
      --field name --field score:float --field country=address.country \\
      --key user_id --order-by id --error-column lookup_error

  Redis over CSV (a header row; column types inferred, or --schema), one GET per row:
    kaw-enrich --input payments.csv --output enriched-csv/ --output-format csv \\
      --redis-url redis://127.0.0.1:6379/0 --redis-key 'user:{user_id}' \\
      --field name --field tier --mode unordered

  A stream: every file in the folder (and any that came since the last run), then it stops:
    kaw-enrich --input incoming/ --format json --stream --checkpoint state/ --output enriched/ \\
      --http-url 'http://127.0.0.1:8080/users/{user_id}' --field name --key user_id

--field [COLUMN=]NAME[:TYPE]: NAME is the answer's field (dots for nesting: address.city, a
column named address_city unless COLUMN names it), TYPE one of string (default), int, float,
bool, json (a nested value as JSON text).
A placeholder {column} of --http-url, --redis-key or a --header value is the row's value.
Rows whose lookup finds nothing (404, no key) get NULLs; a failed call is tried --retries times
in all (0.1 s apart, then doubling, up to 2 s); a row that still fails fails the job, unless
--error-column keeps it, with its error. A summary (rows in and out, failed rows, wall time,
the output) is printed as JSON at the end. Without --input or --table the demo runs."""


class UsageError(Exception):
    """A flag that cannot be used: its name, what was given, and what is allowed."""

    def __init__(self, flag: str, given: str, allowed: str) -> None:
        self.flag, self.given, self.allowed = flag, given, allowed
        super().__init__(f"{flag}: {given}; {allowed}")


def positive_seconds(text: str) -> float:
    """An argparse type: seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}; allowed: seconds > 0 (e.g. 10 or 2.5)")
    return value


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}; allowed: an integer >= 1")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags only your own data takes (the ones it shares with the demo are ``enrich``'s)."""
    src = p.add_argument_group("your own data: the input (with --input or --table)")
    src.add_argument("--format", choices=FORMATS, help="the input's format (default: its extension)")
    src.add_argument("--schema", metavar="DDL", help="the input's schema, e.g. 'id long, user_id long'")
    src.add_argument("--stream", action="store_true", help="read --input, a folder, as a stream")
    order = p.add_argument_group("your own data: order")
    order.add_argument(
        "--key", metavar="COL[,COL...]", help="rows of one key are looked up one at a time, in order"
    )
    order.add_argument("--order-by", metavar="COL[,COL...]", help="the order within a key (default: as read)")
    look = p.add_argument_group("your own data: the lookup (--http-url TEMPLATE, or --redis-url)")
    look.add_argument("--redis-key", metavar="TEMPLATE", help="the Redis key of a row, e.g. 'user:{user_id}'")
    look.add_argument(
        "--field",
        action="append",
        metavar="[COLUMN=]NAME[:TYPE]",
        help=f"a result column from the answer (repeat it; TYPE: {', '.join(FIELD_TYPES)})",
    )
    look.add_argument("--result-path", metavar="PATH", help="where in the answer the fields are (a.b)")
    look.add_argument("--header", action="append", metavar="'NAME: VALUE'", help="an HTTP header (repeat it)")
    look.add_argument(
        "--bearer-env", metavar="VAR", help="send the token in $VAR as 'Authorization: Bearer ...'"
    )
    look.add_argument("--error-column", metavar="NAME", help="keep failed rows, with their error in NAME")
    out = p.add_argument_group("your own data: the output (--output PATH is required)")
    out.add_argument("--output-format", choices=FORMATS, help="the output's format (default parquet)")
    out.add_argument("--overwrite", action="store_true", help="replace a non-empty --output")


# ---------------------------------------------------------------------- the checked flags


@dataclass(frozen=True)
class Plan:
    """The job the flags ask for, every flag checked."""

    input: str | None
    table: str | None
    format: str | None  # None for a table
    schema: str | None
    stream: bool
    mode: str
    key: tuple[str, ...]
    order_by: tuple[str, ...]
    http_url: str | None
    redis_url: str | None
    redis_key: str | None
    fields: tuple[Field, ...]
    result_path: str | None
    headers: dict[str, str]
    bearer: Secret | None  # never shown: a Secret's repr is Secret('***')
    placeholders: tuple[tuple[str, str], ...]  # (flag, column) of every template
    timeout: float
    capacity: int
    error_column: str | None
    output: str
    output_format: str
    overwrite: bool
    checkpoint: str | None
    master: str | None
    remote: str | None
    partitions: int
    retries: int

    def lookup(self) -> HttpLookup | RedisLookup:
        """The lookup, made on the driver and pickled to the workers."""
        if self.http_url is not None:
            return HttpLookup(
                self.http_url,
                headers=self.headers or None,
                fields=list(self.fields),
                result_path=self.result_path,
                bearer_token=self.bearer,
                request_timeout=self.timeout,
            )
        assert self.redis_url is not None and self.redis_key is not None
        return RedisLookup(
            self.redis_url,
            self.redis_key,
            fields=list(self.fields),
            result_path=self.result_path,
            socket_timeout=min(5.0, self.timeout),
        )


def local_path(path: str) -> Path | None:
    """``path`` on this machine, or None for another file system's URI (s3a://, hdfs://)."""
    scheme = urllib.parse.urlsplit(path).scheme
    if scheme == "file":
        return Path(urllib.parse.urlsplit(path).path)
    return Path(path) if len(scheme) <= 1 else None  # a drive letter is no scheme


def _non_empty(path: Path) -> bool:
    return path.is_file() or (path.is_dir() and any(path.iterdir()))


def _extension_format(name: str) -> str | None:
    suffixes = [s.lower() for s in Path(name).suffixes]
    while suffixes and suffixes[-1] in _COMPRESSED:
        suffixes.pop()
    return _EXTENSIONS.get(suffixes[-1]) if suffixes else None


def data_files(folder: Path) -> list[Path]:
    """The files Spark reads in ``folder`` (not _SUCCESS, .crc or other hidden ones)."""
    return [
        f
        for f in folder.rglob("*")
        if f.is_file() and not any(part.startswith(("_", ".")) for part in f.relative_to(folder).parts)
    ]


def _input_format(args: argparse.Namespace) -> str:
    """--format, else the extension of --input or of the files in it."""
    if args.format is not None:
        return str(args.format)
    path: str = args.input
    found = _extension_format(path.rstrip("/"))
    local = local_path(path)
    if found is None and local is not None and local.is_dir():
        kinds = {_extension_format(f.name) for f in data_files(local)}
        found = kinds.pop() if len(kinds) == 1 else None
    if found is None:
        raise UsageError(
            "--format",
            f"not given, and {path!r} has no extension it can be told from",
            f"--format {{{','.join(FORMATS)}}}",
        )
    return found


def _columns(flag: str, text: str | None) -> tuple[str, ...]:
    if text is None:
        return ()
    names = tuple(c.strip() for c in text.split(","))
    if not all(names) or len(set(names)) != len(names):
        raise UsageError(flag, f"{text!r}", "column names separated by commas, each once (a,b)")
    return names


def _fields(specs: Sequence[str] | None) -> tuple[Field, ...]:
    if not specs:
        raise UsageError(
            "--field", "none given", "one or more --field [COLUMN=]NAME[:TYPE], the columns to add"
        )
    fields: list[Field] = []
    for spec in specs:
        match = _FIELD.fullmatch(spec)
        if match is None or (match["type"] is not None and match["type"] not in FIELD_TYPES):
            raise UsageError(
                "--field",
                f"{spec!r}",
                f"[COLUMN=]NAME[:TYPE], NAME a field of the answer (a.b for nesting), COLUMN the "
                f"column's name (default: NAME, dots as '_'), TYPE one of {', '.join(FIELD_TYPES)}",
            )
        path = match["path"]
        column = match["column"] or path.replace(".", "_")
        fields.append(Field(column, match["type"] or "string", path=path))
    names = [f.name for f in fields]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UsageError("--field", f"{twice[0]!r} named twice", "each result column once")
    return tuple(fields)


def _template(flag: str, text: str, *, url: bool = False) -> tuple[str, ...]:
    """The columns a template names; it must name at least one."""
    try:
        fields = Template(text, url_quote=url).fields
    except LookupOptionError:
        fields = ("",)
    if not fields or not all(_COLUMN.fullmatch(f) for f in fields):
        raise UsageError(
            flag, f"{text!r}", "a template naming input columns in braces, e.g. 'user:{user_id}'"
        )
    return fields


def _headers(specs: Sequence[str] | None) -> dict[str, str]:
    headers: dict[str, str] = {}
    for spec in specs or ():
        name, colon, value = spec.partition(":")
        name, value = name.strip(), value.strip()
        if not colon or not _HEADER_NAME.fullmatch(name) or not value:
            raise UsageError("--header", f"{spec!r}", "'Name: value' (the value may name {column}s)")
        try:
            Template(value)
        except LookupOptionError:
            raise UsageError("--header", f"{spec!r}", "a value with plain {column} placeholders") from None
        headers[name] = value
    return headers


def _lookup_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The lookup's flags, checked: exactly one of HTTP and Redis, and what goes with each."""
    if (args.http_url is None) == (args.redis_url is None):
        given = "both given" if args.http_url else "neither given"
        raise UsageError(
            "--http-url", f"{given} with --redis-url", "one lookup: --http-url TEMPLATE, or --redis-url URL"
        )
    placeholders: list[tuple[str, str]] = []
    headers = _headers(args.header)
    bearer = None
    if args.http_url is not None:
        parts = urllib.parse.urlsplit(args.http_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise UsageError("--http-url", f"{args.http_url!r}", "an http:// or https:// URL template")
        placeholders += [("--http-url", c) for c in _template("--http-url", args.http_url, url=True)]
        if args.redis_key is not None:
            raise UsageError("--redis-key", "given with --http-url", "--redis-key only with --redis-url")
        if args.bearer_env is not None:
            token = os.environ.get(args.bearer_env)
            if not token:
                raise UsageError(
                    "--bearer-env",
                    f"environment variable {args.bearer_env} is not set or empty",
                    "the name of a variable that holds the token",
                )
            if any(name.lower() == "authorization" for name in headers):
                raise UsageError("--header", "Authorization given with --bearer-env", "one of them")
            bearer = Secret(token)
        for value in headers.values():
            placeholders += [("--header", c) for c in Template(value).fields]
    else:
        scheme = urllib.parse.urlsplit(args.redis_url).scheme
        if scheme not in ("redis", "rediss", "unix"):
            raise UsageError("--redis-url", f"{args.redis_url!r}", "a redis://, rediss:// or unix:// URL")
        if args.redis_key is None:
            raise UsageError(
                "--redis-key", "not given", "--redis-key TEMPLATE with --redis-url, e.g. 'user:{id}'"
            )
        placeholders += [("--redis-key", c) for c in _template("--redis-key", args.redis_key)]
        for flag in ("header", "bearer_env"):
            if getattr(args, flag) is not None:
                name = "--" + flag.replace("_", "-")
                raise UsageError(name, "given with --redis-url", f"{name} only with --http-url")
    return dict(
        http_url=args.http_url,
        redis_url=args.redis_url,
        redis_key=args.redis_key,
        fields=_fields(args.field),
        result_path=args.result_path,
        headers=headers,
        bearer=bearer,
        placeholders=tuple(placeholders),
    )


def _order_flags(args: argparse.Namespace) -> dict[str, Any]:
    key = _columns("--key", args.key)
    order_by = _columns("--order-by", args.order_by)
    mode = args.mode or ("key_ordered" if key else "unordered")
    if order_by and not key and args.mode is None:
        raise UsageError(
            "--order-by", "given without --key", "--order-by with --key: the order within each key"
        )
    if mode == "key_ordered" and not key:
        raise UsageError("--key", "not given with --mode key_ordered", "--key COL[,COL...], the rows' key")
    if mode != "key_ordered":
        for flag, given in (("--key", key), ("--order-by", order_by)):
            if given:
                raise UsageError(flag, f"given with --mode {mode}", f"{flag} only with --mode key_ordered")
    return dict(mode=mode, key=key, order_by=order_by)


def _paths(args: argparse.Namespace) -> dict[str, Any]:
    """Input, output and checkpoint: there, not the same, and nothing overwritten unasked."""
    if args.output is None:
        raise UsageError("--output", "not given", "--output PATH, where the enriched rows go")
    if args.stream and args.input is None:
        raise UsageError("--stream", "given with --table", "--stream with --input FOLDER")
    if args.stream and args.checkpoint is None:
        raise UsageError("--checkpoint", "not given with --stream", "--checkpoint PATH, the stream's state")
    if not args.stream and args.checkpoint is not None:
        raise UsageError("--checkpoint", "given without --stream", "--checkpoint only with --stream")
    output = local_path(args.output)
    source = local_path(args.input) if args.input is not None else None
    if args.input is not None and source is not None:
        if not source.exists():
            raise UsageError("--input", f"{args.input!r} does not exist", "an existing file or folder")
        if args.stream and not source.is_dir():
            raise UsageError("--input", f"{args.input!r} is a file", "a folder with --stream")
        if output is not None:
            a, b = source.resolve(), output.resolve()
            if a == b or a in b.parents or b in a.parents:
                raise UsageError("--output", f"{args.output!r} overlaps --input", "a path outside the input")
    checkpoint = local_path(args.checkpoint) if args.checkpoint is not None else None
    resumed = checkpoint is not None and _non_empty(checkpoint)  # a stream's next run appends
    if output is not None and _non_empty(output) and not args.overwrite and not (args.stream and resumed):
        raise UsageError(
            "--output", f"{args.output!r} is not empty", "an empty or new path, or --overwrite to replace it"
        )
    if args.overwrite and args.stream and (output is None or (args.checkpoint and checkpoint is None)):
        raise UsageError("--overwrite", "with --stream to a remote path", "--overwrite a local stream output")
    if args.error_column is not None and not _COLUMN.fullmatch(args.error_column):
        raise UsageError("--error-column", f"{args.error_column!r}", "a column name (letters, digits, _)")
    return dict(
        input=args.input,
        table=args.table,
        output=args.output,
        output_format=args.output_format or "parquet",
        overwrite=args.overwrite,
        checkpoint=args.checkpoint,
    )


def check(args: argparse.Namespace) -> Plan:
    """Every flag of a job on your own data, checked before Spark starts (``UsageError``)."""
    source = "--input" if args.input is not None else "--table"
    for dest in DEMO_ONLY:
        if getattr(args, dest) is not None:
            flag = "--" + dest.replace("_", "-")
            raise UsageError(
                flag, f"given with {source}", f"{flag} only for the demo (no --input or --table)"
            )
    if args.table is not None and args.format is not None:
        raise UsageError("--format", "given with --table", "--format only with --input")
    paths = _paths(args)
    return Plan(
        format=_input_format(args) if args.input is not None else None,
        schema=args.schema,
        stream=args.stream,
        timeout=args.timeout,
        capacity=args.capacity,
        error_column=args.error_column,
        master=args.master,
        remote=args.remote,
        partitions=args.partitions,
        retries=args.retries,
        **paths,
        **_order_flags(args),
        **_lookup_flags(args),
    )


def check_columns(plan: Plan, columns: Sequence[str]) -> None:
    """The columns the flags name, against the input's: every key, order and placeholder
    column there, every result column new."""
    there = ", ".join(columns)
    named = [("--key", c) for c in plan.key] + [("--order-by", c) for c in plan.order_by]
    for flag, column in [*named, *plan.placeholders]:
        if column not in columns:
            raise UsageError(flag, f"column {column!r} is not in the input", f"the input's columns: {there}")
    new = [("--field", f.name) for f in plan.fields]
    new += [("--error-column", plan.error_column)] if plan.error_column else []
    for flag, column in new:
        if column in columns:
            hint = " (--field COLUMN=NAME[:TYPE] names it)" if flag == "--field" else ""
            raise UsageError(
                flag, f"column {column!r} is already in the input ({there})", "a new column name" + hint
            )
    if plan.error_column in [f.name for f in plan.fields]:
        raise UsageError("--error-column", f"{plan.error_column!r} is a --field too", "another name")

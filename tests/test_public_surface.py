"""The public surface: what the packages export, one error tree, and the 0.1 names that moved
(each still works for a release, with a DeprecationWarning that names the new place)."""

from __future__ import annotations

import builtins
import importlib
import re
import warnings
from pathlib import Path

import pytest

import keyed_async_wait
import lookup
import sql_ext
from keyed_async_wait import KeyedAsyncWaitError

ROOT = Path(__file__).parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# errors a page names that are not ours: the JVM's and aiohttp's, as a message shows them
FOREIGN_ERRORS = {"StackOverflowError", "ClientError"}
MOVED_TO_OPERATOR = [
    "FailedRecord",
    "KeyedAsyncWaitOperator",
    "OperatorSnapshot",
    "OperatorStats",
    "OutputMode",
    "Watermark",
    "key_group_for",
    "key_group_range",
    "subtask_for_key",
]


def _exported() -> set[str]:
    return {*keyed_async_wait.__all__, *lookup.__all__, *sql_ext.__all__}


def test_every_error_a_page_names_is_exported() -> None:
    named = {
        (name, page.relative_to(ROOT).as_posix())
        for page in PAGES
        for name in re.findall(r"\b[A-Z][A-Za-z]+Error\b", page.read_text())
    }
    missing = sorted(
        (name, page)
        for name, page in named
        if name not in _exported() and not hasattr(builtins, name) and name not in FOREIGN_ERRORS
    )
    assert not missing, f"errors the docs name that no package exports: {missing}"


@pytest.mark.parametrize("package", [keyed_async_wait, lookup, sql_ext], ids=lambda p: p.__name__)
def test_every_exported_error_is_a_keyed_async_wait_error(package: object) -> None:
    for name in package.__all__:  # type: ignore[attr-defined]
        if name.endswith("Error"):
            value = getattr(package, name)
            assert issubclass(value, KeyedAsyncWaitError), f"{package.__name__}.{name}"  # type: ignore[attr-defined]


def test_every_exported_name_resolves_without_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for package in (keyed_async_wait, lookup, sql_ext):
            for name in package.__all__:
                assert getattr(package, name) is not None


def test_the_stream_handle_is_exported() -> None:
    from keyed_async_wait.spark.stream import KeyedStream

    assert keyed_async_wait.KeyedStream is KeyedStream


@pytest.fixture
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keyed_async_wait, "_WARNED", set())  # as in a new process


@pytest.mark.usefixtures("fresh_warnings")
@pytest.mark.parametrize("name", MOVED_TO_OPERATOR)
def test_a_core_name_moved_to_the_operator_module_warns_once_and_works(name: str) -> None:
    operator = importlib.import_module("keyed_async_wait.operator")
    assert name in operator.__all__ and name not in keyed_async_wait.__all__
    with pytest.warns(DeprecationWarning, match=rf"keyed_async_wait\.{name} .*keyed_async_wait\.operator"):
        old = getattr(keyed_async_wait, name)
    assert old is getattr(operator, name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert getattr(keyed_async_wait, name) is old  # once is enough


@pytest.mark.usefixtures("fresh_warnings")
def test_the_old_import_statement_warns_once_at_the_importing_line() -> None:
    with pytest.warns(DeprecationWarning) as caught:
        from keyed_async_wait import Watermark  # noqa: F401
    assert [Path(w.filename).name for w in caught] == [Path(__file__).name]


def test_sql_decision_moved_to_its_module_warns_and_works() -> None:
    from sql_ext.modes import Decision

    assert "Decision" not in sql_ext.__all__
    with pytest.warns(DeprecationWarning, match=r"sql_ext\.modes"):
        assert sql_ext.Decision is Decision


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="nope"):
        _ = keyed_async_wait.nope  # type: ignore[attr-defined]
    with pytest.raises(AttributeError, match="nope"):
        _ = sql_ext.nope
    with pytest.raises(AttributeError, match="nope"):
        _ = lookup.nope


def test_every_lookup_name_is_listed_where_dir_and_star_imports_see_it() -> None:
    assert set(lookup.__all__) <= set(dir(lookup))
    scope: dict[str, object] = {}
    exec("from lookup import *", scope)  # the import a user may write
    assert set(lookup.__all__) <= set(scope)


# what a Spark worker does with an HttpLookup: unpickle it, build the task's function, send one
# request through the lean client (to a port where nothing listens), then list the clients loaded
_WORKER = """
import asyncio, pickle, sys
lookup = pickle.loads(sys.stdin.buffer.read())
import keyed_async_wait.spark.task
async def once():
    try:
        await lookup.invoke({"user_id": 1})
    except Exception as exc:
        print(type(exc).__name__)
    finally:
        await lookup.aclose()
asyncio.run(once())
print(sorted(m for m in ("aiohttp", "redis") if m in sys.modules))
"""


def test_a_worker_of_an_http_lookup_imports_neither_aiohttp_nor_redis() -> None:
    """A worker process pays for importing aiohttp and redis-py (about 0.3 CPU s) only when
    it uses them: the lean client needs neither, nor does a refused connection's error."""
    import pickle
    import subprocess
    import sys

    from lookup import Field, HttpLookup

    refused = HttpLookup("http://127.0.0.1:9/users/{user_id}", fields=[Field("name")])
    shown = (
        subprocess.run(
            [sys.executable, "-c", _WORKER],
            input=pickle.dumps(refused),
            capture_output=True,
            timeout=120,
            check=True,
        )
        .stdout.decode()
        .split()
    )
    assert shown == ["ServiceUnavailableError", "[]"]

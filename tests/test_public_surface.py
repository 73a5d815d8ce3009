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

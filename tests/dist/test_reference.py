"""The docs' API reference holds every public name, and the docs site's navigation every page."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"


@pytest.mark.parametrize("package", ["keyed_async_wait", "lookup", "sql_ext"])
def test_every_public_name_is_in_the_api_reference(package: str) -> None:
    text = (REFERENCE / f"{package}.md").read_text()
    shown = set(re.findall(r"^::: [\w.]+\.(\w+)$", text, re.M))
    shown |= set(re.findall(rf"`{package}\.(\w+)` is \[", text))  # a re-export, linked
    missing = sorted(set(importlib.import_module(package).__all__) - shown)
    assert not missing, f"not in docs/reference/{package}.md: {missing}"


def test_every_page_is_in_the_site_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    missing = sorted(p for p in pages if p not in nav)
    assert not missing, f"pages left out of mkdocs.yml's nav: {missing}"

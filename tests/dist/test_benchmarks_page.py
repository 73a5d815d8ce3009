"""The benchmarks page is what ``benchmarks/report.py`` writes from ``benchmarks/results/*.json``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "benchmarks.md"


def test_the_page_is_what_the_report_writes() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "report.py"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"run ./run bench report: {done.stderr}"


def test_the_page_is_short_and_states_no_dates() -> None:
    text = PAGE.read_text()
    assert len(text.splitlines()) < 200
    assert not re.findall(r"\b\d{4}-\d{2}-\d{2}\b", text)

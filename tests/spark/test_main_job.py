"""The main job, end to end, as a new user runs it (in a process of its own, on a small input)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ..processes import run_bounded

pytestmark = pytest.mark.spark


def test_main_job_enriches_every_row_in_order(tmp_path: Path) -> None:
    done = run_bounded(
        [
            sys.executable,
            "-m",
            "keyed_async_wait.app.enrich",
            "--rows",
            "2000",
            "--orders",
            "200",
            "--master",
            "local[2]",
            "--workdir",
            str(tmp_path),
        ],
        timeout=300,
        cwd=Path(__file__).parents[2],
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["rows"] == 2000 and summary["enriched"] == 2000
    assert summary["orders"] == 200 and summary["orders_out_of_order"] == 0
    assert summary["lookups"] >= 2000 and summary["rows_per_s"] > 0
    assert (tmp_path / "output").is_dir() and (tmp_path / "checkpoint").is_dir()


def test_main_job_fails_with_the_cause() -> None:
    done = run_bounded(
        [
            sys.executable,
            "-m",
            "keyed_async_wait.app.enrich",
            "--input",
            "/nonexistent/kaw-input",
            "--rows",
            "10",
        ],
        timeout=300,
    )
    assert done.returncode != 0
    assert "kaw-enrich failed" in done.stderr

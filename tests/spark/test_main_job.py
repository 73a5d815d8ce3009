"""The main job, end to end, as a new user runs it (in a process of its own, on a small input)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ..processes import run_bounded

pytestmark = [pytest.mark.spark, pytest.mark.compat("the main job (kaw-enrich)")]


def test_main_job_enriches_every_row_in_order(tmp_path: Path) -> None:
    done = run_bounded(
        [
            sys.executable,
            "-m",
            "keyed_async_wait.app.enrich",
            "--rows",
            "1000",
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
    assert summary["rows"] == 1000 and summary["enriched"] == 1000
    lines = [line for f in (tmp_path / "input").glob("*.json") for line in f.read_text().splitlines()]
    given = {json.loads(line)["order_id"] for line in lines}  # the orders the input holds
    assert summary["orders"] == len(given) > 100 and summary["orders_out_of_order"] == 0
    # each row's customer asked of the service or found in the shared cache (L2), which other
    # rows of the same customer filled
    assert summary["shared_cache_hits"] > 0 and summary["rows_per_s"] > 0
    assert summary["lookups"] + summary["shared_cache_hits"] >= 1000
    assert (tmp_path / "output").is_dir() and (tmp_path / "checkpoint").is_dir()


def test_main_job_fails_with_the_cause(tmp_path: Path) -> None:
    """A failure after the flags were checked (here: an input that is no parquet) exits 1 and
    says what failed; nothing is written."""
    (tmp_path / "in.parquet").write_text("not parquet")
    done = run_bounded(
        [
            sys.executable,
            "-m",
            "keyed_async_wait.app.enrich",
            *("--input", str(tmp_path / "in.parquet"), "--output", str(tmp_path / "out")),
            *("--http-url", "http://127.0.0.1:9/u/{id}", "--field", "name", "--master", "local[1]"),
        ],
        timeout=300,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert "kaw-enrich failed" in done.stderr
    assert not (tmp_path / "out").exists()


def test_the_progress_shows_rows_as_the_metrics_grow_and_the_recent_rate() -> None:
    from keyed_async_wait.app.enrich import Progress

    class Metrics:
        rows = 0

        @property
        def value(self) -> dict[str, int]:
            return {"rows_out": self.rows, "lookups": 2 * self.rows, "peak_in_flight": 7}

    metrics = Metrics()
    progress = Progress(metrics, total=1000, tty=False)
    first = progress.sample()
    assert first["rows"] == 0 and first["rate"] == 0
    metrics.rows = 400  # a task ended: its rows count at once, not when the micro-batch commits
    shown = progress.line(progress.sample())
    assert shown.startswith("rows 400/1,000  ") and "lookups 800" in shown and "peak in flight 7" in shown
    assert progress.samples[-1][1] == 400 and progress.sample()["rate"] > 0

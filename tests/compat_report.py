"""The compatibility tier's record: which features passed on which pyspark.

With ``KAW_COMPAT_REPORT=FOLDER`` set, a run writes ``FOLDER/pyspark-<version>.json``: the versions
it ran with and, for each test marked ``compat("feature")``, its outcome.
``python -m tests.compat_report`` turns the records under ``docs/compat/`` into the support matrix
(``docs/compat/matrix.md``, and ``docs/guide/versions.md`` between its ``compat-matrix`` marks).
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

FOLDER = Path(__file__).parents[1] / "docs" / "compat"


class Recorder:
    """A pytest plugin: outcomes of the tests marked ``compat``, by feature."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.outcomes: dict[str, dict[str, str]] = defaultdict(dict)

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        feature = dict(report.user_properties).get("compat_feature")  # carried by xdist too
        if feature is None:
            return
        seen = self.outcomes[feature]
        counts = report.when == "call" or report.outcome != "passed"
        if counts and seen.get(report.nodeid) in (None, "passed"):  # a failed setup stays failed
            seen[report.nodeid] = report.outcome

    def write(self) -> None:
        import pandas
        import pyarrow
        import pyspark

        record: dict[str, Any] = {
            "pyspark": pyspark.__version__,
            "pyarrow": pyarrow.__version__,
            "pandas": pandas.__version__,
            "python": platform.python_version(),
            "features": {k: dict(sorted(v.items())) for k, v in sorted(self.outcomes.items())},
        }
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / f"pyspark-{pyspark.__version__}.json").write_text(json.dumps(record, indent=1) + "\n")


def feature_of(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("compat")
    if marker is None:
        return None
    return str(marker.args[0]) if marker.args else item.module.__name__.rsplit(".", 1)[-1]


def recorder_from_env(config: pytest.Config) -> Recorder | None:
    """The recorder, in the process that gathers the reports (not in an xdist worker)."""
    path = os.environ.get("KAW_COMPAT_REPORT")
    return Recorder(Path(path)) if path and not hasattr(config, "workerinput") else None


def matrix(records: list[dict[str, Any]]) -> str:
    """The support matrix: one row per feature, one column per pyspark, each cell what ran."""
    records = sorted(records, key=lambda r: tuple(int(p) for p in r["pyspark"].split(".")[:3]))
    features = sorted({f for r in records for f in r["features"]})
    head = "| feature | " + " | ".join(f"pyspark {r['pyspark']}" for r in records) + " |"
    lines = [head, "|---" * (len(records) + 1) + "|"]
    for feature in features:
        cells = []
        for r in records:
            outcomes = list(r["features"].get(feature, {}).values())
            passed, skipped = outcomes.count("passed"), outcomes.count("skipped")
            failed = len(outcomes) - passed - skipped
            tests = lambda n: f"{n} test" + ("" if n == 1 else "s")  # noqa: E731
            if not outcomes:
                cells.append("not run")
            elif failed:
                cells.append(f"**{tests(failed)} failed**, {passed} passed")
            elif passed and skipped:
                cells.append(f"partly: {tests(passed)} passed, {skipped} not carried (skipped)")
            elif passed:
                cells.append(f"yes ({tests(passed)})")
            else:
                cells.append(f"no: not carried ({tests(skipped)} skipped)")
        lines.append(f"| {feature} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        "not run: a long fault test (marked `compat_once`) that the tier runs on its oldest pyspark only."
    )
    lines.append("")
    lines.append(
        "Run with: "
        + "; ".join(f"pyspark {r['pyspark']}: pyarrow {r['pyarrow']}, pandas {r['pandas']}" for r in records)
        + f"; Python {records[0]['python'] if records else '?'}."
    )
    return "\n".join(lines) + "\n"


def main() -> int:
    records = [json.loads(p.read_text()) for p in sorted(FOLDER.glob("pyspark-*.json"))]
    if not records:
        print(f"no records in {FOLDER}: run ./run compat first", file=sys.stderr)
        return 1
    text = matrix(records)
    (FOLDER / "matrix.md").write_text(
        "# Support matrix (written by `python -m tests.compat_report` from the tier's records)\n\n" + text
    )
    page = FOLDER.parent / "guide" / "versions.md"
    start, end = "<!-- compat-matrix -->\n", "<!-- /compat-matrix -->"
    before, rest = page.read_text().split(start, 1)
    page.write_text(before + start + text + rest[rest.index(end) :])
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

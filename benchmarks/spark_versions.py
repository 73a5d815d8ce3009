"""``spark_throughput`` on the oldest and the newest supported pyspark, side by side, in one run.

    ./run bench spark_versions [--rows N]

Runs ``benchmarks/spark_throughput.py --quick`` (or ``--rows N``) in the compatibility tier's
venv of the oldest version (made by ``./run compat-setup``, called here) and then in ``.venv``
(the newest), one after the other on the same machine, and prints each job's rows/s under both
and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).parents[1]


def versions() -> list[str]:
    lines = (ROOT / ".ci" / "spark-versions").read_text().splitlines()
    return [line.split()[0] for line in lines if line.strip() and not line.startswith("#")]


def venv_python(version: str) -> Path:
    home = Path(os.environ.get("KAW_COMPAT_HOME", Path.home() / ".cache/keyed-async-wait/compat"))
    return home / f"pyspark-{version}" / "bin" / "python"


def run(python: Path, rows: int | None, out: Path) -> dict[str, float]:
    size = ["--rows", str(rows)] if rows else ["--quick"]
    env = {**os.environ, "PYSPARK_PYTHON": str(python), "PYSPARK_DRIVER_PYTHON": str(python)}
    script = ROOT / "benchmarks" / "spark_throughput.py"
    subprocess.run([str(python), str(script), *size, "--json", str(out)], check=True, env=env, cwd=ROOT)
    figures: dict[str, float] = json.loads(out.read_text())["rows_per_s"]
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, help="rows per job (default: --quick, 20,000)")
    args = parser.parse_args()
    oldest, newest = versions()[0], versions()[-1]
    # the tier's venv of the oldest, made or pointed at this checkout (another may have used it)
    subprocess.run(["bash", str(ROOT / "run"), "compat-setup", oldest], check=True, cwd=ROOT)
    older = venv_python(oldest)
    with tempfile.TemporaryDirectory() as tmp:
        old = run(older, args.rows, Path(tmp) / "old.json")
        new = run(Path(sys.executable), args.rows, Path(tmp) / "new.json")
    print(f"\n{'job':<52} {'pyspark ' + oldest:>15} {'pyspark ' + newest:>15}  newest/oldest")
    for label in dict.fromkeys([*old, *new]):
        a, b = old.get(label), new.get(label)
        cell = lambda v: f"{v:>15,.0f}" if v else f"{'left out':>15}"  # noqa: E731
        ratio = f"{b / a:8.2f}x" if a and b else ""
        print(f"{label:<52} {cell(a)} {cell(b)}  {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

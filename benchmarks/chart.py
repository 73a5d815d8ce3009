"""The throughput chart of the benchmarks page, drawn from ``spark_throughput``'s figures.

    ./run bench chart FIGURES.json OUT.svg        (or ``spark_throughput --chart OUT.svg``)

Left: each job's rows/s, the limit (``wrk`` at 400 and at 200 connections against the same
service) as lines; right: its CPU per row split by process (Spark's Python workers, its JVM,
the driver's Python). Ours in colour, the hand-written jobs in grey. matplotlib comes from
the ``bench`` extra; the SVG carries no date or random ids, so a new run changes it only
where its figures changed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

OURS, THEIRS = "#2a6fb0", "#a0a0a0"
PARTS = (("workers", "Python workers", "#2a6fb0"), ("jvm", "JVM", "#f0a030"), ("driver", "driver", "#70b070"))
LIMITS = (("wrk, 400 connections", "-"), ("wrk, 200 connections", "--"))


def draw(figures: dict[str, Any], out: Path) -> None:
    """Draw ``figures`` (as ``spark_throughput --json`` writes them) into the SVG ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.hashsalt": "keyed-async-wait", "font.size": 9})
    cpu: dict[str, dict[str, float]] = figures["cpu_us_per_row"]
    rates: dict[str, float] = figures["rows_per_s"]
    jobs = list(cpu)[::-1]  # top to bottom in the order they ran
    names = [job.removeprefix("(b) ") for job in jobs]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 0.45 * len(jobs) + 2.2), sharey=True)
    colours = [THEIRS if job.startswith("(b)") else OURS for job in jobs]
    left.barh(names, [rates[job] for job in jobs], color=colours)
    for label, style in LIMITS:
        if label in rates:
            left.axvline(rates[label], color="black", linestyle=style, linewidth=1, label=label)
    left.set_xlabel("rows/s (higher is better); ours in blue, hand-written in grey")
    left.xaxis.set_major_formatter(lambda x, _: f"{x:,.0f}")
    start = [0.0] * len(jobs)
    for key, name, colour in PARTS:
        widths = [cpu[job][key] for job in jobs]
        right.barh(names, widths, left=start, color=colour, label=name)
        start = [a + b for a, b in zip(start, widths, strict=True)]
    right.set_xlabel("CPU per row, microseconds (lower is better)")
    for axis in (left, right):
        axis.grid(axis="x", alpha=0.3)
        axis.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, fontsize=8, frameon=False)
    fig.suptitle(
        f"{figures['rows']:,} rows, 2,000 keys, a GET per row ({figures['service']} service, 20 ms), "
        f"local[2], pyspark {figures['pyspark']}, {figures.get('date', '')}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(out, format="svg", metadata={"Date": None})
    plt.close(fig)


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("figures", type=Path, help="spark_throughput --json's file")
    parser.add_argument("out", type=Path, help="the SVG to write")
    args = parser.parse_args()
    draw(json.loads(args.figures.read_text()), args.out)


if __name__ == "__main__":
    main()

"""CPU seconds of a local Spark job's processes: Spark's Python workers, its JVM, the driver.

Read with psutil before and after a job (reaped workers included, through the daemon's
children times); :func:`measure_split` turns the difference into CPU per 1,000 rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

import psutil
from pyspark.sql import DataFrame

Job = Callable[[], DataFrame]


def worker_cpu() -> float:
    """CPU seconds of Spark's Python workers so far (the daemon, its live and reaped children)."""
    total = 0.0
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if not any("pyspark.daemon" in part or "pyspark.worker" in part for part in cmdline):
            continue
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def jvm_cpu() -> float:
    """CPU seconds of the Spark JVMs this driver started (``local[...]``: one), so far."""
    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            if child.name() != "java":
                continue
            t = child.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def driver_cpu() -> float:
    """CPU seconds of this process (the driver's Python), so far."""
    t = psutil.Process().cpu_times()
    return t.user + t.system


class Split(NamedTuple):
    """One run: rows/s, and CPU seconds per 1,000 rows of Spark's Python workers, its JVM and
    the driver's Python."""

    rate: float
    workers: float
    jvm: float
    driver: float


def measure_split(job: Job, rows: int) -> Split:
    """:class:`Split` of one run."""
    before = (worker_cpu(), jvm_cpu(), driver_cpu())
    wall = time.perf_counter()
    job().write.format("noop").mode("overwrite").save()
    wall = time.perf_counter() - wall
    spent = [
        after - start for after, start in zip((worker_cpu(), jvm_cpu(), driver_cpu()), before, strict=True)
    ]
    return Split(rows / wall, *(cpu / rows * 1000 for cpu in spent))


def split_text(split: Split) -> str:
    """A run's CPU per row by process, in microseconds: ``"128 us a row = workers 103 + ..."``."""
    parts = {"workers": split.workers, "JVM": split.jvm, "driver": split.driver}
    shares = " + ".join(f"{name} {value * 1000:.0f}" for name, value in parts.items())
    return f"{sum(parts.values()) * 1000:.0f} us a row = {shares}"

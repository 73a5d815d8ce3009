"""CPU per row of a whole job beside the peers, every job in a process of its own, one sitting.

    ./run bench cost [--rows N] [--in-flight 400,800] [--peers ray,daft] [--runs K]
                     [--json PATH]

Against nginx's echo service (``cheap_service.py``, 20 ms), N rows over 2,000 keys, each job
keeps IN_FLIGHT requests in flight: ``key_ordered_wait`` and a hand-written ``mapInArrow`` with
aiohttp in Spark (``local[2]``), each with the JVM's defaults and with the options of a short
job (``SHORT_JOB_JAVA_OPTIONS``: the client compiler alone, the serial collector), Ray Data's
async actors and Daft's async UDF (``--peers``: each in a virtual environment of its own, made
on first use under ~/.cache/keyed-async-wait/peers; neither is a dependency of the library).
Every job checks its rows against their keys. Two figures per job, both the CPU of the whole
process tree (``peers/proc_tree.py``):

- *whole process*: from the job's process start to its end, start-up included (the JVM, Ray's
  services, the workers' imports), over its K runs' rows: what a user's bill follows. Sampled
  from /proc while the job runs (:class:`TreeMeter`): the rusage of reaped children would lose
  Spark's Python workers, whose daemon ignores SIGCHLD;
- *the last run*: over the job's K-th run in its session (K = ``--runs``, 2 by default: the
  workers already up, as ``spark_throughput``'s meter counts them), by process for Spark.

``wrk`` against the same service at each in-flight count is the limit; each job's rows/s is
printed as a fraction of it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "peers"))
import proc_tree
from cheap_service import nginx_echo
from spark_throughput import physical_limit

from keyed_async_wait.app.spark_session import SHORT_JOB_JAVA_OPTIONS

MACHINE = "2 cores, 24 GiB of memory, shared with other work"

PEERS = Path(__file__).with_name("peers")
PEER_HOME = Path.home() / ".cache" / "keyed-async-wait" / "peers"
PEER_PACKAGES = {"ray": ["ray[data]", "aiohttp"], "daft": ["daft", "aiohttp"]}


def peer_python(name: str) -> str:
    """The Python of the peer's own virtual environment, made on first use."""
    python = PEER_HOME / name / "bin" / "python"
    if not python.exists():
        print(f"making {python.parents[1]} for {name} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(python.parents[1])], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *PEER_PACKAGES[name]], check=True)
    return str(python)


class TreeMeter:
    """CPU seconds of every process that lives under this one while a job runs, sampled.

    Each process counts with the last CPU time it was seen at (its own, not its reaped
    children's: Spark's Python daemon ignores SIGCHLD, so its workers' time reaches no parent
    and only a sample taken while they live sees it). What a process spends after its last
    sample (at most ``every`` seconds of it) and processes shorter than ``every`` are missed;
    the processes that were there before the job (the service) are left out."""

    def __init__(self, every: float = 0.05) -> None:
        self.every = every
        self.seen: dict[int, float] = {}
        self.before = set(self._mine(proc_tree.own_times()))
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _mine(self, times: dict[int, tuple[int, float]]) -> dict[int, float]:
        """The processes under this one (a subreaper: orphans of a job stay under it)."""
        children: dict[int, list[int]] = {}
        for pid, (parent, _) in times.items():
            children.setdefault(parent, []).append(pid)
        out: dict[int, float] = {}
        todo = list(children.get(os.getpid(), []))
        while todo:  # bounded: each pid is met once (a tree)
            pid = todo.pop()
            if pid not in out:
                out[pid] = times[pid][1]
                todo.extend(children.get(pid, []))
        return out

    def _sample(self) -> None:
        for pid, seconds in self._mine(proc_tree.own_times()).items():
            if pid not in self.before:
                self.seen[pid] = max(seconds, self.seen.get(pid, 0.0))

    def _run(self) -> None:
        while not self.stop.wait(self.every):
            self._sample()

    def __enter__(self) -> TreeMeter:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(10)

    def total(self) -> float:
        return sum(self.seen.values())


def reap_orphans(seconds: float = 30.0) -> None:
    """Wait for what the job left (adopted by this subreaper), so none outlives the run; bounded."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.1)  # orphans still ending; nothing to wait on but the clock


def run_job(argv: list[str], rows: int) -> dict[str, Any]:
    """One job in a fresh process: its runs' figures and the whole process tree's CPU."""
    with TreeMeter() as meter:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
        reap_orphans()
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:3])} failed:\n{done.stderr[-3000:]}")
    runs = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"rows"')]
    last = runs[-1]
    return {
        "rows_per_s": last["rows_per_s"],
        "run_us": sum(last["cpu_s"].values()) / rows * 1e6,
        "run_parts_us": {part: s / rows * 1e6 for part, s in last["cpu_s"].items()},
        "whole_us": meter.total() / (rows * len(runs)) * 1e6,
    }


PEER_LABELS = {"ray": "Ray Data, async actors", "daft": "Daft, async UDF"}


def jobs(url: str, rows: int, in_flight: int, peers: list[str], runs: int) -> dict[str, list[str]]:
    common = [url, str(rows), str(in_flight), "--runs", str(runs)]
    spark = [sys.executable, str(PEERS / "spark_job.py")]
    short = ["--java-options", SHORT_JOB_JAVA_OPTIONS]
    out = {
        "key_ordered_wait": [*spark, *common[:3], "ours", *common[3:]],
        "key_ordered_wait, short-job JVM": [*spark, *common[:3], "ours", *common[3:], *short],
        "hand-written mapInArrow + aiohttp": [*spark, *common[:3], "hand", *common[3:]],
        "hand-written, short-job JVM": [*spark, *common[:3], "hand", *common[3:], *short],
    }
    for peer in peers:
        out[PEER_LABELS[peer]] = [peer_python(peer), str(PEERS / f"{peer}_job.py"), *common]
    return out


def last_line(exc: BaseException) -> str:
    """The last line of a failed job's error output (its exception), shortened for a cell."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:120]


LABELS = {
    "key_ordered_wait": "`key_ordered_wait`",
    "hand-written mapInArrow + aiohttp": "hand-written `mapInArrow` + aiohttp",
    "Ray Data, async actors": "Ray Data, async actors",
    "Daft, async UDF": "Daft, async UDF",
}
SHORT_JOB = {  # a Spark job with a short job's JVM: a column of its base job's row
    "key_ordered_wait, short-job JVM": "key_ordered_wait",
    "hand-written, short-job JVM": "hand-written mapInArrow + aiohttp",
}


def scenario(figures: dict[str, Any], argv: list[str]) -> dict[str, Any]:
    """The run as a section of the benchmarks page (``report.py``), the raw figures kept beside."""
    by_job: dict[str, list[list[str]]] = {}
    for name, got in figures["jobs"].items():
        label, in_flight = name.rsplit(", ", 1)
        limit = figures["wrk"].get(in_flight)
        if "failed" in got:
            cells = by_job.setdefault(LABELS.get(label, label), [[], [], [], []])
            for cell in (cells[0], cells[1], cells[3]):
                cell.append("failed")
            continue
        rate = f"{got['rows_per_s']:,.0f}" + (f" ({got['rows_per_s'] / limit:.2f})" if limit else "")
        if label in SHORT_JOB:
            cells = by_job.setdefault(LABELS[SHORT_JOB[label]], [[], [], [], []])
            cells[2].append(f"{got['whole_us']:.0f} at {rate}")
            continue
        parts = got["run_parts_us"]
        warm = "-"  # Ray's actors of one run end in the next: a run's own CPU is not measurable
        if "workers" in parts:  # Spark's processes live through every run
            split = " + ".join(f"{parts.get(p, 0.0):.0f}" for p in ("workers", "jvm", "driver"))
            warm = f"{got['run_us']:.0f} = {split}"
        elif set(parts) == {"driver"}:  # Daft's local runner: one process
            warm = f"{got['run_us']:.0f}"
        cells = by_job.setdefault(LABELS.get(label, label), [[], [], [], []])
        for cell, value in zip(
            (cells[0], cells[1], cells[3]), (rate, f"{got['whole_us']:.0f}", warm), strict=True
        ):
            cell.append(value)
    rows = [[label, *(" / ".join(values) or "-" for values in cells)] for label, cells in by_job.items()]
    counts = " / ".join(figures["wrk"]) or "-"
    limits = " / ".join(f"{limit:,.0f}" for limit in figures["wrk"].values()) or "-"
    return {
        "scenario": "cost",
        "title": "CPU per row",
        "setup": (
            f"{figures['rows']:,} rows over 2,000 keys, a GET per row answered in 20 ms by nginx (as above), "
            "the same number of requests in flight in every job; each job in a fresh process that runs it "
            f"{figures['runs']} times, every row checked against its key; Ray Data and Daft in virtual "
            "environments of their own (neither is a dependency); Spark's JVM with its defaults, and "
            f"as a short job starts it (`spark.driver.extraJavaOptions={SHORT_JOB_JAVA_OPTIONS}`: the "
            "client compiler alone, the serial collector). CPU per row of the whole process tree, "
            "read from /proc: over the whole process (start-up of the JVM, of Ray's services and of the "
            "workers included, shared by its runs: what a bill follows), and over the last run alone "
            "(the workers already up; Spark's by process: Python workers + JVM + driver; Daft runs in one "
            "process; Ray's actors of one run end in the next, so its runs have no figure of their own)."
        ),
        "command": " ".join(["./run bench cost", *argv]).strip(),
        "columns": [
            "job",
            f"rows/s at {counts} in flight (of `wrk`'s {limits} requests/s)",
            "CPU per row, whole process, us",
            "the same with a short-job JVM, us (at rows/s)",
            "CPU per row, last run, us: workers + JVM + driver",
        ],
        "rows": rows,
        "notes": figures.get("notes", ""),
        "measured": {"date": figures["date"], "pyspark": figures.get("pyspark"), "machine": MACHINE},
        "figures": figures,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--in-flight", default="400,800")
    parser.add_argument("--peers", default="ray,daft", help="comma-separated, or '' for none")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument(
        "--json", type=Path, help="write the run as a page section (benchmarks/results/cost.json)"
    )
    args = parser.parse_args()
    peers = [p for p in args.peers.split(",") if p]
    proc_tree.adopt_orphans()
    figures: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "rows": args.rows,
        "runs": args.runs,
        "pyspark": spark_version(),
        "wrk": {},
        "jobs": {},
    }
    if args.json and args.json.exists():  # the notes are written by hand; a new run keeps them
        figures["notes"] = json.loads(args.json.read_text()).get("notes", "")
    with nginx_echo(0.02) as url:
        for in_flight in (int(n) for n in args.in_flight.split(",")):
            limit = physical_limit(url, in_flight)
            if limit:
                figures["wrk"][str(in_flight)] = limit
            print(f"{in_flight} in flight; wrk {limit or 0:,.0f} requests/s", flush=True)
            for label, argv in jobs(url, args.rows, in_flight, peers, args.runs).items():
                try:
                    got = run_job(argv, args.rows)
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    if label not in PEER_LABELS.values():
                        raise  # a Spark job of ours or the hand-written one: a bug to look at
                    # a peer that fails (a time-out under load) is shown as failed; the sitting goes on
                    failed = last_line(exc)
                    figures["jobs"][f"{label}, {in_flight}"] = {"failed": failed}
                    print(f"  {label:<36} failed: {failed}", flush=True)
                    continue
                figures["jobs"][f"{label}, {in_flight}"] = got
                of_wrk = f"{got['rows_per_s'] / limit:.2f} of wrk" if limit else ""
                print(
                    f"  {label:<36} {got['rows_per_s']:>8,.0f} rows/s {of_wrk}  CPU a row: whole "
                    f"process {got['whole_us']:.0f} us, the last run {got['run_us']:.0f} us",
                    flush=True,
                )
    if args.json:
        args.json.write_text(json.dumps(scenario(figures, sys.argv[1:]), indent=1) + "\n")


def spark_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pyspark")
    except PackageNotFoundError:  # a run without Spark's jobs says so by None
        return None


if __name__ == "__main__":
    main()

"""Daft's async UDF on the workload of ``benchmarks/cost.py``, in Daft's own environment.

    python benchmarks/peers/daft_job.py URL ROWS IN_FLIGHT [--runs K]

Daft's local runner; ROWS rows over 2,000 keys; an async ``@daft.func`` with
``max_concurrency=IN_FLIGHT`` making one GET per row through one aiohttp session per event loop;
the rows are read back as Arrow and checked (the count, and each name against its key). Prints a
JSON line per run: rows/s and the CPU seconds of the whole process tree over the run, from /proc.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import daft
import pyarrow as pa
import pyarrow.compute as pc
from daft import col

sys.path.insert(0, os.path.dirname(__file__))
import proc_tree
from aio_sessions import drop_all, session

KEYS = 2_000


def fetcher(url: str, in_flight: int) -> Any:
    @daft.func(max_concurrency=in_flight)
    async def name_of(user_id: int) -> str:
        async with session(in_flight).get(f"{url}/users/{user_id}") as resp:
            return json.loads(await resp.read())["name"]

    return name_of


def part(pid: int, cmdline: str) -> str:
    return "driver" if pid == os.getpid() else "daft workers"


def checked_run(url: str, rows: int, in_flight: int) -> dict[str, Any]:
    before = proc_tree.by_part(proc_tree.tree(), part)
    started = time.perf_counter()
    df = daft.range(rows).with_column("user_id", col("id") % KEYS)
    table = df.with_column("name", fetcher(url, in_flight)(col("user_id"))).to_arrow()
    wall = time.perf_counter() - started
    cpu = proc_tree.spent(before, proc_tree.by_part(proc_tree.tree(), part))
    expected = pc.binary_join_element_wise("user-", pc.cast(table["user_id"], pa.string()), "")
    right = pc.sum(pc.equal(table["name"], expected)).as_py() or 0
    if table.num_rows != rows or right != rows:
        raise SystemExit(f"daft: {right} of {rows} rows came back right ({table.num_rows} came back)")
    return {"rows": rows, "rows_per_s": rows / wall, "cpu_s": cpu}


def main() -> None:
    url, rows, in_flight = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    runs = int(sys.argv[sys.argv.index("--runs") + 1]) if "--runs" in sys.argv else 1
    proc_tree.adopt_orphans()
    for _ in range(runs):
        print(json.dumps(checked_run(url, rows, in_flight)), flush=True)
    drop_all()


if __name__ == "__main__":
    main()

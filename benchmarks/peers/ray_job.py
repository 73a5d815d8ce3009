"""Ray Data's async actors on the workload of ``benchmarks/cost.py``, in Ray's own environment.

    python benchmarks/peers/ray_job.py URL ROWS IN_FLIGHT [--runs K]

``ray.init(num_cpus=2)``; ROWS rows over 2,000 keys; ``map_batches`` with an async callable
class on 2 actors of half a CPU each (1,000 rows a batch), each keeping IN_FLIGHT / 2 GETs in
flight through one aiohttp session behind a semaphore; the rows are read back in the driver and
checked (the count, and each name against its key). Prints a JSON line per run: rows/s and the
CPU seconds of the whole process tree over the run (Ray's driver, its raylet, GCS and workers),
read from /proc.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import ray

sys.path.insert(0, os.path.dirname(__file__))
import proc_tree

KEYS = 2_000
ACTORS = 2


class Enrich:
    def __init__(self, url: str, per_actor: int) -> None:
        self.url, self.per_actor = url, per_actor
        self.session: Any = None
        self.gate: asyncio.Semaphore | None = None

    async def _one(self, user_id: int) -> str:
        assert self.gate is not None
        async with self.gate, self.session.get(f"{self.url}/users/{user_id}") as resp:
            return json.loads(await resp.read())["name"]

    async def __call__(self, batch: pa.Table) -> Any:
        import aiohttp

        if self.session is None:  # made in the actor's own loop
            self.gate = asyncio.Semaphore(self.per_actor)
            connector = aiohttp.TCPConnector(limit=self.per_actor)
            self.session = aiohttp.ClientSession(connector=connector)
        user_ids = pc.remainder(batch["id"], KEYS)
        names = await asyncio.gather(*(self._one(u) for u in user_ids.to_pylist()))
        yield batch.append_column("user_id", user_ids).append_column("name", pa.array(names))


def part(pid: int, cmdline: str) -> str:
    if pid == os.getpid():
        return "driver"
    return "ray workers" if cmdline.startswith("ray::") else "ray services"


def checked_run(url: str, rows: int, in_flight: int) -> dict[str, Any]:
    before = proc_tree.by_part(proc_tree.tree(), part)
    started = time.perf_counter()
    ds = ray.data.range(rows).map_batches(
        Enrich,
        fn_constructor_args=(url, in_flight // ACTORS),
        concurrency=ACTORS,
        num_cpus=0.5,  # two actors beside the read tasks on two cores (1 each would starve them)
        batch_size=1_000,
        batch_format="pyarrow",
    )
    count = right = 0
    for batch in ds.iter_batches(batch_format="pyarrow", batch_size=None):
        expected = pc.binary_join_element_wise("user-", pc.cast(batch["user_id"], pa.string()), "")
        count += batch.num_rows
        right += pc.sum(pc.equal(batch["name"], expected)).as_py() or 0
    wall = time.perf_counter() - started
    cpu = proc_tree.spent(before, proc_tree.by_part(proc_tree.tree(), part))
    if count != rows or right != rows:
        raise SystemExit(f"ray: {right} of {rows} rows came back right ({count} came back)")
    return {"rows": rows, "rows_per_s": rows / wall, "cpu_s": cpu}


def main() -> None:
    url, rows, in_flight = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    runs = int(sys.argv[sys.argv.index("--runs") + 1]) if "--runs" in sys.argv else 1
    proc_tree.adopt_orphans()
    ray.init(num_cpus=ACTORS, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    for _ in range(runs):
        print(json.dumps(checked_run(url, rows, in_flight)), flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()

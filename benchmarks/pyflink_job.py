"""PyFlink's AsyncDataStream on the same workload, for spark_throughput.py --pyflink.

Runs inside an environment of its own (apache-flink pins pyarrow < 21 and pandas < 2.3):

    python benchmarks/pyflink_job.py URL ROWS {unordered|ordered} TIMEOUT_SECONDS OUTPUT_DIR

Prints one JSON line: rows, seconds, rows_per_s. Separate Python workers
(_python_worker_execution_mode=process), parallelism 2, capacity 100, a file sink; the
aiohttp session is made on first use, because open() runs before the operator's loop exists.
"""

from __future__ import annotations

import inspect
import json
import sys
import time

from pyflink.common import Configuration, Encoder, Time, Types, WatermarkStrategy
from pyflink.datastream import AsyncDataStream, StreamExecutionEnvironment
from pyflink.datastream.connectors.file_system import FileSink
from pyflink.datastream.connectors.number_seq import NumberSequenceSource
from pyflink.datastream.functions import AsyncFunction

KEYS = 2_000


class _Lookup(AsyncFunction):
    def __init__(self, url: str) -> None:
        self.url = url
        self.session = None

    async def _get(self, value: int) -> str:
        import aiohttp

        if self.session is None:
            self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=100))
        async with self.session.get(f"{self.url}/users/{value % KEYS}") as resp:
            data = json.loads(await resp.read())
        return f"{value},{data['name']}"


class ReturningLookup(_Lookup):
    async def async_invoke(self, value):  # type: ignore[no-untyped-def]
        return [await self._get(value)]


class CompletingLookup(_Lookup):
    async def async_invoke(self, value, result_future):  # type: ignore[no-untyped-def]
        result_future.complete([await self._get(value)])


def main() -> None:
    url, rows, mode, timeout, out = (
        sys.argv[1],
        int(sys.argv[2]),
        sys.argv[3],
        float(sys.argv[4]),
        sys.argv[5],
    )
    config = Configuration()
    config.set_string("python.execution-mode", "process")
    config.set_string("_python_worker_execution_mode", "process")
    config.set_string("python.executable", sys.executable)  # the workers need this environment
    config.set_string("python.client.executable", sys.executable)
    env = StreamExecutionEnvironment.get_execution_environment(config)
    env.set_parallelism(2)
    source = env.from_source(NumberSequenceSource(0, rows - 1), WatermarkStrategy.no_watermarks(), "sequence")
    completes = "result_future" in inspect.signature(AsyncFunction.async_invoke).parameters
    fn = CompletingLookup(url) if completes else ReturningLookup(url)
    wait = getattr(AsyncDataStream, f"{mode}_wait")
    enriched = wait(source.map(lambda v: v, Types.LONG()), fn, Time.seconds(timeout), 100, Types.STRING())
    enriched.sink_to(FileSink.for_row_format(out, Encoder.simple_string_encoder()).build())
    start = time.perf_counter()
    env.execute("pyflink async lookup")
    seconds = time.perf_counter() - start
    print(json.dumps({"rows": rows, "seconds": seconds, "rows_per_s": rows / seconds}))


if __name__ == "__main__":
    main()

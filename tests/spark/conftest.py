"""One local[2] Spark session for all Spark tests (starting one takes seconds), and a local Spark
Connect server for the tests that run a Connect client (in processes of their own: a classic
and a Connect session cannot share one Python process)."""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from ..processes import group

os.environ["PYSPARK_PYTHON"] = sys.executable  # workers need this environment's pyarrow
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


def _builder(master: str):  # type: ignore[no-untyped-def]
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master(master)
        .appName("keyed-async-wait-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.python.worker.faulthandler.enabled", "true")
    )


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    session = _builder("local[2]").getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


class ConnectServer(NamedTuple):
    url: str  # sc://127.0.0.1:PORT
    log: Path  # what the server and its Python processes wrote to stderr

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    """A local Spark Connect server, stopped after the session; its stderr goes to a file a
    failing test shows the end of."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = Path(__file__).with_name("connect_server.py")
    log = tmp_path_factory.mktemp("connect-server") / "stderr.log"
    with (
        log.open("w") as stderr,
        group(
            [sys.executable, str(server), str(port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        ) as proc,
    ):
        assert proc.stdout is not None
        deadline = time.monotonic() + 180
        line = ""
        while not line and time.monotonic() < deadline and proc.poll() is None:
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if ready:
                line = proc.stdout.readline().strip()
        assert line == "ready", (
            f"the Connect server did not start (exit {proc.poll()}): {log.read_text()[-4000:]}"
        )
        yield ConnectServer(f"sc://127.0.0.1:{port}", log)

"""Every feature through a Spark Connect client (each in a process of its own, against one local
Connect server): the waits with observed metrics, key_ordered_stream and the counts of its
micro-batches, the SQL extension, the main job."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from keyed_async_wait.spark.compat import pyspark_version

from ..processes import TimedOut, run_bounded

if TYPE_CHECKING:
    from .conftest import ConnectServer

pytestmark = [
    pytest.mark.spark,
    pytest.mark.compat("Spark Connect"),
    pytest.mark.skipif(  # 3.5's server is a Maven package, out of this machine's reach
        pyspark_version() < (4, 0), reason="pyspark 3.5's wheel carries no Spark Connect server"
    ),
]

ROOT = Path(__file__).parents[2]


def _bounded_client(
    server: ConnectServer, args: list[str], **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    """The client's run, bounded; when it fails or hangs, the server's log says its side."""
    try:
        done = run_bounded(args, timeout=300, cwd=ROOT, **kwargs)
    except TimedOut as exc:
        raise AssertionError(f"{exc}\n--- the Connect server's log:\n{server.log_tail()}") from None
    assert done.returncode == 0, (
        f"{done.stdout[-2000:]}{done.stderr[-4000:]}\n--- the Connect server's log:\n{server.log_tail()}"
    )
    return done


def _client(feature: str, server: ConnectServer, url: str, *extra: str) -> None:
    script = Path(__file__).with_name("connect_client.py")
    done = _bounded_client(
        server,
        [sys.executable, str(script), feature, server.url, url, *extra],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert f"{feature}: ok" in done.stdout


def test_the_three_waits_and_their_metrics_on_spark_connect(
    connect_server: ConnectServer, service: Any
) -> None:
    url, _ = service
    _client("waits", connect_server, url)


def test_key_ordered_stream_on_spark_connect(
    connect_server: ConnectServer, service: Any, tmp_path: Path
) -> None:
    """foreachBatch runs in the server's Python process: parked state, reports and failures
    still reach the client (the first 20 calls answer 503, so some keys are deferred)."""
    url, state = service
    state.fail(503, count=20)
    _client("stream", connect_server, url, str(tmp_path))
    assert state.fail_count == 0, "the outage was seen"


def test_a_micro_batchs_counts_are_observed_and_trusted_only_when_every_partition_reported(
    connect_server: ConnectServer, service: Any
) -> None:
    url, _ = service
    _client("counts", connect_server, url)


def test_the_sql_extension_on_spark_connect(connect_server: ConnectServer, service: Any) -> None:
    url, _ = service
    _client("sql", connect_server, url)


def test_the_main_job_on_spark_connect(connect_server: ConnectServer, tmp_path: Path) -> None:
    import json

    done = _bounded_client(
        connect_server,
        [
            sys.executable,
            "-m",
            "keyed_async_wait.app.enrich",
            "--remote",
            connect_server.url,
            "--rows",
            "1000",
            "--orders",
            "200",
            "--workdir",
            str(tmp_path),
        ],
    )
    summary = json.loads(done.stdout)
    assert summary["rows"] == 1000 and summary["enriched"] == 1000
    assert summary["orders_out_of_order"] == 0
    # counted through the query's observed metrics: each row's customer asked of the service
    # or found in the shared cache (L2)
    assert summary["lookups"] + summary["shared_cache_hits"] >= 1000
    assert "rows 1,000/1,000" in done.stderr  # the progress, plain lines off a terminal

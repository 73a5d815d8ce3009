"""One local[2] Spark session for all Spark tests (starting one takes seconds)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

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

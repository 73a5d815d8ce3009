"""The session ``kaw-enrich`` starts: a classic one on a master, or a Spark Connect client."""

from __future__ import annotations

from typing import Any

__all__ = ["new_session"]


def new_session(master: str, remote: str | None, partitions: int) -> Any:
    """A Spark Connect client of ``remote`` when given, else a classic session on ``master``;
    ``partitions`` shuffle partitions either way."""
    from pyspark.sql import SparkSession

    if remote:
        spark = SparkSession.builder.remote(remote).getOrCreate()
        spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
        return spark
    spark = (
        SparkSession.builder.master(master)
        .appName("kaw-enrich")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark

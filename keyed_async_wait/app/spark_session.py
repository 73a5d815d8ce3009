"""The session ``kaw-enrich`` starts: a classic one on a master, or a Spark Connect client."""

from __future__ import annotations

from typing import Any

__all__ = ["SHORT_JOB_JAVA_OPTIONS", "new_session"]

# A local job of minutes spends more of its JVM's CPU compiling Spark's code than running it:
# the client compiler alone (no C2) and the serial collector take a session's JVM from 16 s of
# CPU to 8 s over a 200,000-row job here, the rows no slower (./run bench cost). A long job on
# executors of its own keeps the JVM's defaults, whose compiled code pays back over hours.
SHORT_JOB_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def new_session(
    master: str, remote: str | None, partitions: int, java_options: str = SHORT_JOB_JAVA_OPTIONS
) -> Any:
    """A Spark Connect client of ``remote`` when given, else a classic session on ``master``;
    ``partitions`` shuffle partitions either way. ``java_options``: the JVM's options of a
    local master's session (the JVM is this process's child; '' keeps the JVM's defaults)."""
    from pyspark.sql import SparkSession

    if remote:
        spark = SparkSession.builder.remote(remote).getOrCreate()
        spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
        return spark
    builder = SparkSession.builder
    if java_options and master.startswith("local"):
        builder = builder.config("spark.driver.extraJavaOptions", java_options)
    spark = (
        builder.master(master)
        .appName("kaw-enrich")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark

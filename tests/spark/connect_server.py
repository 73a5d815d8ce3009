"""A local Spark Connect server for the tests: ``python connect_server.py PORT``.

A classic local[2] session with the Connect plugin, bound to loopback; prints ``ready`` once it
serves, and stops when its stdin closes (the test's fixture holds it open)."""

from __future__ import annotations

import sys

from pyspark.sql import SparkSession


def main(port: str) -> None:
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("keyed-async-wait-connect-tests")
        .config("spark.plugins", "org.apache.spark.sql.connect.SparkConnectPlugin")
        .config("spark.connect.grpc.binding.address", "127.0.0.1")
        .config("spark.connect.grpc.binding.port", port)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    print("ready", flush=True)
    sys.stdin.read()  # until the fixture closes it
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])

"""A micro-batch's py4j error reaches Spark short, with what Spark reads a stop from."""

from __future__ import annotations

import re
from typing import Any

import pytest
from py4j.protocol import Py4JJavaError

from keyed_async_wait.spark.batch_errors import reads_as_a_stop, short_for_spark

# Spark's own test of whether a foreachBatch error came from stopping the query
# (StreamExecution.isInterruptionException, pyspark 3.5-4.3)
SPARKS_STOP_CHECK = re.compile(
    r"py4j.protocol.Py4JJavaError: An error occurred while calling((.|\r\n|\r|\n)*)"
    r"(java.lang.InterruptedException|java.io.InterruptedIOException|"
    r"java.nio.channels.ClosedByInterruptException)"
)


def _py4j_error(spark: Any, cause: Any) -> Py4JJavaError:
    """A real py4j error: a JVM call that throws an exception with ``cause`` and a long
    multi-line message, as a failed Spark job's has."""
    jvm = spark.sparkContext._jvm
    message = "Job aborted.\n" + "\n".join(
        f"\tat org.example.Frame{i}.run(Frame.java:{i})" for i in range(2000)
    )
    failed = jvm.java.util.concurrent.CompletableFuture.failedFuture(
        jvm.java.lang.RuntimeException(message, cause)
    )
    with pytest.raises(Py4JJavaError) as caught:
        failed.get()
    return caught.value


def test_an_interrupted_call_is_short_and_reads_as_a_stop(spark: Any) -> None:
    jvm = spark.sparkContext._jvm
    error = _py4j_error(spark, jvm.java.lang.InterruptedException("the query was stopped"))
    assert len(str(error)) > 50_000  # what overflowed Spark's check
    short = short_for_spark(error)
    assert isinstance(short, RuntimeError) and len(str(short)) < 2_000
    assert SPARKS_STOP_CHECK.search(str(short)) and reads_as_a_stop(short)
    assert "RuntimeException: Job aborted." in str(short) and "Frame1999" in str(short)  # first, last line


def test_a_failure_stays_a_failure_and_python_errors_pass_unchanged(spark: Any) -> None:
    jvm = spark.sparkContext._jvm
    short = short_for_spark(_py4j_error(spark, jvm.java.lang.IllegalStateException("state damaged")))
    assert short is not None and not SPARKS_STOP_CHECK.search(str(short)) and not reads_as_a_stop(short)
    assert "java.lang.IllegalStateException: state damaged" in str(short)
    assert short_for_spark(ValueError("a Python error")) is None

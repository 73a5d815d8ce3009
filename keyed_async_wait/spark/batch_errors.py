"""What a ``foreachBatch`` function hands Spark when one of its py4j calls failed.

Spark tells a stopped query from a failed one by matching a regular expression over the text of
the function's error (``StreamExecution.isInterruptionException``: the py4j error's first line,
then ``((.|\\r\\n|\\r|\\n)*)``, then one of the interruption classes). Java's matcher recurses
once per character of that pattern, so the text of a py4j error, which carries the Java stack
traces of every cause, overflows the stream thread's stack: the thread dies in a
``StackOverflowError`` instead of stopping (seen when a query was stopped while a micro-batch's
Spark job ran). :func:`short_for_spark` gives the same error as one short line per cause, which
the expression reads in a few frames and still finds an interruption in; the full error is
logged and kept by the caller.
"""

from __future__ import annotations

from typing import Any

__all__ = ["INTERRUPTIONS", "MAX_CAUSES", "MAX_LINE", "reads_as_a_stop", "short_for_spark"]

MAX_CAUSES = 12  # causes named, outermost first
MAX_LINE = 400  # characters kept of a cause's first and of its last line
# the causes Spark takes for a stop of the query (its thread interrupted), not a failure
INTERRUPTIONS = (
    "java.lang.InterruptedException",
    "java.io.InterruptedIOException",
    "java.nio.channels.ClosedByInterruptException",
)


def short_for_spark(exc: BaseException) -> RuntimeError | None:
    """``exc`` as one short line per Java cause (class and message, the first and the last
    line of a long one: a Python worker's error is its last), or None when it is not a py4j
    error (Python's own errors are short enough, and their text is the user's)."""
    try:
        from py4j.protocol import Py4JJavaError
    except ImportError:  # pragma: no cover - pyspark brings py4j
        return None
    if not isinstance(exc, Py4JJavaError):
        return None
    causes: list[str] = []
    java: Any = exc.java_exception
    while java is not None and len(causes) < MAX_CAUSES:
        causes.append(_brief(str(java.toString())))
        java = java.getCause()
    call = str(exc.errmsg).strip().rstrip(".")
    return RuntimeError(f"py4j.protocol.Py4JJavaError: {call}: " + " | caused by: ".join(causes))


def reads_as_a_stop(short: BaseException) -> bool:
    """Whether Spark will take ``short`` (from :func:`short_for_spark`) for a stop."""
    return any(name in str(short) for name in INTERRUPTIONS)


def _brief(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    first, last = lines[0][:MAX_LINE], lines[-1][:MAX_LINE]
    return first if len(lines) == 1 else f"{first} ... {last}"

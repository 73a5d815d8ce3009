"""A part of the parked state (one folder written by one micro-batch: a segment or a removal
set) and what it holds: counted by the write itself, or read back from its files.

On a classic session :func:`write_part` counts a part as it writes it (an ``Observation`` on
the write: its rows, its fresh rows and its tries) and lists its files' sizes: no Spark job of
its own. :func:`read_parts` reads parts back (one Spark job over all of them): on Spark Connect
after a write, and at the first micro-batch of every run, to verify the version it starts from.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from .metrics import is_connect
from .plan_values import equal_to
from .small_files import file_sizes

__all__ = ["Part", "read_parts", "write_part"]


@dataclass(frozen=True)
class Part:
    """One directory written by one micro-batch: a segment or a removal set."""

    batch: int
    rows: int
    files: tuple[tuple[str, int], ...]  # (file name, its bytes; its rows, unless sized)
    fresh: int = 0  # rows the micro-batch itself parked (the rest: compacted from older segments)
    latest_try: float | None = None  # the latest next_try of its rows (None: every row is due)
    earliest_try: float | None = None  # the earliest (None: a row is due at once)
    sized: bool = False  # files hold sizes (counted as written); older manifests: rows (read back)


def write_part(spark: SparkSession, kind: str, df: DataFrame, path: str, batch_id: int) -> Part | None:
    """Write ``df`` as micro-batch ``batch_id``'s part of ``kind`` (``"seg"``, ``"rm"``) to
    ``path``; the part as the write counted it, or None where it cannot count (Spark Connect:
    read it back with :func:`read_parts`)."""
    if is_connect(spark):
        df.write.mode("overwrite").parquet(path)
        return None
    observation = Observation(f"kaw_{kind}_{uuid.uuid4().hex}")
    df.observe(observation, *_metrics(kind, batch_id)).write.mode("overwrite").parquet(path)
    counted = observation.get
    earliest = counted["earliest"]
    return Part(
        batch_id,
        int(counted["rows"]),
        file_sizes(spark, path),
        fresh=int(counted["fresh"]),
        latest_try=counted["latest"],
        earliest_try=None if counted["now"] or earliest is None else earliest,
        sized=True,
    )


def _metrics(kind: str, batch_id: int) -> list[Any]:
    """What :func:`write_part` counts, as :func:`read_parts` reads it back."""
    if kind != "seg":
        none = F.lit(None).cast("double")
        zero = F.lit(0)
        return [
            F.count(F.lit(1)).alias("rows"),
            zero.alias("fresh"),
            none.alias("latest"),
            none.alias("earliest"),
            zero.alias("now"),
        ]
    state = F.col("_kaw_parked")
    return [
        F.count(F.lit(1)).alias("rows"),
        F.count(F.when(equal_to(state.seg, batch_id), 1)).alias("fresh"),
        F.max(state.next_try).alias("latest"),
        F.min(state.next_try).alias("earliest"),
        F.count(F.when(state.next_try.isNull(), 1)).alias("now"),
    ]


def read_parts(
    spark: SparkSession, paths: Mapping[tuple[str, int], str], batch_id: int
) -> dict[tuple[str, int], Part]:
    """Per part (``(kind, batch)``: its folder): its files and their rows, and for a segment
    the rows of ``batch_id`` and the latest next_try; one Spark job over every part, from the
    parquet files themselves."""
    frames = []
    for (kind, batch), path in paths.items():
        df = spark.read.parquet(path)
        if kind == "seg":
            fresh = F.when(F.col("_kaw_parked.seg") == batch_id, 1)
            latest = F.col("_kaw_parked.next_try")
            now = F.when(latest.isNull(), 1)
        else:
            fresh, latest, now = F.lit(None), F.lit(None).cast("double"), F.lit(None)
        frames.append(
            df.select(
                F.lit(kind).alias("kind"),
                F.lit(batch).cast("long").alias("batch"),
                F.input_file_name().alias("file"),
                fresh.alias("fresh"),
                latest.alias("latest"),
                now.alias("now"),
            )
        )
    union = frames[0]
    for frame in frames[1:]:
        union = union.unionByName(frame)
    rows = (
        union.groupBy("kind", "batch", "file")
        .agg(
            F.count(F.lit(1)).alias("rows"),
            F.count("fresh").alias("fresh"),
            F.max("latest").alias("latest"),
            F.min("latest").alias("earliest"),
            F.count("now").alias("now"),
        )
        .collect()
    )
    out: dict[tuple[str, int], Part] = {}
    for kind, batch in paths:
        mine = [r for r in rows if r.kind == kind and r.batch == batch]
        files = tuple(sorted((r.file.rsplit("/", 1)[-1], int(r.rows)) for r in mine))
        tries = [r.latest for r in mine if r.latest is not None]
        firsts = [r.earliest for r in mine if r.earliest is not None]
        due_now = any(int(r.now) for r in mine) or not firsts
        out[(kind, batch)] = Part(
            batch,
            sum(int(r.rows) for r in mine),
            files,
            fresh=sum(int(r.fresh) for r in mine),
            latest_try=max(tries) if tries else None,
            earliest_try=None if due_now else min(firsts),
        )
    return out

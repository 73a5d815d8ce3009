"""Keys spread over a key-ordered wait's partitions by their rows, not by their hash.

A key-ordered job lasts as long as its fullest partition, and Spark's hash spreads keys
unevenly: 2,000 keys over two partitions put 52.5% of the rows in one, and the fewer keys a
partition gets the wider the spread (31 keys a partition over 64: the fullest about 1.4x the
mean). :func:`balanced` counts every key's rows and the partition Spark's hash gives it (one
more pass over the input), decides where each key goes
(:func:`keyed_async_wait.core.placement.assignment`: mostly the hash's place, a few keys moved
from the fullest partitions to the emptiest), and repartitions by the partitions' labels, the
keys moved looked up in a map the plan carries (no join, no broadcast) or, for many keys or
keys of several columns, in a broadcast join.

Invariant: every row of a key goes to one partition, whatever the input holds by the time the
wait runs it. A key is placed by its assignment, or, when the count did not see it (a source
that changed in between) or its key is NULL, by Spark's hash of the key, as without balancing;
both are functions of the key alone. With more than :data:`MAX_KEYS` distinct keys nothing is
collected and the keys are hashed as without balancing (logged): that many keys spread evenly
by hash, unless a few are hot.

:class:`Placement` is what a key-ordered wait does to its input before its tasks: by the key
(hash or rows), then sorted within each partition; checked when made, applied after every other
option of the call is checked, since balancing runs a job.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, StructField, StructType

from ..core.checks import check_bool
from ..core.exceptions import ConfigError
from ..core.placement import assignment, lpt
from .key_hash import map_key, placement_columns
from .key_spread import check_partitioned_by_key
from .session import key_partitions

__all__ = ["MAX_KEYS", "Placement", "assign", "balanced", "key_placement", "partition_labels", "placed_by"]

log = logging.getLogger(__name__)

MAX_KEYS = 100_000  # distinct keys the driver collects and assigns; past it: Spark's hash
_LABEL = "_kaw_partition"
# label candidates per partition searched: a partition without one among 64 * n values has
# odds of about e**-64
_CANDIDATES = 64


def assign(rows: Sequence[int], partitions: int) -> list[int]:
    """The partition of each key, given its rows: heaviest first, each to the partition with
    the fewest rows so far (ties: the lowest partition)."""
    return lpt(rows, partitions)


_LABELS: dict[int, list[int]] = {}  # partitions -> labels: Spark's hash and its seed are fixed


def partition_labels(df: DataFrame, partitions: int) -> list[int]:
    """For each partition ``p``, a long whose Spark hash sends a ``repartition`` into ``p``
    (Spark's hash partitioning is ``pmod(hash(value), n)``, the hash of ``F.hash``); asked of
    Spark once per partition count in this process."""
    if partitions not in _LABELS:
        _LABELS[partitions] = _labels(df, partitions)
    return _LABELS[partitions]


def _labels(df: DataFrame, partitions: int) -> list[int]:
    candidates = df.sparkSession.range(0, _CANDIDATES * partitions)
    found = (
        candidates.select(F.pmod(F.hash("id"), F.lit(partitions)).alias("p"), "id")
        .groupBy("p")
        .agg(F.min("id").alias("id"))
        .collect()
    )
    labels = {int(row.p): int(row.id) for row in found}
    missing = [p for p in range(partitions) if p not in labels]
    if missing:  # pragma: no cover - e**-64
        raise RuntimeError(f"no label hashes into partitions {missing} of {partitions}")
    return [labels[p] for p in range(partitions)]


def balanced(df: DataFrame, columns: list[str], partitions: int) -> DataFrame:
    """``df`` in ``partitions`` partitions by ``columns``, each key placed by its rows (see the
    module); its columns as they were."""
    moved = key_placement(df, columns, partitions)
    if moved is None:
        return _hashed(df, columns, partitions)
    return placed_by(df, columns, partitions, moved)


def _hashed(df: DataFrame, columns: list[str], partitions: int) -> DataFrame:
    """``df`` in ``partitions`` partitions by the hash of ``columns`` (Spark's own placement)."""
    return df.repartition(partitions, *placement_columns(df.schema, columns))


Moved = list[tuple[tuple[Any, ...], int]]  # keys (their column values) placed off their hash: where


def key_placement(df: DataFrame, columns: list[str], partitions: int) -> Moved | None:
    """The keys of ``df`` that go to another partition than Spark's hash sends them to, each
    with its partition (:func:`~keyed_async_wait.core.placement.assignment`: mostly few); None
    past :data:`MAX_KEYS` distinct keys (logged)."""
    # counted in as many tasks as the wait's partitions (the shuffle partitions, 200 by
    # default, cost more than the count here), each key with the partition its hash gives
    by = placement_columns(df.schema, columns)
    keyed = df.repartition(partitions, *by)
    hashed = F.pmod(F.hash(*by), F.lit(partitions))
    counted = (
        keyed.groupBy(*columns)
        .agg(F.count(F.lit(1)).alias("_kaw_rows"), F.min(hashed).alias("_kaw_hashed"))
        .limit(MAX_KEYS + 1)
        .collect()
    )
    if len(counted) > MAX_KEYS:
        log.warning(
            "key_ordered_wait(balance_keys=True): over %d distinct keys; spread by their hash instead",
            MAX_KEYS,
        )
        return None
    keys = [tuple(row[c] for c in columns) for row in counted]
    start = [int(row["_kaw_hashed"]) for row in counted]
    # a key with a NULL part matches no equality (the join below): it stays where its hash is
    movable = [all(v is not None for v in key) for key in keys]
    placed = assignment([int(row["_kaw_rows"]) for row in counted], start, partitions, movable)
    return [(key, p) for key, p, h in zip(keys, placed, start, strict=True) if p != h]


def placed_by(df: DataFrame, columns: list[str], partitions: int, moved: Moved) -> DataFrame:
    """``df`` repartitioned so that each key in ``moved`` goes to its partition and every other
    key (one the count did not see, a NULL one) where Spark's hash sends it: by the label of
    the partition, a long whose hash Spark sends there (:func:`partition_labels`). The keys
    moved are looked up in a map written into the plan (one column of integers or strings, up
    to :data:`MAX_LITERAL` keys), else in a broadcast join."""
    by = placement_columns(df.schema, columns)
    if not moved:  # the hash's split is as even as it gets: Spark's own placement, as it plans it
        return df.repartition(partitions, *by)
    # longs, as they were found (a Python int is an INT literal, which hashes otherwise)
    labels = F.array(*[F.lit(label).cast("long") for label in partition_labels(df, partitions)])
    hashed = F.pmod(F.hash(*by), F.lit(partitions))
    literal = _literal_map(df.schema, columns, moved)
    if literal is not None:
        target = F.coalesce(F.element_at(literal, F.col(columns[0])), hashed)
        return df.repartition(partitions, F.element_at(labels, target + 1))
    fields = [*df.select(*columns).schema.fields, StructField(_LABEL, IntegerType(), False)]
    mapping = df.sparkSession.createDataFrame([(*key, p) for key, p in moved], StructType(fields))
    joined = df.join(F.broadcast(mapping), on=columns, how="left").select(*df.columns, _LABEL)
    target = F.coalesce(F.col(_LABEL), hashed)
    return joined.repartition(partitions, F.element_at(labels, target + 1)).drop(_LABEL)


MAX_LITERAL = (
    1_000  # keys moved the plan carries as a map literal (Spark scans a map per lookup); past it: a join
)
_LITERAL_TYPES = {"tinyint", "smallint", "int", "bigint", "string"}


def _literal_map(schema: StructType, columns: list[str], moved: Moved) -> Any:
    """The keys moved as a SQL map literal from key to partition (None: a key of several
    columns or of another type, or too many of them). Strings go in as their UTF-8 bytes in
    hex, so no text of a key is ever parsed as SQL."""
    if len(columns) != 1 or not moved or len(moved) > MAX_LITERAL:
        return None
    kind = schema[columns[0]].dataType
    name = kind.simpleString()
    if name not in _LITERAL_TYPES or getattr(kind, "collation", "UTF8_BINARY") != "UTF8_BINARY":
        return None
    if name == "string":
        keys = [f"CAST(X'{str(key).encode('utf-8').hex()}' AS STRING)" for (key,), _ in moved]
    else:
        keys = [f"CAST({int(key)} AS {name})" for (key,), _ in moved]
    pairs = ", ".join(f"{key}, {p}" for key, (_, p) in zip(keys, moved, strict=True))
    return F.expr(f"map({pairs})")


@dataclass(frozen=True)
class Placement:
    """Where a key-ordered wait's rows go before its tasks: by the key (its hash, or with
    ``balance`` its rows), unless ``assumed`` already (a batch DataFrame's checked here, by a
    job); then sorted by ``sort_by`` within each partition (a batch DataFrame: a stream's tasks
    sort)."""

    columns: list[str]
    num_partitions: int | None
    balance: Any
    assumed: bool
    sort_by: list[str] | None
    whole_record: bool = False  # the key is every column (a NULL in one is part of it)

    def __post_init__(self) -> None:
        check_bool("assume_partitioned", self.assumed)
        check_bool("balance_keys", self.balance)
        if self.balance and self.assumed:
            raise ConfigError("balance_keys", self.balance, "False with assume_partitioned=True")
        if self.assumed and self.num_partitions is not None:
            allowed = "None with assume_partitioned=True (the DataFrame's own partitions run)"
            raise ConfigError("num_partitions", self.num_partitions, allowed)

    def renamed(self, names: dict[str, str]) -> Placement:
        """This placement over the same DataFrame with columns renamed as ``names`` says."""
        sort_by = [names.get(c, c) for c in self.sort_by] if self.sort_by else self.sort_by
        return replace(self, columns=[names.get(c, c) for c in self.columns], sort_by=sort_by)

    def __call__(self, df: DataFrame) -> DataFrame:
        if self.balance and df.isStreaming:
            allowed = "False for a streaming DataFrame (balancing counts the input first)"
            raise ConfigError("balance_keys", self.balance, allowed)
        if self.balance and map_key(df.schema, self.columns) is not None:
            allowed = "False for a key holding a MAP (balancing joins the rows with their keys' places, "
            allowed += "and Spark compares no map); key by to_json of it to balance"
            raise ConfigError("balance_keys", self.balance, allowed)
        if not self.assumed:
            partitions = key_partitions(df.sparkSession, self.num_partitions)
            place = balanced if self.balance else _hashed
            df = place(df, self.columns, partitions)
        elif not df.isStreaming:  # a stream's micro-batches: key_ordered_stream checks its own
            check_partitioned_by_key(df, self.columns, self.whole_record)
        return df.sortWithinPartitions(*self.sort_by) if self.sort_by and not df.isStreaming else df

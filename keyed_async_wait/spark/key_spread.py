"""Whether a micro-batch run in the source's own partitions (``assume_partitioned=True``) had
every key in one of them.

The option is the user's word that each key's rows of a micro-batch sit in one partition. When
it is wrong, two tasks run one key at once and its order is lost, so it is checked after the
micro-batch ran, before anything is committed:

- on a classic session each task adds the stable 64-bit hashes of the keys it ran to an
  accumulator (:class:`KeySpread`), whose merge keeps the hashes more than one task saw; only
  when there are some (a key in two tasks, a task the cache ran again, or a hash collision) is
  the micro-batch's cached output grouped by key to find the keys themselves;
- on Spark Connect (no accumulators) that grouping always runs.

A key found in two partitions fails the micro-batch with a :class:`ConfigError` naming the key,
the partitions and the option: nothing of the micro-batch is committed, so a restart without
the option runs it again, in key order.

``key_ordered_wait(assume_partitioned=True)`` on a batch DataFrame is checked at the call
(:func:`check_partitioned_by_key`): its output cannot be taken back once a sink has it, so the
DataFrame's key columns are grouped by key and partition before it runs.
"""

from __future__ import annotations

from typing import Any

from pyspark import AccumulatorParam
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DataType

from ..core.exceptions import ConfigError
from .key_hash import holds_map, in_key_order, quoted
from .metrics import is_connect

__all__ = ["KeySpread", "check_key_spread", "check_partitioned_by_key", "key_spread"]

Hashes = frozenset[int]
_SHOWN = 3  # keys named in the error


class KeySpread(AccumulatorParam):
    """(hashes seen, hashes seen by more than one task): a task adds (its keys', nothing)."""

    def zero(self, value: tuple[Hashes, Hashes]) -> tuple[Hashes, Hashes]:
        return frozenset(), frozenset()

    def addInPlace(self, a: tuple[Hashes, Hashes], b: tuple[Hashes, Hashes]) -> tuple[Hashes, Hashes]:
        return a[0] | b[0], a[1] | b[1] | (a[0] & b[0])


def key_spread(spark: Any) -> Any:
    """An accumulator for the tasks' key hashes, or None on Spark Connect (it has none)."""
    if is_connect(spark):
        return None
    return spark.sparkContext.accumulator((frozenset(), frozenset()), KeySpread())


def check_key_spread(
    enriched: DataFrame, key_columns: list[str], spread: Any, batch_id: int, whole_record: bool = False
) -> None:
    """Raise a :class:`ConfigError` when a key of micro-batch ``batch_id`` ran in more than one
    partition of ``enriched`` (its cached output, a partition per task). A row with a NULL in a
    named key column has no key (the operator fails or emits it): it is not counted."""
    if spread is not None:
        shared = spread.value[1]
        # PySpark's driver keeps every accumulator it made: drop the hashes, not one set a batch
        spread.value = KeySpread().zero(spread.value)
        if not shared:
            return  # no task ran a key another task ran
    split = _split_keys(enriched, key_columns, whole_record)
    if not split:
        return
    raise ConfigError(
        "assume_partitioned",
        True,
        f"False for this source: micro-batch {batch_id} had rows of one key in more than one "
        f"partition ({_named(split, key_columns)}), so two tasks ran such a key at once and its "
        "order is lost. Nothing of the micro-batch is committed: restart without "
        "assume_partitioned (or with the source partitioned by the key) and it runs again in key order",
    )


def check_partitioned_by_key(df: DataFrame, key_columns: list[str], whole_record: bool = False) -> None:
    """Raise a :class:`ConfigError` when a key of batch DataFrame ``df`` has rows in more than
    one of its partitions (a Spark job over its key columns). A row with a NULL in a named key
    column has no key: it is not counted."""
    split = _split_keys(df, key_columns, whole_record)
    if not split:
        return
    raise ConfigError(
        "assume_partitioned",
        True,
        f"False for this DataFrame: it has rows of one key in more than one partition "
        f"({_named(split, key_columns)}), so two tasks would run such a key at once and its order "
        "would be lost. Drop the option (the key's rows are then repartitioned by the key), or "
        "repartition the DataFrame by the key first",
    )


_PART = "_kaw_partition"


def _split_keys(df: DataFrame, key_columns: list[str], whole_record: bool) -> list[Any]:
    """Up to :data:`_SHOWN` + 1 keys of ``df`` in more than one partition, each with them."""
    types = {field.name: field.dataType for field in df.schema.fields}
    keys = [_groupable(name, types[name]) for name in key_columns]
    rows = df.select(*keys, F.spark_partition_id().alias(_PART))
    if not whole_record:
        rows = rows.dropna(subset=key_columns)
    return (
        rows.groupBy(*key_columns)
        .agg(F.sort_array(F.collect_set(_PART)).alias(_PART))
        .where(F.size(_PART) > 1)
        .limit(_SHOWN + 1)
        .collect()
    )


def _groupable(name: str, kind: DataType) -> Column:
    """Column ``name`` as Spark can group it: a key holding a map (or a variant) as its JSON
    text, each map's entries sorted by key (pyspark before 4 groups no map, and maps listing
    the same entries in another order are one key: :mod:`.key_hash`)."""
    column = F.col(quoted(name))
    return F.to_json(in_key_order(column, kind)).alias(name) if holds_map(kind) else column


def _named(split: list[Any], key_columns: list[str]) -> str:
    named = "; ".join(f"key {_key(row, key_columns)!r} in partitions {row[_PART]}" for row in split[:_SHOWN])
    return named + (", and more" if len(split) > _SHOWN else "")


def _key(row: Any, key_columns: list[str]) -> Any:
    values = tuple(row[c] for c in key_columns)
    return values[0] if len(values) == 1 else values

"""Columns whose names Spark would read as paths, renamed around a wait's Python stage.

pyspark's ``mapInArrow`` hands its function every column by name (``df[name]``), and Spark reads
a dot in a name as a struct field and a backtick as quoting: a column named ``a.b`` fails to
resolve, or, beside a struct ``a`` with a field ``b``, may resolve to that field. So do a
``repartition`` and a ``sortWithinPartitions`` by such a name. A wait renames those columns by
position before its stage (``toDF``, which reads no name) and its tasks give every Arrow batch
its names back before a record is read (:func:`named`): the function, the key, the errors and
the output see the names the DataFrame had.

Invariant: :func:`stage_names` maps each name Spark would misread, and only those, to a name no
other column has; the renaming is undone by position, so no column is ever swapped for another.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["misread", "named", "stage_names"]

_PATH_CHARS = (".", "`")


def misread(name: str) -> bool:
    """Whether Spark would read column ``name``, given as a string, as something else."""
    return any(char in name for char in _PATH_CHARS)


def stage_names(names: Sequence[str]) -> dict[str, str] | None:
    """Each name Spark would misread mapped to one it reads as given (``_kaw_col<position>``,
    unlike every other column's); None when there is none."""
    taken = set(names)
    renamed: dict[str, str] = {}
    for position, name in enumerate(names):
        if misread(name):
            safe = f"_kaw_col{position}"
            while safe in taken:
                safe += "_"
            taken.add(safe)
            renamed[name] = safe
    return renamed or None


def named(batches: Iterator[Any], names: Sequence[str]) -> Iterator[Any]:
    """The Arrow batches of a task with their columns named ``names`` again, by position (no
    copy of the data)."""
    import pyarrow as pa

    schema = None
    for batch in batches:
        if schema is None:
            fields = [field.with_name(name) for field, name in zip(batch.schema, names, strict=True)]
            schema = pa.schema(fields, metadata=batch.schema.metadata)
        yield pa.RecordBatch.from_arrays(batch.columns, schema=schema)

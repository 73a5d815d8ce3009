"""A task's records set aside, on its local disk (pyarrow only; no pyspark).

In a key-ordered task a hot key's records past the waiting bound are set aside
(:mod:`keyed_async_wait.core.set_aside`). :class:`ArrowSpill` keeps them as what they came as:
their input rows, taken out of the task's :class:`~.output.RowSource` (which then holds
nothing of them) and appended to an Arrow IPC file in the task's local directory; a row comes
back as it came in, read by the row source like any input batch, so the function sees the same
record and the output carries the same input columns.

Memory: per record set aside, two small ints (where its row is in the file); the rows
themselves are on disk (read through a memory map, so the operating system pages them in and
out), the file deleted when the task ends.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from collections import deque
from collections.abc import Hashable
from typing import IO, Any

import pyarrow as pa

from ..core.parking import ParkedItem
from .output import RowSource

__all__ = ["ArrowSpill", "spill_directory"]


def spill_directory() -> str:
    """The task's local directory: Spark's first local dir (``SPARK_LOCAL_DIRS``, set for
    executors), else the system's temporary directory."""
    local = os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0].strip()
    return local if local and os.path.isdir(local) else tempfile.gettempdir()


class ArrowSpill:
    """The records a task set aside, per key first in first out (an
    :class:`~keyed_async_wait.runtime.overflow.Overflow`)."""

    limit: int | None = None  # on local disk: no bound in memory

    def __init__(self, source: RowSource) -> None:
        self.source = source
        self.spilled = 0  # records written out (the task reports it)
        self._file: IO[bytes] | None = None
        self._segments: list[tuple[int, int]] = []  # (offset, length) of each batch in the file
        self._keys: dict[Hashable, deque[tuple[int, int]]] = {}  # key -> (segment, row)
        self._read: tuple[int, pa.RecordBatch] | None = None  # the segment read last
        self._mapped: pa.Buffer | None = None  # the file, mapped (again when it grew)

    def put(self, items: list[tuple[Hashable, Any]]) -> None:
        batch = self.source.take_rows([record for _, record in items])
        if self._file is None:
            # open for the task's life (closed, and so deleted, by close())
            self._file = tempfile.TemporaryFile(prefix="kaw-spill-", dir=spill_directory())  # noqa: SIM115
        offset = self._file.seek(0, os.SEEK_END)
        with pa.ipc.new_stream(self._file, batch.schema) as writer:
            writer.write_batch(batch)
        segment = len(self._segments)
        self._segments.append((offset, self._file.tell() - offset))
        keys = self._keys
        for row, (key, _) in enumerate(items):
            queue = keys.get(key)
            if queue is None:
                keys[key] = queue = deque()
            queue.append((segment, row))
        self.spilled += len(items)

    def take(self, key: Hashable, count: int) -> list[Any]:
        queue = self._keys.get(key)
        if not queue:
            return []
        places = [queue.popleft() for _ in range(min(count, len(queue)))]
        if not queue:
            del self._keys[key]
        return self.source.read(self._rows(places))

    def items(self) -> list[ParkedItem]:
        return [ParkedItem(record, key) for key in list(self._keys) for record in self.take(key, 1 << 62)]

    def peek(self) -> list[ParkedItem]:
        items = []
        for key, queue in self._keys.items():
            rows = self._rows(list(queue)).to_pylist()
            items += [ParkedItem(row, key) for row in rows]
        return items

    def close(self) -> None:
        file, self._file = self._file, None
        self._keys, self._segments, self._read, self._mapped = {}, [], None, None
        if file is not None:
            file.close()  # a temporary file: deleted as it closes

    def _rows(self, places: list[tuple[int, int]]) -> pa.RecordBatch:
        """The rows at ``places`` (segment, row), in that order, as one batch."""
        parts: list[pa.RecordBatch] = []
        start = 0
        for i in range(1, len(places) + 1):  # runs of places in one segment: one take each
            if i == len(places) or places[i][0] != places[start][0]:
                batch = self._segment(places[start][0])
                parts.append(batch.take(pa.array([row for _, row in places[start:i]], type=pa.int64())))
                start = i
        if len(parts) == 1:
            return parts[0]
        return pa.Table.from_batches(parts).combine_chunks().to_batches()[0]

    def _segment(self, number: int) -> pa.RecordBatch:
        """Batch ``number`` as a view of the file mapped into memory: no copy, so taking one
        row of it costs one row, however large the batch (a key's records come back a few at
        a time, from every batch)."""
        if self._read is not None and self._read[0] == number:
            return self._read[1]
        assert self._file is not None
        offset, length = self._segments[number]
        if self._mapped is None or len(self._mapped) < offset + length:
            self._file.flush()
            self._mapped = pa.py_buffer(mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ))
        batch = pa.ipc.open_stream(self._mapped.slice(offset, length)).read_next_batch()
        self._read = (number, batch)
        return batch

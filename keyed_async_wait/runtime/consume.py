"""What the consumer of ``process_batches`` gets for the entries that leave: outputs, in order."""

from __future__ import annotations

from typing import Any

from ..core.entry import Entry
from ..core.parking import PARKED

__all__ = ["outputs_of"]


def outputs_of(entries: list[Entry], pairs: bool, emit_errors: bool, plain: bool) -> list[Any]:
    """The outputs of ``entries`` (records and watermarks leaving, in order): results, or
    ``(record, results)`` pairs, watermarks, FailedRecords when errors are emitted; a parked
    record gives none. ``plain``: nothing but finished records, none partly taken."""
    if plain:
        if pairs:
            return [(entry.record, entry.results) for entry in entries]
        return [result for entry in entries for result in entry.results]  # type: ignore[union-attr]
    chunk: list[Any] = []
    append, extend = chunk.append, chunk.extend
    for entry in entries:
        if entry.watermark:
            append(entry.record)
        elif entry.failure is not None:
            if emit_errors and entry.failure is not PARKED:
                append(entry.failure)
        elif pairs:
            append((entry.record, entry.results))
        elif entry.emitted:
            extend(entry.results[entry.emitted :])  # type: ignore[index]
        else:
            extend(entry.results)  # type: ignore[arg-type]
    return chunk

"""Running a write action through the operator, for the write tests."""

from __future__ import annotations

from typing import Any

from keyed_async_wait.operator import KeyedAsyncWaitOperator
from lookup import Write


async def write_all(
    fn: Write, records: list[dict[str, Any]], mode: str = "key_ordered", **kw: Any
) -> list[Any]:
    """Every record through ``fn`` (keyed by ``id`` when key-ordered); the operator's outputs."""
    key = "id" if mode == "key_ordered" else None
    op = KeyedAsyncWaitOperator(fn, mode=mode, key=key, output="pairs", **kw)
    try:
        return [pair async for pair in op.process(records)]
    finally:
        await fn.aclose()

"""The step journal's parts against a real Redis (no Spark): names, round trip, clean-up,
secrets kept out of sight."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis

from keyed_async_wait import ConfigError
from keyed_async_wait.core.chain import PROGRESS_FIELD, ChainProgress
from keyed_async_wait.spark.journal import journal_prefix
from lookup.journal import StepJournal, TaskJournal, record_id


def test_a_journaled_step_comes_back_to_the_same_row_in_a_rerun(redis_url: str) -> None:
    journal = StepJournal(redis_url, ttl=60)
    name = f"{journal_prefix('/tmp/cp-' + uuid.uuid4().hex)}:7"
    columns = ["seq", "order_id"]
    progress = ChainProgress()
    progress.finish("customer", {"name": "x", "when": None})
    writer = TaskJournal(journal, name, columns)

    async def write() -> None:
        await writer.write({"seq": 1, "order_id": 2, PROGRESS_FIELD: progress}, progress)
        await writer.aclose()

    asyncio.run(write())
    rows = [{"seq": 1, "order_id": 2}, {"seq": 2, "order_id": 2}]
    reader = TaskJournal(journal, name, columns)
    reader.load(rows)
    reader.close_sync()
    assert ChainProgress.of(rows[0]).done == ["customer"] and PROGRESS_FIELD not in rows[1]
    assert reader.resumed == 1
    client = redis.Redis.from_url(redis_url)
    try:
        assert 0 < client.ttl(name) <= 60
        journal.forget(name.rsplit(":", 1)[0], 7)
        assert not client.exists(name)
    finally:
        client.close()
    assert record_id({"seq": 1, "order_id": 2, "other": 5}, columns) == record_id(rows[0], columns)


def test_a_journal_is_checked_and_keeps_its_password() -> None:
    assert "hunter2" not in repr(StepJournal("redis://:hunter2@127.0.0.1:1/0"))
    with pytest.raises(ConfigError, match="redis://"):
        StepJournal("http://127.0.0.1:1")
    with pytest.raises(ConfigError, match="ttl"):
        StepJournal("redis://127.0.0.1:1/0", ttl=0)

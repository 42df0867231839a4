"""R5: one bad row in a pulled batch does not move the cursor past it; the rest apply. A row
that stays bad is skipped after a few passes and reported, so it cannot stall sync forever."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from syncd.sync.pull import BAD_ROW_PASSES
from tests.sync.harness import start_hub, start_laptop


def corrupt(db: Path, memory_id: str) -> None:
    """What a buggy writer or a foreign plane could hand out: a version with no usable stamp."""
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE memories SET updated_at = 'not-a-time' WHERE id = ?", (memory_id,))


@pytest.mark.parametrize("writing", [False, True])
@pytest.mark.parametrize("cursor", ["ingest", "origin"])
async def test_a_bad_row_holds_the_cursor_then_is_skipped_and_reported(
        tmp_path: Path, cursor: str, writing: bool) -> None:
    """R5: the good rows apply, the cursor waits, and the skip is visible in status. The
    passes are counted as passes: one that pushes a fresh write (and so pulls twice) counts
    once."""
    hub = await start_hub(tmp_path / "hub", cursor)
    a = await start_laptop("a", tmp_path / "a", hub.url, hub.token)
    b = await start_laptop("b", tmp_path / "b", hub.url, hub.token)
    try:
        ids = [(await a.store.memories.save({"content": f"note {i} about the release train"}))["node_id"]
               for i in range(3)]
        assert (await a.sync()).ok
        await asyncio.to_thread(corrupt, hub.store.db_path, ids[1])
        for attempt in range(1, BAD_ROW_PASSES):
            if writing:
                await b.store.memories.save({"content": f"b writes during pass {attempt}"})
            report = await b.sync()
            assert report.pull_problems >= 1, report
            assert "cursor" not in await b.store.replication.sync_state(), f"pass {attempt}"
            assert b.engine.status.skipped_rows == []
        held = {r["id"] for r in (await b.store.memories.list_memories())["rows"]}
        assert held & set(ids) == {ids[0], ids[2]}
        report = await b.sync()
        assert report.pull_problems == 1
        assert "cursor" in await b.store.replication.sync_state()
        assert [ids[1] in line and "updated_at" in line
                for line in b.engine.status.skipped_rows] == [True]
        later = (await a.store.memories.save({"content": "the train leaves on Thursdays"}))["node_id"]
        assert (await a.sync()).ok
        report = await b.sync()  # past the skipped row: sync makes progress again
        assert report.ok, report
        assert (await b.store.memories.get(later))["content"] == "the train leaves on Thursdays"
        before = (await b.store.replication.sync_state())["cursor"]
        await a.store.memories.save({"content": "and returns on Fridays"})
        assert (await a.sync()).ok
        assert (await b.sync()).ok
        assert (await b.store.replication.sync_state())["cursor"] > before  # the skipped row holds nothing
        assert len(b.engine.status.skipped_rows) == 1  # reported once
    finally:
        await a.close()
        await b.close()
        await hub.close()

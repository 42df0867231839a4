"""RELIABILITY S4: a long reader pins the WAL while it lives; once it ends, the WAL stops
growing (autocheckpoint reuses it) and an explicit checkpoint truncates it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from local_store import Store


def wal_size(data: Path) -> int:
    wal = data / "memory.db-wal"
    return wal.stat().st_size if wal.exists() else 0


async def test_wal_is_bounded_once_a_long_reader_ends(tmp_path: Path) -> None:
    store = await Store.open(tmp_path)
    try:
        reader = sqlite3.connect(tmp_path / "memory.db", isolation_level=None)
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM memories").fetchone()  # holds a snapshot
        for i in range(60):
            await store.save_many([{"content": f"pinned write {i} {j} " + "x" * 400}
                                   for j in range(20)])
        pinned = wal_size(tmp_path)
        assert pinned > 1_000_000  # the reader kept the WAL from being reset
        reader.execute("COMMIT")
        reader.close()
        for i in range(60):
            await store.save_many([{"content": f"free write {i} {j} " + "y" * 400}
                                   for j in range(20)])
        assert wal_size(tmp_path) <= pinned * 1.05  # reused from the start, not appended
        busy, _, _ = await store.checkpoint()
        assert busy == 0 and wal_size(tmp_path) == 0
        assert await store.integrity_check() == "ok"
        assert (await store.stats())["memories"] == 2400
    finally:
        await store.close()


async def test_new_stores_use_16k_pages_and_older_4k_stores_keep_working(tmp_path: Path) -> None:
    def page_size(data: Path) -> int:
        conn = sqlite3.connect(data / "memory.db")
        try:
            return int(conn.execute("PRAGMA page_size").fetchone()[0])
        finally:
            conn.close()

    async with await Store.open(tmp_path / "new") as store:
        await store.save({"content": "a new store"})
    assert page_size(tmp_path / "new") == 16384

    old = tmp_path / "old"
    old.mkdir()
    conn = sqlite3.connect(old / "memory.db")  # as syncd 0.x created it: 4 KiB pages
    conn.execute("PRAGMA page_size = 4096")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE made_before (x)")
    conn.close()
    async with await Store.open(old) as store:
        await store.save_many([{"content": f"old store row {i} " + "z" * 300} for i in range(500)])
        found = await store.recall({"query": "old store row 7"}, mode="keyword")
        assert found.memories
        assert await store.integrity_check() == "ok"
    assert page_size(old) == 4096

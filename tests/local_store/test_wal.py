"""RELIABILITY S4: a long reader pins the WAL while it lives; once it ends, the WAL stops
growing (autocheckpoint reuses it) and an explicit checkpoint truncates it."""

from __future__ import annotations

import asyncio
import sqlite3
import stat
from pathlib import Path

from local_store import HashingEmbedder, Store, db
from tests.store_probe import integrity_check


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
            await store.memories.save_many([{"content": f"pinned write {i} {j} " + "x" * 400}
                                   for j in range(20)])
        pinned = wal_size(tmp_path)
        assert pinned > 1_000_000  # the reader kept the WAL from being reset
        reader.execute("COMMIT")
        reader.close()
        for i in range(60):
            await store.memories.save_many([{"content": f"free write {i} {j} " + "y" * 400}
                                   for j in range(20)])
        assert wal_size(tmp_path) <= pinned * 1.05  # reused from the start, not appended
        busy, _, _ = await store.maintenance.checkpoint()
        assert busy == 0 and wal_size(tmp_path) == 0
        assert await integrity_check(store) == "ok"
        assert (await store.maintenance.stats())["memories"] == 2400
    finally:
        await store.close()


def make_store_file(data: Path, *, page_size: int) -> None:
    """An empty, migrated store file with pages of ``page_size`` bytes."""
    data.mkdir()
    conn = sqlite3.connect(data / db.DB_FILENAME, isolation_level=None)
    try:
        conn.execute(f"PRAGMA page_size = {page_size}")
        conn.execute("PRAGMA journal_mode = WAL")
        db.migrate(conn)
    finally:
        conn.close()


async def test_a_new_store_takes_8k_pages_and_an_old_one_keeps_its_own(tmp_path: Path) -> None:
    new = tmp_path / "new"
    async with await Store.open(new) as store:
        await store.memories.save({"content": "a memory in a fresh store"})
        assert store._writer.conn.execute("PRAGMA page_size").fetchone()[0] == db.PAGE_SIZE
        assert store._writer.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == (
            db.BACKSTOP_BYTES // db.PAGE_SIZE)
    old = tmp_path / "old"
    await asyncio.to_thread(make_store_file, old, page_size=4096)
    async with await Store.open(old) as store:
        saved = await store.memories.save({"content": "a memory in a store made with 4 KiB pages"})
        assert store._writer.conn.execute("PRAGMA page_size").fetchone()[0] == 4096
        assert store._writer.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == (
            db.BACKSTOP_BYTES // 4096)
        found = await store.recall.query({"query": "4 KiB pages"})
        assert [m.id for m in found.memories] == [f"memory:{saved['id']}"]
        assert await integrity_check(store) == "ok"


async def test_a_new_store_file_and_its_wal_are_readable_by_the_owner_only(
        tmp_path: Path) -> None:
    async with await Store.open(tmp_path / "data", embedder=HashingEmbedder()) as store:
        await store.memories.save({"content": "private to this user"})
        modes = {p.name: stat.S_IMODE(p.stat().st_mode)
                 for p in (tmp_path / "data").iterdir() if p.name.startswith("memory.db")}
    assert modes and set(modes.values()) == {0o600}, modes

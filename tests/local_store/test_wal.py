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

"""WAL checkpoints run beside the writer (``local_store.checkpoint``): the WAL is copied into the
database and restarted after a burst without an explicit checkpoint, an explicit TRUNCATE never
collides with a background pass, and closing mid-checkpoint loses nothing."""

from __future__ import annotations

from pathlib import Path

from local_store import Store
from protocol.rows import NodeRow
from protocol.timestamp import format_ns
from tests.store_probe import integrity_check

T0 = 1_780_000_000_000_000_000


def rows(start: int, n: int) -> list[NodeRow]:
    return [NodeRow(id=f"memory:{i:08d}", realm="p", memory_type="fact",
                    content=f"row {i} " + "text " * 60, updated_at=format_ns(T0 + i),
                    embedding=[float(i % 7 + 1), 1.0, 0.0])
            for i in range(start, start + n)]


def wal_size(data: Path) -> int:
    wal = data / "memory.db-wal"
    return wal.stat().st_size if wal.exists() else 0


def db_size(data: Path) -> int:
    return (data / "memory.db").stat().st_size


async def test_a_burst_is_copied_and_the_wal_restarts_without_an_explicit_checkpoint(
        tmp_path: Path) -> None:
    async with await Store.open(tmp_path) as store:
        await store.replication.apply(rows(0, 3000), [], model="m")
        await store.checkpointer.wait_idle()
        first = wal_size(tmp_path)
        assert first > 1_000_000
        assert db_size(tmp_path) > first // 2  # the burst's pages were copied into the database
        for start in range(3000, 15000, 3000):  # four more bursts of the same size
            await store.replication.apply(rows(start, 3000), [], model="m")
            await store.checkpointer.wait_idle()
        # Each burst restarted the WAL from its beginning: without that it would hold all five.
        assert wal_size(tmp_path) < 2 * first
        assert db_size(tmp_path) > 4 * first
        assert store.checkpointer.last_error is None
        assert (await store.maintenance.stats())["memories"] == 15000
        assert await integrity_check(store) == "ok"


async def test_explicit_truncate_never_collides_with_a_background_pass(tmp_path: Path) -> None:
    async with await Store.open(tmp_path) as store:
        for i in range(20):
            await store.replication.apply(rows(i * 200, 200), [], model="m")
            busy, _, _ = await store.maintenance.checkpoint()
            assert busy == 0
        assert wal_size(tmp_path) == 0 or (await store.maintenance.checkpoint())[0] == 0


async def test_closing_during_a_checkpoint_keeps_every_row(tmp_path: Path) -> None:
    store = await Store.open(tmp_path)
    await store.replication.apply(rows(0, 5000), [], model="m")
    await store.close()  # a background pass is running or due right now
    assert not (tmp_path / "memory.db-wal").exists() or wal_size(tmp_path) == 0
    async with await Store.open(tmp_path) as again:
        assert (await again.maintenance.stats())["memories"] == 5000
        assert await integrity_check(again) == "ok"

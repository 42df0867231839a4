"""A laptop restored from a backup (``syncd restore``) catches up through sync, as
``docs/operations.md`` says: what other installs synced after the backup comes with the next
pass; its own later writes (a hub leaves them out of its ``changes``) come with the next
anti-entropy pass."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from local_store.backups import backup, restore
from tests.sync.harness import Laptop, start_hub, start_laptop

ANTI_ENTROPY_SECS = 60.0


async def contents(laptop: Laptop) -> set[str]:
    return {r[0] for r in await laptop.store._fetch(
        "SELECT content FROM memories WHERE deleted = 0")}


async def test_a_restored_laptop_catches_up_with_the_hub(tmp_path: Path) -> None:
    offset = [0]

    def wall() -> int:  # laptop A's clock, moved forward by hand
        return time.time_ns() + offset[0]

    hub = await start_hub(tmp_path / "hub")
    a_dir, copy = tmp_path / "a", tmp_path / "a-backup.db"

    async def laptop_a() -> Laptop:
        return await start_laptop("a", a_dir, hub.url, hub.token, wall=wall,
                                  anti_entropy_secs=ANTI_ENTROPY_SECS)

    b = await start_laptop("b", tmp_path / "b", hub.url, hub.token)
    try:
        a = await laptop_a()
        await a.store.memories.save({"content": "in the backup"})
        assert (await a.sync()).ok  # the first pass runs anti-entropy too
        await a.close()
        assert await asyncio.to_thread(backup, a_dir, copy) == 1

        a = await laptop_a()
        await a.store.memories.save({"content": "A wrote it after the backup"})
        assert (await a.sync()).ok
        await a.close()
        await b.store.memories.save({"content": "B wrote it after the backup"})
        assert (await b.sync()).ok

        await asyncio.to_thread(restore, a_dir, copy)
        a = await laptop_a()
        try:
            assert await contents(a) == {"in the backup"}
            report = await a.sync()
            assert report.ok and not report.anti_entropy
            assert await contents(a) == {"in the backup", "B wrote it after the backup"}
            offset[0] = int((ANTI_ENTROPY_SECS + 1) * 1e9)
            report = await a.sync()
            assert report.ok and report.anti_entropy
            assert await contents(a) == {"in the backup", "A wrote it after the backup",
                                         "B wrote it after the backup"}
        finally:
            await a.close()
    finally:
        await b.close()
        await hub.close()

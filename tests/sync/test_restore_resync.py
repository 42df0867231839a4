"""A laptop restored from a backup whose outbox still holds entries: those may be versions the
install superseded — and pushed — after the backup was made, and a hub leaves an install's own
versions out of its ``changes``. ``restore`` marks such a store; its first pass applies the
plane's export before pushing anything, so a stale queued version never lands over the later
one (and an entry the plane never saw is still pushed). A real hub in both cursor modes, real
stores, laptops on a hand-moved wall clock (no sleeping)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from local_store.backups import backup, restore
from local_store.replica import RESTORED_OUTBOX
from tests.conftest import FakeWall
from tests.store_probe import outbox_items
from tests.sync.harness import Hub, Laptop, start_laptop

OVERLAP_SECS = 0.2  # queued versions older than 0.1 s are re-stamped when pushed
PAST_OVERLAP_SECS = 1.0  # under the engine's 2 s offset threshold: the hub's Date still agrees


async def laptop_a(data_dir: Path, hub: Hub, wall: FakeWall) -> Laptop:
    return await start_laptop("a", data_dir, hub.url, hub.token, wall=wall,
                              overlap_secs=OVERLAP_SECS)


async def content(laptop_or_hub: Laptop | Hub, memory_id: str) -> str:
    return str((await laptop_or_hub.store.memories.get(memory_id))["content"])


async def test_a_restored_outbox_does_not_push_over_a_later_own_edit(
        hub: Hub, tmp_path: Path) -> None:
    """The backup's outbox holds x v1; after the backup A pushed v1, then v2. Restored, A's
    first pass brings v2 back before pushing: the hub keeps v2, A holds it, nothing queued."""
    wall = FakeWall(time.time_ns())
    a_dir, copy = tmp_path / "a", tmp_path / "a-backup.db"
    a = await laptop_a(a_dir, hub, wall)
    x = (await a.store.memories.save({"content": "x v1", "topic_key": "x"}))["node_id"]
    await a.close()
    assert await asyncio.to_thread(backup, a_dir, copy) == 1  # v1 still queued in it

    a = await laptop_a(a_dir, hub, wall)
    assert (await a.sync()).ok  # pushes v1
    await a.store.memories.save({"content": "x v2, the later edit", "topic_key": "x"})
    assert (await a.sync()).ok  # pushes v2
    assert await content(hub, x) == "x v2, the later edit"
    await a.close()

    restored = await asyncio.to_thread(restore, a_dir, copy)
    assert restored.resync
    a = await laptop_a(a_dir, hub, wall)
    try:
        assert RESTORED_OUTBOX in await a.store.replication.sync_state()
        wall.advance(PAST_OVERLAP_SECS)  # the queued v1 would now be re-stamped to "now"
        report = await a.sync()
        assert report.ok, report.error
        assert await content(hub, x) == "x v2, the later edit"
        assert await content(a, x) == "x v2, the later edit"
        assert report.anti_entropy  # before the push (a hub's changes leave v2 out)
        assert await outbox_items(a.store) == []
        assert RESTORED_OUTBOX not in await a.store.replication.sync_state()
        assert (await a.sync()).ok
        assert await content(hub, x) == "x v2, the later edit"
    finally:
        await a.close()


async def test_a_restored_entry_the_plane_already_holds_is_dropped_not_stamped_again(
        hub: Hub, tmp_path: Path) -> None:
    """The backup's outbox holds x v1, which A pushed after the backup; B then edits x. Restored,
    A's anti-entropy finds v1 on the plane: the entry is dropped, not staged — stamped again, the
    stale v1 would beat B's later edit everywhere."""
    wall = FakeWall(time.time_ns())
    a_dir, copy = tmp_path / "a", tmp_path / "a-backup.db"
    a = await laptop_a(a_dir, hub, wall)
    b = await start_laptop("b", tmp_path / "b", hub.url, hub.token, wall=wall,
                           overlap_secs=OVERLAP_SECS)
    try:
        x = (await a.store.memories.save({"content": "x v1", "topic_key": "x"}))["node_id"]
        await a.close()
        await asyncio.to_thread(backup, a_dir, copy)  # x v1 still queued in it
        a = await laptop_a(a_dir, hub, wall)
        assert (await a.sync()).ok  # pushes v1
        assert (await b.sync()).ok
        wall.advance(PAST_OVERLAP_SECS)
        await b.store.memories.save({"content": "x v2, b's later edit", "topic_key": "x"})
        wall.advance(PAST_OVERLAP_SECS)
        await a.close()
        assert (await asyncio.to_thread(restore, a_dir, copy)).resync
        a = await laptop_a(a_dir, hub, wall)
        report = await a.sync()
        assert report.ok and report.pushed_nodes == 0, report
        assert await outbox_items(a.store) == []
        for lap in (b, a):
            assert (await lap.sync()).ok
        for holder in (hub, a, b):
            assert await content(holder, x) == "x v2, b's later edit"
    finally:
        await a.close()
        await b.close()


async def test_a_restored_entry_the_plane_never_saw_is_pushed_in_the_first_pass(
        hub: Hub, tmp_path: Path) -> None:
    """The catch-up keeps what only the backup holds: an entry the plane lacks is pushed."""
    wall = FakeWall(time.time_ns())
    a_dir, copy = tmp_path / "a", tmp_path / "a-backup.db"
    a = await laptop_a(a_dir, hub, wall)
    y = (await a.store.memories.save({"content": "y, never pushed"}))["node_id"]
    await a.close()
    await asyncio.to_thread(backup, a_dir, copy)
    assert (await asyncio.to_thread(restore, a_dir, copy)).resync

    a = await laptop_a(a_dir, hub, wall)
    try:
        wall.advance(PAST_OVERLAP_SECS)
        report = await a.sync()
        assert report.ok and report.anti_entropy and report.pushed_nodes == 1, report
        assert await content(hub, y) == "y, never pushed"
        assert await outbox_items(a.store) == []
    finally:
        await a.close()


async def test_a_backup_with_an_empty_outbox_is_not_marked(hub: Hub, tmp_path: Path) -> None:
    """Nothing queued, nothing to push over: the restored store keeps the ordinary catch-up
    (its cursor; own later writes at the next anti-entropy) and no extra export is paid."""
    wall = FakeWall(time.time_ns())
    a_dir, copy = tmp_path / "a", tmp_path / "a-backup.db"
    a = await laptop_a(a_dir, hub, wall)
    await a.store.memories.save({"content": "pushed before the backup"})
    assert (await a.sync()).ok
    await a.close()
    await asyncio.to_thread(backup, a_dir, copy)

    assert not (await asyncio.to_thread(restore, a_dir, copy)).resync
    a = await laptop_a(a_dir, hub, wall)
    try:
        assert RESTORED_OUTBOX not in await a.store.replication.sync_state()
        report = await a.sync()
        assert report.ok and not report.anti_entropy, report
    finally:
        await a.close()

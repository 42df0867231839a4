"""Repairs keep their versions: after a wiped plane, anti-entropy re-queues what the plane lacks,
and those entries are pushed with the version (``updated_at``, ``origin``) they were written
with. Re-stamped, a stale copy would beat an edit another laptop made since and had not pushed
yet. A pending local edit stays a local edit (re-stamped when pushed, R9), and so does an edit
made after its item was queued for repair. A real hub in both cursor modes, real stores."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import pytest

from local_store import HashingEmbedder, Store, db
from tests.conftest import FakeWall
from tests.store_probe import outbox_items
from tests.sync.harness import MODEL, Hub, Laptop, start_hub, start_laptop

OVERLAP_SECS = 0.2  # queued local edits older than 0.1 s are re-stamped when pushed
PAST_OVERLAP_SECS = 1.0  # under the engine's 2 s offset threshold: the hub's Date still agrees


async def wipe(hub: Hub) -> Hub:
    """The hub loses its data (new store_id, new token) and comes back on the same port."""
    await hub.close()
    await asyncio.to_thread(shutil.rmtree, hub.data_dir)
    return await start_hub(hub.data_dir, hub.cursor, port=int(hub.url.rsplit(":", 1)[1]))


async def laptop(name: str, tmp_path: Path, hub: Hub, wall: FakeWall) -> Laptop:
    return await start_laptop(name, tmp_path / name, hub.url, hub.token, wall=wall,
                              overlap_secs=OVERLAP_SECS)


async def content(store: Store, memory_id: str) -> str:
    return str((await store.memories.get(memory_id))["content"])


@pytest.mark.parametrize("mode", ["ingest", "origin"])
async def test_a_repair_after_a_wipe_does_not_overwrite_an_unpushed_edit(
        mode: str, tmp_path: Path) -> None:
    """B edits x while the hub is down; A repairs the wiped hub first, with its copy of x v0.
    B's edit is the latest write of x: it wins everywhere."""
    wall = FakeWall(time.time_ns())
    hub = await start_hub(tmp_path / "hub", mode)
    a = await laptop("a", tmp_path, hub, wall)
    b = await laptop("b", tmp_path, hub, wall)
    try:
        x = (await a.store.memories.save({"content": "x v0", "topic_key": "x"}))["node_id"]
        for lap in (a, b):
            assert (await lap.sync()).ok
        v0 = await a.store.memories.get(x)

        hub = await wipe(hub)
        for lap in (a, b):
            await lap.close()
        a = await laptop("a", tmp_path, hub, wall)
        b = await laptop("b", tmp_path, hub, wall)

        await b.store.memories.save({"content": "x v1, b's later edit", "topic_key": "x"})
        wall.advance(PAST_OVERLAP_SECS)
        ra = await a.sync()
        assert ra.ok and ra.anti_entropy and ra.requeued, ra
        repaired = await hub.store.memories.get(x)  # sent as it was written, not re-stamped
        assert (repaired["updated_at"], repaired["origin"]) == (v0["updated_at"], v0["origin"])
        assert (await b.sync()).ok
        assert (await a.sync()).ok
        for store in (a.store, b.store, hub.store):
            assert await content(store, x) == "x v1, b's later edit"
    finally:
        await a.close()
        await b.close()
        await hub.close()


@pytest.mark.parametrize("mode", ["ingest", "origin"])
async def test_a_repaired_version_of_another_laptop_keeps_its_origin(mode: str,
                                                                     tmp_path: Path) -> None:
    """A repairs B's version of y: the hub gets B's stamp and origin, not A's."""
    wall = FakeWall(time.time_ns())
    hub = await start_hub(tmp_path / "hub", mode)
    a = await laptop("a", tmp_path, hub, wall)
    b = await laptop("b", tmp_path, hub, wall)
    try:
        y = (await b.store.memories.save({"content": "y, written by b"}))["node_id"]
        assert (await b.sync()).ok
        assert (await a.sync()).ok
        written = await a.store.memories.get(y)
        assert written["origin"] == b.store.replica_id

        hub = await wipe(hub)
        await a.close()
        a = await laptop("a", tmp_path, hub, wall)
        wall.advance(PAST_OVERLAP_SECS)
        report = await a.sync()
        assert report.ok and report.anti_entropy, report
        held = await hub.store.memories.get(y)
        assert (held["updated_at"], held["origin"]) == (written["updated_at"], written["origin"])
    finally:
        await a.close()
        await b.close()
        await hub.close()


async def test_staging_keeps_a_repair_and_re_stamps_a_local_edit(tmp_path: Path) -> None:
    """In the store: a repair is staged with its version; a pending local edit found missing
    by anti-entropy stays a local edit; an edit made after the repair was queued is one too."""
    wall = FakeWall(time.time_ns())
    store = await Store.open(tmp_path / "data", embedder=HashingEmbedder(), wall=wall)
    try:
        old = (await store.memories.save({"content": "old, pushed long ago", "topic_key": "old"})
               )["node_id"]
        await store.replication.ack_push(await outbox_items(store))
        pending = (await store.memories.save({"content": "pending local edit"}))["node_id"]
        wall.advance(10)
        stamps = {m: (await store.memories.get(m))["updated_at"] for m in (old, pending)}

        await store.replication.requeue_unseen({}, {})  # the plane holds neither
        await stage_all(store)
        assert (await store.memories.get(old))["updated_at"] == stamps[old]
        assert (await store.memories.get(pending))["updated_at"] > stamps[pending]

        await store.replication.requeue_unseen({}, {})
        await store.memories.save({"content": "edited after the repair was queued", "topic_key": "old"})
        edited = (await store.memories.get(old))["updated_at"]
        wall.advance(10)
        await stage_all(store)
        assert (await store.memories.get(old))["updated_at"] > edited
    finally:
        await store.close()


async def stage_all(store: Store) -> None:
    entries, _, _ = await store.replication.stage_push(100, model=MODEL, dim=store.embedder.dim)
    assert entries
    await store.replication.ack_push(entries)


def version_3_store(path: Path) -> None:
    """A store as syncd wrote it before 0004: migrations 1–3 only, one queued local edit."""
    conn = db.connect(path)
    try:
        conn.execute("CREATE TABLE schema_migrations (number INTEGER PRIMARY KEY, "
                     "name TEXT NOT NULL, applied_at TEXT NOT NULL) STRICT")
        for number, name, sql in db.migration_files():
            if number > 3:
                continue
            for statement in db.split_sql(sql):
                conn.execute(statement)
            conn.execute("INSERT INTO schema_migrations VALUES (?, ?, 'then')", (number, name))
        conn.execute("INSERT INTO outbox (kind, item_id, local_seq) VALUES ('node', 'n', 1)")
    finally:
        conn.close()


async def test_an_older_store_migrates_and_its_entries_stay_local_edits(
        tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    await asyncio.to_thread(version_3_store, tmp_path / "data" / db.DB_FILENAME)
    store = await Store.open(tmp_path / "data", embedder=HashingEmbedder())
    try:
        rows = await store._fetch("SELECT item_id, repair_version FROM outbox")
        assert [tuple(r) for r in rows] == [("n", None)]
    finally:
        await store.close()

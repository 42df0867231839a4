"""A hard delete leaves its text on no page of any file in a SQLite hub's data directory, nor in
another laptop's, once the tombstone has reached them (issue 32, point 3). A hub purges only
through its import: the laptop pushes the purged tombstone (node and edges), the hub applies it
(``Writer.apply_nodes``/``apply_edge``) and scrubs its WAL before the import answers; a laptop
pulling the tombstone does the same before its pass ends. Also when the hub held a soft
tombstone, whose text FTS5 kept in its segments (before, only a live row's text was merged out
of the index). Files are read as bytes, as in ``tests/syncd/test_purge_off_disk.py``."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from local_store import HashingEmbedder, Store
from protocol.timestamp import format_ns, parse_ns
from tests.store_probe import dump_tables
from tests.sync.harness import Hub, two_laptops
from tests.syncd.test_purge_off_disk import new_marker, on_disk


@pytest.mark.parametrize("soft_first", [False, True])
async def test_a_hard_delete_leaves_no_text_on_the_hub_or_another_laptop(
        hub: Hub, tmp_path: Path, soft_first: bool) -> None:
    marker = new_marker()
    async with two_laptops(tmp_path, hub.url, hub.token) as (a, b):
        victim = await a.store.memories.save({"content": f"the deploy key is {marker}",
                                     "title": f"key {marker}", "tags": [marker],
                                     "topic_key": f"project/{marker}"})
        for n in range(30):
            await a.store.memories.save({"content": f"unrelated memory number {n} about builds"})
        other = await a.store.memories.save({"content": "the old deploy key"})
        await a.store.graph.judge(other["id"], victim["id"], "conflicts", f"because {marker}")
        await a.sync()
        await b.sync()
        if soft_first:
            await a.store.memories.delete(victim["id"])
            await a.sync()
            await b.sync()
        for where in (hub.data_dir, b.data_dir):  # non-vacuity: the text reached them
            assert await on_disk(where, marker), where
        await a.store.memories.delete(victim["id"], hard=True)
        assert await on_disk(a.data_dir, marker) == []
        report = await a.sync()
        assert report.pushed_nodes >= 1, report
        assert await on_disk(hub.data_dir, marker) == []  # as the import answered
        assert not hub.store.checkpointer.scrub_owed
        await b.sync()
        assert await on_disk(b.data_dir, marker) == []
        nodes, _, _ = (await b.store.feed.page(0))[:3]
        assert [n.content for n in nodes if n.id == victim["node_id"]] == [""]


async def test_a_hard_delete_purges_the_versions_on_the_hub_and_another_laptop(
        hub: Hub, tmp_path: Path) -> None:
    """Every replica kept the earlier text as versions (``local_store/versions.py``): the
    pulled or imported hard-delete tombstone deletes them, and the scrub takes them off disk."""
    first, second = new_marker(), new_marker()
    async with two_laptops(tmp_path, hub.url, hub.token) as (a, b):
        victim = await a.store.memories.save({"content": f"key {first}", "topic_key": "project/key"})
        await a.sync()
        await b.sync()
        await a.store.memories.save({"content": f"key {second}", "topic_key": "project/key"})
        await a.store.memories.delete(victim["id"])
        await a.sync()
        await b.sync()
        for store in (a.store, hub.store, b.store):  # non-vacuity: each kept the old text
            kept = (await store.versions.history(victim["id"]))["versions"][1:]
            assert f"key {first}" in [v["content"] for v in kept], kept
        for where in (a.data_dir, hub.data_dir, b.data_dir):
            assert await on_disk(where, first), where
        await a.store.memories.delete(victim["id"], hard=True)
        await a.sync()
        await b.sync()
        for store in (a.store, hub.store, b.store):
            assert (await dump_tables(store))["memory_versions"] == []
        for where in (a.data_dir, hub.data_dir, b.data_dir):
            assert await on_disk(where, first) == [], where
            assert await on_disk(where, second) == [], where


async def test_an_edge_tombstone_alone_scrubs_the_reason_it_replaces(tmp_path: Path) -> None:
    """A hard delete's edge tombstones may arrive in a later page or import than its node:
    one that replaces an edge holding a reason purges too, and scrubs the WAL."""
    marker = new_marker()
    store = await Store.open(tmp_path / "data", embedder=HashingEmbedder())
    try:
        x = await store.memories.save({"content": "the deploy key"})
        y = await store.memories.save({"content": "the old deploy key"})
        await store.graph.judge(y["id"], x["id"], "conflicts", f"because {marker}")
        _, edges, _ = (await store.feed.page(0))[:3]
        (edge,) = [e for e in edges if not e.deleted]
        assert marker in (edge.props or "")
        assert await on_disk(store.data_dir, marker)
        later = format_ns(parse_ns(edge.updated_at or "") + 10**9)
        tomb = msgspec.structs.replace(
            edge, props=f'{{"deleted":true,"deleted_at":"{later}"}}', deleted=True,
            updated_at=later, origin="another-laptop")
        result = await store.replication.apply([], [tomb], model=store.embedder.model_id)
        assert result.applied_edges == 1, result
        assert await on_disk(store.data_dir, marker) == []
        assert not store.checkpointer.scrub_owed
    finally:
        await store.close()

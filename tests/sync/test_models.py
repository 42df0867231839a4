"""Embedding models across the plane: rows carry no model name, so a laptop whose local model
differs from the plane's never pushes its own vectors — it pushes the plane-model vector while
the content is unchanged, else a zero vector (which the plane skips in its semantic leg)."""

from __future__ import annotations

from pathlib import Path

from local_store import HashingEmbedder, Store
from protocol.rows import NodeRow
from syncd.sync.engine import SyncEngine, SyncOptions
from syncd.sync.plane import PlaneClient
from syncd.sync.runner import SyncRunner
from tests.sync.harness import MODEL, start_hub


async def hub_vector(hub_store: Store, memory_id: str | None) -> list[float] | None:
    nodes, _ = await hub_store.feed.read(include_deleted=True)
    return next(n.embedding for n in nodes if n.id == memory_id)


async def test_a_laptop_on_another_model_pushes_plane_vectors_or_zeros(tmp_path: Path) -> None:
    """Plane-model vector while the content is unchanged; zeros after a local edit."""
    hub = await start_hub(tmp_path / "hub")
    local = HashingEmbedder(model_id="other-model-384")
    store = await Store.open(tmp_path / "a", embedder=local)
    engine = SyncEngine(store, PlaneClient(hub.url, hub.token), SyncOptions(plane_model=MODEL))
    try:
        # A memory from the plane, with the plane's vector (the hub's model is MODEL).
        plane_vec = HashingEmbedder().embed(["ship on Thursdays"])[0].tolist()
        row = NodeRow(id="memory:00000000-0000-4000-8000-000000000001", content="ship on "
                      "Thursdays", topic_key="ship-day", updated_at="2026-01-01T00:00:00+00:00",
                      embedding=plane_vec)
        await hub.store.replication.apply([row], [], model=MODEL)
        assert (await engine.run_pass()).ok
        # Content unchanged (importance only): the push carries the plane-model vector.
        await store.memories.update_importance(row.id, 0.9)
        report = await engine.run_pass()
        assert report.ok and report.pushed_nodes == 1
        pushed = await hub_vector(hub.store, row.id)
        assert pushed is not None and max(abs(a - b) for a, b in zip(pushed, plane_vec,
                                                                      strict=True)) < 1e-6
        # A new local memory has only a local-model vector: zeros go out, never that vector.
        saved = await store.memories.save({"content": "deploys need two approvals",
                                  "topic_key": "deploy-rule"})
        report = await engine.run_pass()
        assert report.ok and report.pushed_nodes == 1
        assert await hub_vector(hub.store, saved["node_id"]) == [0.0] * 384  # no vector
        # Changed content on the plane's memory: its plane-model vector is stale, zeros go out.
        upserted = await store.memories.save({"content": "ship on Fridays now", "topic_key": "ship-day"})
        assert upserted["node_id"] == row.id
        report = await engine.run_pass()
        assert report.ok and report.pushed_nodes == 1
        assert await hub_vector(hub.store, row.id) == [0.0] * 384
        nodes, _ = await hub.store.feed.read()
        assert next(n.content for n in nodes if n.id == row.id) == "ship on Fridays now"
    finally:
        await engine.close()
        await store.close()
        await hub.close()


async def test_pulled_rows_are_embedded_with_the_local_model_in_the_background(
        tmp_path: Path) -> None:
    """The daemon's runner re-embeds pulled memories after the pass, without a restart."""
    hub = await start_hub(tmp_path / "hub")
    store = await Store.open(tmp_path / "a", embedder=HashingEmbedder(model_id="other-384"))
    runner = SyncRunner.create(store, url=hub.url, token=hub.token,
                               options=SyncOptions(plane_model=MODEL), interval=3600, jitter=0)
    try:
        rows = [NodeRow(id=f"memory:00000000-0000-4000-8000-00000000000{i}",
                        content=f"rotate the signing key {i}",
                        updated_at="2026-01-01T00:00:00+00:00",
                        embedding=HashingEmbedder().embed([f"key {i}"])[0].tolist())
                for i in range(3)]
        await hub.store.replication.apply(rows, [], model=MODEL)
        report = await runner.run_now()
        assert report.ok and report.pulled_nodes == 3
        assert runner._reembed is not None
        assert await runner._reembed == 3
        assert len(store.index) == 3  # the local model's index now covers them
        hits = await store.recall.query({"query": "rotate the signing key 1"}, mode="vector")
        assert hits.memories and hits.memories[0].id == rows[1].id
    finally:
        await runner.stop()
        await store.close()
        await hub.close()

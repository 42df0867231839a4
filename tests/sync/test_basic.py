"""Two laptops converge through the hub, in both cursor modes."""

from __future__ import annotations

from pathlib import Path

from tests.sync.harness import Hub, edge_set, live_contents, start_laptop


async def test_a_save_on_one_laptop_reaches_the_other(hub: Hub, tmp_path: Path) -> None:
    a = await start_laptop("a", tmp_path / "a", hub.url, hub.token)
    b = await start_laptop("b", tmp_path / "b", hub.url, hub.token)
    try:
        saved = await a.store.memories.save({"content": "release procedure: tag then make release",
                                    "memory_type": "procedure"})
        await a.store.graph.link({"memory_id": saved["node_id"], "target_node_id": "repo:syncd"})
        report = await a.sync()
        assert report.ok, report.error
        assert report.pushed_nodes == 1 and report.pushed_edges == 1
        report = await b.sync()
        assert report.ok, report.error
        got = await b.store.memories.get(saved["node_id"])
        assert got["content"] == "release procedure: tag then make release"
        assert await live_contents(a.store) == await live_contents(b.store)
        assert await edge_set(a.store) == await edge_set(b.store)
        hits = await b.store.recall.query({"query": "release procedure"})
        assert hits.memories and hits.memories[0].id == saved["node_id"]
        assert (await a.store.maintenance.stats())["outbox"] == 0
        assert (await b.store.maintenance.stats())["outbox"] == 0
    finally:
        await a.close()
        await b.close()

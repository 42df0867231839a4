"""Two laptops syncing through a hub on PostgreSQL: the core sync scenarios (convergence,
offline edits, no echo, reset detection), with a real hub app on a loopback port over a real
throwaway database, and laptops that are real stores with the real sync engine."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest
from aiohttp import web

from local_store import HashingEmbedder
from protocol.query import QueryRequest
from syncd.hub.app import create_hub_app
from syncd.hub.pg import PgHubStore
from tests.sync.harness import Laptop, edge_set, live_contents, start_laptop


@dataclass
class PgHub:
    dsn: str
    store: PgHubStore
    runner: web.AppRunner
    url: str
    token: str

    async def close(self) -> None:
        await self.runner.cleanup()
        await self.store.close()


async def start_pg_hub(dsn: str, port: int = 0, token: str | None = None) -> PgHub:
    store = await PgHubStore.open(dsn, embedder=HashingEmbedder())
    if token is None:
        token = await store.tokens.create(role="write", name="laptops")
    runner = web.AppRunner(create_hub_app(store, signing_key=await store.signing_key()))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return PgHub(dsn, store, runner, f"http://127.0.0.1:{runner.addresses[0][1]}", token)


@pytest.fixture
async def pg_hub(pg_dsn: str) -> AsyncIterator[PgHub]:
    hub = await start_pg_hub(pg_dsn)
    yield hub
    await hub.close()


@pytest.fixture
async def laptops(pg_hub: PgHub, tmp_path: Path) -> AsyncIterator[tuple[Laptop, Laptop]]:
    a = await start_laptop("a", tmp_path / "a", pg_hub.url, pg_hub.token)
    b = await start_laptop("b", tmp_path / "b", pg_hub.url, pg_hub.token)
    yield a, b
    await a.close()
    await b.close()


async def sync(*laps: Laptop) -> None:
    for lap in laps:
        report = await lap.sync()
        assert report.ok, report.error


async def hub_contents(hub: PgHub) -> dict[str, tuple[str | None, bool, str | None]]:
    nodes, _ = await hub.store.export()
    return {n.id or "": (n.content, bool(n.deleted), n.updated_at) for n in nodes}


async def test_two_laptops_converge_through_a_postgresql_hub(
        pg_hub: PgHub, laptops: tuple[Laptop, Laptop]) -> None:
    a, b = laptops
    saved = await a.store.memories.save({"content": "release procedure: tag then make release",
                                "memory_type": "procedure"})
    await a.store.graph.link({"memory_id": saved["node_id"], "target_node_id": "repo:syncd"})
    other = await b.store.memories.save({"content": "the staging database listens on port 5433"})
    await sync(a, b, a)
    assert await live_contents(a.store) == await live_contents(b.store)
    assert await edge_set(a.store) == await edge_set(b.store)
    assert set(await hub_contents(pg_hub)) == {saved["node_id"], other["node_id"]}
    hits = await b.store.recall.query({"query": "release procedure"})
    assert hits.memories[0].id == saved["node_id"]
    hub_hits = await pg_hub.store.recall(QueryRequest(query="staging database"))
    assert hub_hits.memories[0].id == other["node_id"]


async def test_offline_edits_on_both_laptops_converge_to_the_later_one(
        pg_hub: PgHub, laptops: tuple[Laptop, Laptop]) -> None:
    a, b = laptops
    topic = "deploy/target"
    mid = (await a.store.memories.save({"content": "deploy target: v1", "topic_key": topic}))["node_id"]
    await sync(a, b)
    # both offline: each edits the same memory (topic_key upsert); b edits last
    assert (await a.store.memories.save({"content": "deploy target: v2 from a",
                                "topic_key": topic}))["node_id"] == mid
    assert (await b.store.memories.save({"content": "deploy target: v3 from b",
                                "topic_key": topic}))["node_id"] == mid
    only_a = await a.store.memories.save({"content": "written offline on a"})
    await sync(a, b, a)
    for lap in (a, b):
        assert (await lap.store.memories.get(mid))["content"] == "deploy target: v3 from b"
        assert (await lap.store.memories.get(only_a["node_id"]))["content"] == "written offline on a"
    assert await live_contents(a.store) == await live_contents(b.store)
    assert (await hub_contents(pg_hub))[mid][0] == "deploy target: v3 from b"


async def test_no_echo_idle_passes_change_nothing(
        pg_hub: PgHub, laptops: tuple[Laptop, Laptop]) -> None:
    a, b = laptops
    await a.store.memories.save({"content": "x: the release checklist"})
    await sync(a)
    first = await b.sync()
    assert first.ok and first.pulled_nodes == 1
    before = await hub_contents(pg_hub)
    async with pg_hub.store._connection() as conn:
        marks = await conn.fetchval("SELECT count(*) FROM feed_tx")
    for _ in range(3):
        for lap in (a, b):
            report = await lap.sync()
            assert report.ok, report.error
            assert (report.pulled_nodes, report.pushed_nodes, report.push_requests) == (0, 0, 0)
            assert report.requests == 1, report
    assert await hub_contents(pg_hub) == before
    async with pg_hub.store._connection() as conn:
        assert await conn.fetchval("SELECT count(*) FROM feed_tx") == marks


async def test_a_wiped_database_is_detected_and_refilled_by_the_laptops(
        pg_hub: PgHub, laptops: tuple[Laptop, Laptop], pg_dsn: str) -> None:
    a, b = laptops
    ids = [(await a.store.memories.save({"content": f"memory {i} kept on the laptops"}))["node_id"]
           for i in range(5)]
    await sync(a, b)
    old_id = pg_hub.store.store_id
    port = int(pg_hub.url.rsplit(":", 1)[1])
    await pg_hub.close()
    conn = await asyncpg.connect(pg_dsn)
    try:  # the operator recreates the database from scratch
        await conn.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
    finally:
        await conn.close()
    fresh = await start_pg_hub(pg_dsn, port, None)
    try:
        assert fresh.store.store_id != old_id
        for lap in (a, b):  # the operator hands out tokens of the new database
            await lap.engine.client.set_token(fresh.token)
        report = await a.sync()
        assert report.ok, report.error
        assert report.reset is not None, report
        await sync(b, a, b)
        assert set(await hub_contents(fresh)) == set(ids)
        assert await live_contents(a.store) == await live_contents(b.store)
    finally:
        await fresh.close()

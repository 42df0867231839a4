"""Against a plane that behaves like Kyma as it is: rows stored verbatim minus every column it
does not know (so syncd's `origin` and `deleted` extensions are dropped), latest-wins by the
row's own `updated_at` string, `changes` filtered on it. A small real server, not a mock.

What must still hold: laptops converge, and a delete — whose `deleted` flag the plane drops —
reaches the other laptop as Kyma's own soft delete (archived and invalidated), so it is hidden
there instead of coming back to life."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp import web

from local_store import HashingEmbedder, Store
from local_store.embed_minilm import EmbedderUnavailable, FastEmbedBGE
from protocol.rows import EDGE_COLUMNS, NODE_EXPORT_COLUMNS
from syncd.sync.engine import SyncEngine, SyncOptions
from syncd.sync.plane import PlaneClient
from tests.sync.harness import start_laptop, two_laptops


class KymaLike:
    """Append-only tables, latest per id by the string `updated_at`, as contract §1 and §4."""

    def __init__(self) -> None:
        self.nodes: list[dict[str, Any]] = []
        self.edges: list[dict[str, Any]] = []
        self.max_content: int | None = None  # a limit it refuses the whole import over
        self.imports = 0
        self.raw_changes: bytes | None = None  # a body to answer ``changes`` with, verbatim

    def latest(self, since: str = "") -> list[dict[str, Any]]:
        best: dict[str, dict[str, Any]] = {}
        for row in self.nodes:
            held = best.get(row["id"])
            if held is None or row.get("updated_at", "") >= held.get("updated_at", ""):
                best[row["id"]] = row
        return [r for r in best.values() if r.get("updated_at", "") > since]

    async def import_(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        self.imports += 1
        nodes = body.get("memory_nodes", [])
        limit = self.max_content
        if limit is not None and any(len(n.get("content") or "") > limit for n in nodes):
            return web.json_response({"applied_nodes": 0, "applied_edges": 0,  # names no row
                                      "errors": [f"nodes: content exceeds {limit} characters"]})
        if any(len(n.get("embedding") or []) != 384 for n in nodes):
            return web.json_response({"applied_nodes": 0, "applied_edges": 0,
                                      "errors": ["nodes: expected array of 384 floats"]})
        self.nodes += [{k: v for k, v in n.items() if k in NODE_EXPORT_COLUMNS} for n in nodes]
        edges = body.get("memory_edges", [])
        self.edges += [{k: v for k, v in e.items() if k in EDGE_COLUMNS} for e in edges]
        return web.json_response({"applied_nodes": len(nodes), "applied_edges": len(edges),
                                  "errors": []})

    def semantic_leg(self, query: list[float], limit: int = 50) -> list[str]:
        """The ids the plane's semantic leg ranks first for a query vector, as its SQL does
        (``recall_sql``): rows its recall can return (not archived, not invalidated), ordered
        by ``0.7·(1 - distance) + 0.3·importance DESC`` with no NULL filter and no ``NULLS
        LAST``. Its ``cosine()`` of a zero vector is NULL, and DataFusion, like PostgreSQL,
        sorts NULL as the largest value: first under DESC."""
        q = np.asarray(query, dtype=np.float64)

        def key(row: dict[str, Any]) -> tuple[int, float]:
            v = np.asarray(row.get("embedding") or [0.0] * len(q), dtype=np.float64)
            norms = float(np.linalg.norm(v) * np.linalg.norm(q))
            if norms == 0.0:
                return (0, 0.0)  # NULL: before every number
            blend = 0.7 * float(v @ q) / norms + 0.3 * float(row.get("importance") or 0.0)
            return (1, -blend)

        live = [r for r in self.latest() if r.get("status") != "archived"
                and not r.get("invalid_at")]
        return [r["id"] for r in sorted(live, key=key)[:limit]]

    async def changes(self, request: web.Request) -> web.Response:
        if self.raw_changes is not None:
            return web.Response(body=self.raw_changes, content_type="application/json")
        since = request.query.get("since", "").strip() or "1970-01-01T00:00:00Z"
        nodes = self.latest(since)
        edges = [e for e in self.edges if e.get("created_at", "") > since]
        until = datetime.now(UTC).isoformat()  # after the queries, as the plane does
        return web.json_response({"since": since, "until": until, "memory_nodes": nodes,
                                  "memory_edges": edges})

    async def export(self, request: web.Request) -> web.Response:
        return web.json_response({"memory_nodes": self.latest(), "memory_edges": self.edges})

    async def settings(self, request: web.Request) -> web.Response:
        return web.json_response({"default_limit": 8})  # no model named: the config's is used

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/agent/memory/import", self.import_)
        app.router.add_get("/v1/agent/memory/changes", self.changes)
        app.router.add_get("/v1/agent/memory/export", self.export)
        app.router.add_get("/v1/agent/memory/settings", self.settings)


@pytest.fixture
async def kyma() -> AsyncIterator[tuple[KymaLike, str]]:
    plane = KymaLike()
    app = web.Application()
    plane.add_routes(app)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield plane, f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def test_deletes_reach_the_other_laptop_through_a_plane_that_drops_extensions(
        kyma: tuple[KymaLike, str], tmp_path: Path) -> None:
    """A soft and a hard delete arrive as Kyma's soft delete; nothing comes back to life."""
    plane, url = kyma
    async with two_laptops(tmp_path, url, "token") as (a, b):
        kept = (await a.store.memories.save({"content": "the staging cluster is in eu-west-1"}))["node_id"]
        soft = (await a.store.memories.save({"content": "deploys freeze on Fridays"}))["node_id"]
        hard = (await a.store.memories.save({"content": "the old vault password rotates weekly"}))[
            "node_id"]
        for laptop in (a, b):
            assert (await laptop.sync()).ok
        assert {r["id"] for r in (await b.store.memories.list_memories())["rows"]} == {kept, soft, hard}
        await a.store.memories.delete(soft)
        await a.store.memories.delete(hard, hard=True)
        for laptop in (a, b):
            report = await laptop.sync()
            assert report.ok, report.error
        assert all("deleted" not in n and "origin" not in n for n in plane.nodes)
        assert {r["id"] for r in (await b.store.memories.list_memories())["rows"]} == {kept}
        for mid in (soft, hard):
            row = await b.store.memories.get(mid)
            assert row["status"] == "archived" and row["invalid_at"] is not None
        assert (await b.store.memories.get(hard))["content"] == ""
        hits = await b.store.recall.query({"query": "deploys freeze Fridays vault password"})
        assert {m.id for m in hits.memories} <= {kept}
        for laptop in (a, b):  # quiet passes change nothing on either side
            assert (await laptop.sync()).ok
        assert {r["id"] for r in (await a.store.memories.list_memories())["rows"]} == {kept}
        assert {r["id"] for r in (await b.store.memories.list_memories())["rows"]} == {kept}


async def test_an_edge_the_plane_holds_several_rows_of_is_compared_by_its_latest(
        kyma: tuple[KymaLike, str], tmp_path: Path) -> None:
    """Kyma appends a row per version of an edge and exports them all, in no promised order.
    Anti-entropy must compare the latest: taking whichever came last (here the oldest) made
    every pass re-push the edge, and the plane grew a row each time."""
    plane, url = kyma
    a = await start_laptop("a", tmp_path / "a", url, "token", anti_entropy_secs=0)
    try:
        memory = (await a.store.memories.save({"content": "the staging cluster is in eu-west-1"}))[
            "node_id"]
        await a.store.graph.ingest_entity({"name": "staging", "kind": "service",
                                     "links": [{"target_node_id": memory}]})
        assert (await a.sync()).ok
        await a.store.memories.delete(memory)  # a new version of its edge: a tombstone
        assert (await a.sync()).ok
        assert len(plane.edges) == 2  # two rows of one edge
        plane.edges.reverse()  # the export lists the newest first
        rows = len(plane.edges)
        for _ in range(3):
            report = await a.sync()
            assert report.ok and report.anti_entropy and report.requeued == 0, report
        assert len(plane.edges) == rows
    finally:
        await a.close()


async def test_one_row_the_plane_refuses_naming_none_waits_alone(
        kyma: tuple[KymaLike, str], tmp_path: Path) -> None:
    """The plane's import is all-or-nothing per table and names no row: one row it refuses
    (here, content over its limit) held back the whole batch of 500, pass after pass. Now the
    batch is halved until the row is alone: the 499 others are pushed in the same pass, and
    only that row waits, named in the pass report and in status."""
    plane, url = kyma
    plane.max_content = 10_000
    a = await start_laptop("a", tmp_path / "a", url, "token", push_batch_bytes=64 << 20)
    try:
        saved = await a.store.memories.save_many([{"content": f"note {i} on the release train"}
                                         for i in range(250)])
        bad = (await a.store.memories.save({"content": "a pasted log " + "x" * 20_000}))["node_id"]
        saved_after = await a.store.memories.save_many([{"content": f"later note {i} on the train"}
                                               for i in range(249)])
        report = await a.sync()
        assert report.pushed_nodes == 499 and report.push_refused == [f"node {bad}"], report
        assert 0 < report.push_bisections <= 10 and not report.ok
        assert bad in (report.error or "") and "exceeds 10000" in (report.error or "")
        assert bad in (a.engine.status.last_error or "")
        assert len({n["id"] for n in plane.nodes}) == 499
        assert {f"memory:{i}" for i in (*saved["ids"], *saved_after["ids"])} == {
            n["id"] for n in plane.nodes}
        imports = plane.imports
        report = await a.sync()  # the next pass tries that row alone, once
        assert plane.imports == imports + 1 and report.push_refused == [f"node {bad}"], report
        plane.max_content = None  # the plane's limit is lifted: the row goes
        report = await a.sync()
        assert report.ok and report.pushed_nodes == 1, report
        assert await a.store.replication.outbox_depth() == 0
    finally:
        await a.close()


PLANE_MODEL = "plane-model-384"  # the plane's embedder; the laptops embed with hashing-384


def plane_embedder() -> HashingEmbedder:
    return HashingEmbedder(model_id=PLANE_MODEL)


async def laptop_on_another_model(data_dir: Path, url: str,
                                  factory: Any = None) -> tuple[Store, SyncEngine]:
    store = await Store.open(data_dir, embedder=HashingEmbedder())
    engine = SyncEngine(store, PlaneClient(url, "token"), SyncOptions(plane_model=PLANE_MODEL),
                        plane_embedder=factory)
    await engine.start()
    return store, engine


def query_vector(text: str) -> list[float]:
    return [float(x) for x in plane_embedder().embed([text])[0]]


async def test_the_fake_plane_ranks_a_zero_vector_first_as_kyma_does(
        kyma: tuple[KymaLike, str]) -> None:
    """Why no zero vector may reach it: whatever the query, a row without a vector takes the
    top of the plane's semantic leg."""
    plane, _ = kyma
    vec = query_vector("rotate the signing keys every quarter")
    plane.nodes += [
        {"id": "memory:earned", "content": "rotate the signing keys every quarter",
         "embedding": vec, "importance": 0.5, "status": "active", "updated_at": "1"},
        {"id": "memory:zeros", "content": "lunch is at noon", "embedding": [0.0] * 384,
         "importance": 0.1, "status": "active", "updated_at": "1"}]
    assert plane.semantic_leg(vec) == ["memory:zeros", "memory:earned"]


async def test_memories_wait_for_a_plane_model_vector_and_never_take_unearned_ranks(
        kyma: tuple[KymaLike, str], tmp_path: Path) -> None:
    """Local model != the plane's, and no embedder of the plane's model here: a memory the
    plane could rank stays queued, counted and explained in the report and in status, instead
    of going with zeros (the top of every query on the plane) or a local-model vector (ranks
    by chance); an archived one, which the plane's recall never returns, goes."""
    plane, url = kyma
    plane.nodes.append({"id": "memory:theirs", "content": "the staging cluster is eu-west-1",
                        "embedding": query_vector("the staging cluster is eu-west-1"),
                        "importance": 0.5, "status": "active", "updated_at": "1"})
    store, engine = await laptop_on_another_model(tmp_path / "a", url)
    try:
        mine = [(await store.memories.save({"content": f"local note {i} about lunch"}))["node_id"]
                for i in range(3)]
        gone = (await store.memories.save({"content": "an old note"}))["node_id"]
        await store.memories.update_status(gone, "archived")
        report = await engine.run_pass("manual")
        assert not report.ok and report.error_kind == "held_back", report
        assert report.push_awaiting_vector == 3 and report.pushed_nodes == 1, report
        assert PLANE_MODEL in (report.error or "") and "embedding.model" in (report.error or "")
        assert engine.status.awaiting_vector == 3
        assert {n["id"] for n in plane.nodes} == {"memory:theirs", gone}
        assert await store.replication.outbox_depth() == 3
        for text in ("local note about lunch", "staging cluster", "anything at all"):
            assert plane.semantic_leg(query_vector(text))[0] == "memory:theirs"
        assert not set(mine) & {n["id"] for n in plane.nodes}
    finally:
        await engine.close()
        await store.close()


async def test_a_laptop_with_the_plane_model_pushes_vectors_the_plane_ranks_by_merit(
        kyma: tuple[KymaLike, str], tmp_path: Path) -> None:
    plane, url = kyma
    store, engine = await laptop_on_another_model(tmp_path / "a", url, plane_embedder)
    try:
        texts = ["rotate the signing keys every quarter", "lunch is at noon on fridays",
                 "the billing database is postgres fifteen"]
        ids = [(await store.memories.save({"content": t}))["node_id"] for t in texts]
        report = await engine.run_pass("manual")
        assert report.ok and report.pushed_nodes == 3 and not report.push_awaiting_vector
        by_id = {n["id"]: n for n in plane.nodes}
        for mid, text in zip(ids, texts, strict=True):
            assert by_id[mid]["embedding"] == pytest.approx(query_vector(text), abs=1e-6)
        for mid, text in zip(ids, texts, strict=True):
            assert plane.semantic_leg(query_vector(text))[0] == mid
        # the laptop still ranks with its own model's vectors
        assert (await store.recall.query({"query": texts[2]})).memories[0].id == ids[2]
    finally:
        await engine.close()
        await store.close()


async def test_missing_plane_model_files_hold_the_rows_with_an_error_that_names_them(
        kyma: tuple[KymaLike, str], tmp_path: Path) -> None:
    """bge-small through fastembed, its files absent (syncd never downloads): a clear error,
    and the rule's fallback — the rows wait."""
    plane, url = kyma
    empty = tmp_path / "models"
    empty.mkdir()
    with pytest.raises(EmbedderUnavailable, match=r"model_optimized\.onnx"):
        await asyncio.to_thread(FastEmbedBGE, empty)
    store = await Store.open(tmp_path / "a", embedder=HashingEmbedder())
    engine = SyncEngine(store, PlaneClient(url, "token"),
                        SyncOptions(plane_model="bge-small-en-v1.5"),
                        plane_embedder=lambda: FastEmbedBGE(empty))
    await engine.start()
    try:
        await store.memories.save({"content": "a note for the plane"})
        report = await engine.run_pass("manual")
        assert report.push_awaiting_vector == 1 and not plane.nodes
        assert "bge-small-en-v1.5 is unavailable" in (report.error or "")
        assert str(empty) in (report.error or "")
    finally:
        await engine.close()
        await store.close()


async def test_a_private_memory_stays_private_through_a_plane_that_drops_its_space(
        kyma: tuple[KymaLike, str], tmp_path: Path) -> None:
    """Kyma's changes and export carry no `space`: a `private:<agent>` memory pushed there
    reaches the other laptop with none, visible to every agent. By default ("auto") it stays on
    the laptop that holds it; the other memories go as always."""
    plane, url = kyma
    async with two_laptops(tmp_path, url, "token") as (a, b):
        secret = (await a.store.memories.save({"content": "alice's draft of the offer letter",
                                      "space": "private:alice"}))["node_id"]
        shared = (await a.store.memories.save({"content": "the team offsite is in May"}))["node_id"]
        for laptop in (a, b):
            report = await laptop.sync()
            assert report.ok, report.error
        assert {n["id"] for n in plane.nodes} == {shared}
        first = await a.sync()
        assert first.ok and await a.store.replication.outbox_depth() == 0
        assert {r["id"] for r in (await b.store.memories.list_memories())["rows"]} == {shared}
        assert (await a.store.memories.get(secret))["space"] == "private:alice"
        # an edit of the private memory stays local too; a delete goes, scrubbed
        await a.store.memories.update_importance(secret, 0.9)
        report = await a.sync()
        assert report.ok and report.push_kept_private == 1 and secret not in {
            n["id"] for n in plane.nodes}
        await a.store.memories.delete(secret, hard=True)
        assert (await a.sync()).ok
        gone = [n for n in plane.nodes if n["id"] == secret]
        assert gone and all(n["content"] == "" for n in gone)


async def test_a_pulled_row_without_the_columns_kyma_drops_keeps_the_replicas_values(
        kyma: tuple[KymaLike, str], tmp_path: Path) -> None:
    """With `private_memories = "push"` the user chose to send private memories anyway; a
    version pulled back from the plane (an echo, or another laptop's edit) has no `space`,
    `memory_class` or `writer_agent_id`, and must not erase the values the laptop holds."""
    plane, url = kyma
    async with two_laptops(tmp_path, url, "token") as (a, b):
        for laptop in (a, b):
            laptop.engine.options.private_memories = "push"
        mine = (await a.store.memories.save({"content": "alice's notes on the reorg",
                                    "space": "private:alice"}))["node_id"]
        for laptop in (a, b):
            assert (await laptop.sync()).ok
        assert all("space" not in n for n in plane.nodes)
        assert (await a.store.memories.get(mine))["space"] == "private:alice"
        await b.store.memories.update_importance(mine, 0.95)  # B holds it with no space: the plane's
        assert (await b.sync()).ok
        report = await a.sync()
        assert report.ok and report.pulled_nodes >= 1
        held = await a.store.memories.get(mine)
        assert held["importance"] == pytest.approx(0.95) and held["space"] == "private:alice"


async def spooling_laptop(data_dir: Path, url: str) -> tuple[Store, SyncEngine]:
    """A laptop whose client keeps any page body over 64 KiB on disk (``spool.py``)."""
    store = await Store.open(data_dir, embedder=HashingEmbedder())
    engine = SyncEngine(store, PlaneClient(url, "token", spool_from=64 << 10),
                        SyncOptions(plane_model=HashingEmbedder().model_id))
    await engine.start()
    return store, engine


async def test_a_whole_feed_in_one_body_is_applied_from_disk_a_batch_at_a_time(
        kyma: tuple[KymaLike, str], tmp_path: Path) -> None:
    """Kyma answers `changes` and `export` with everything at once: such a body is spooled
    and applied in batches (SPOOL_ROWS), with the cursor stored after its last batch."""
    _, url = kyma
    a = await start_laptop("a", tmp_path / "a", url, "token")
    store, engine = await spooling_laptop(tmp_path / "b", url)
    try:
        saved = {"ids": []}
        for start in range(0, 2500, 1000):  # save_many takes at most 1000
            saved["ids"] += (await a.store.memories.save_many([
                {"content": f"note {i} on the release train"}
                for i in range(start, min(start + 1000, 2500))]))["ids"]
        first = (await a.store.memories.save({"content": "the first of a linked pair"}))["node_id"]
        await a.store.graph.link({"memory_id": first, "target_node_id": f"memory:{saved['ids'][0]}",
                            "relationship_type": "RELATES_TO"})
        assert (await a.sync()).ok
        report = await engine.run_pass("manual")
        assert report.ok and report.pulled_nodes == 2501 and report.pulled_edges == 1, report
        assert engine.client.spooled >= 1
        assert (await store.maintenance.stats())["memories"] == 2501
        # no room for the 2,501 vectors the spool counted: the index was dropped for the pull,
        # and the first recall rebuilds it from the store, with room for a quarter more
        assert store.index_stale and await store.maintenance.indexed_vectors() == 2501
        await store.recall.query({"query": "release train"})
        assert not store.index_stale and len(store.index) == 2501
        assert store.index.capacity == 2501 + 2501 // 4
        assert (await store.replication.sync_state())["cursor"] is not None
        engine.options.anti_entropy_secs = 0  # the next pass walks the export, spooled too
        spooled = engine.client.spooled
        report = await engine.run_pass("manual")
        assert report.ok and report.anti_entropy and engine.client.spooled >= spooled + 2
        assert await store.replication.outbox_depth() == 0
        # the feed and the export came again, every row held: the index was neither dropped
        # nor grown for them
        assert not store.index_stale and store.index.capacity == 2501 + 2501 // 4
    finally:
        await engine.close()
        await store.close()
        await a.close()


async def test_a_spooled_body_costs_only_its_bad_rows_and_a_broken_one_applies_nothing(
        kyma: tuple[KymaLike, str], tmp_path: Path) -> None:
    plane, url = kyma
    rows = [{"id": f"memory:{i:05d}", "labels": "Memory", "realm": "default",
             "memory_type": "fact", "content": f"row {i} " + "x" * 40, "tags": "",
             "importance": 0.5, "status": "active", "embedding": [0.0] * 384,
             "created_at": "2026-11-01T00:00:00Z", "updated_at": "2026-11-01T00:00:00Z"}
            for i in range(1500)]
    rows[700]["importance"] = "very"  # not a number: this row alone is unreadable
    body = {"since": "1970-01-01T00:00:00Z", "until": "2026-11-02T00:00:00+00:00",
            "memory_nodes": rows, "memory_edges": []}
    plane.raw_changes = json.dumps(body).encode()
    store, engine = await spooling_laptop(tmp_path / "b", url)
    try:
        report = await engine.run_pass("manual")
        assert engine.client.spooled == 1
        assert report.pulled_nodes == 1499 and report.pull_problems == 1, report
        assert "cursor" not in await store.replication.sync_state()  # R5: the bad row holds it
        truncated = json.dumps({**body, "until": "2026-11-03T00:00:00+00:00"}).encode()
        plane.raw_changes = truncated[: len(truncated) // 2]
        before = (await store.maintenance.stats())["memories"]
        report = await engine.run_pass("manual")
        assert not report.ok and "malformed response" in (report.error or ""), report
        assert report.pulled_nodes == 0 and (await store.maintenance.stats())["memories"] == before
    finally:
        await engine.close()
        await store.close()

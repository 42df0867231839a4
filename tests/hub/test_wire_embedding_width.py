"""What the hub takes and serves must pass a Kyma client's checks (contract §4.4, §9, §10), on
both stores (SQLite and PostgreSQL): every node row carries an embedding of the hub model's
width, and an embedding of another width is refused. A Kyma client appends pulled rows with
``append_node_rows``, which fails the whole batch — every pass, for good — on one row whose
embedding is missing or of another width."""

from __future__ import annotations

from pathlib import Path

import msgspec

from local_store import HashingEmbedder, Store
from protocol.rows import NodeRow
from syncd.hub.store import HubStore
from tests.hub.test_conformance import MODEL, node, stamp
from tests.hub.test_hub_http import Served, call, served  # noqa: F401 (fixture)
from tests.store_probe import reconcile

DIM = HashingEmbedder().dim
ZEROS = [0.0] * DIM


def short(mid: str, n: int = 1) -> NodeRow:
    """A live row whose embedding is 3 floats wide (exact in float32)."""
    return NodeRow(id=mid, content="hello world", realm="work", memory_type="fact",
                   importance=0.5, status="active", created_at=stamp(0), updated_at=stamp(n),
                   embedding=[0.5, 0.25, 0.125])


def sent(mid: str, content: str, n: int = 1, **extra: object) -> NodeRow:
    """``node``'s row as it goes over HTTP (its vector as plain floats)."""
    row = node(mid, content, n, **extra)  # type: ignore[arg-type]
    return msgspec.structs.replace(row, embedding=[float(x) for x in row.embedding or []])


# ---------------------------------------------------------------------- embedding width

async def test_an_embedding_of_another_width_is_refused_naming_it(
        served: Served) -> None:  # noqa: F811
    """A 3-float vector into a 384-d hub (its own model) is a refused row, not stored: before,
    ``applied_nodes: 1``, and the hub served that vector back in ``changes`` and ``export``."""
    status, result = await call(served, "POST", "/v1/agent/memory/import", {
        "memory_nodes": [short("memory:short"), sent("memory:fine", "fine", 1)]}, served.write)
    assert status == 200, result
    assert result["applied_nodes"] == 1
    assert [(e["index"], e["field"], e["message"]) for e in result["row_errors"]] == [
        (0, "embedding", f"must be an array of {DIM} numbers, got 3")]
    assert any("embedding" in e for e in result["errors"])
    _, changes = await call(served, "GET", "/v1/agent/memory/changes")
    _, export = await call(served, "GET", "/v1/agent/memory/export")
    for body in (changes, export):
        assert [n["id"] for n in body["memory_nodes"]] == ["memory:fine"]
        assert len(body["memory_nodes"][0]["embedding"]) == DIM


async def test_a_tombstones_vector_of_another_width_is_refused_too(
        hub_store: HubStore) -> None:
    gone = NodeRow(id="memory:g", content="", updated_at=stamp(1), deleted=True,
                   status="archived", embedding=[0.5, 0.25, 0.125])
    result = await hub_store.apply([gone], [], model=MODEL)
    assert [(p.index, p.field) for p in result.problems] == [(0, "embedding")]
    assert (await hub_store.export())[0] == []


async def test_zeros_of_another_width_are_no_vector(hub_store: HubStore) -> None:
    """Zeros say "no vector" whatever their width, as a missing embedding does: nothing is
    stored, and the row is served with zeros of the hub's width. (A laptop on another model
    pushes zeros as wide as it assumes the plane's model is.)"""
    zeros = NodeRow(id="memory:z", content="z", updated_at=stamp(1), embedding=[0.0] * 5)
    result = await hub_store.apply([zeros], [], model=MODEL)
    assert (result.applied_nodes, result.problems) == (1, [])
    nodes, _ = await hub_store.export()
    assert [(n.id, n.embedding) for n in nodes] == [("memory:z", ZEROS)]


async def test_vectors_of_another_model_keep_their_width(hub_store: HubStore) -> None:
    """Only the store's own model has a known width: rows of another (a laptop pulling the
    plane's vectors) keep any width, as before."""
    result = await hub_store.apply([short("memory:other")], [], model="plane-model")
    assert (result.applied_nodes, result.problems) == (1, [])


async def test_a_laptop_refuses_a_vector_of_its_own_model_of_another_width(
        tmp_path: Path) -> None:
    """The rule is the store's (``Store.apply``), so a laptop's import holds it too."""
    store = await Store.open(tmp_path / "a", embedder=HashingEmbedder())
    try:
        own = await store.replication.apply([short("memory:a")], [], model=MODEL)
        assert [(p.field, p.message) for p in own.problems] == [
            ("embedding", f"must be an array of {DIM} numbers, got 3")]
        foreign = await store.replication.apply([short("memory:b")], [], model="plane-model")
        assert (foreign.applied_nodes, foreign.problems) == (1, [])
        # A pull (from a plane on the laptop's own model) holds it too, and keeps its cursor.
        pulled = await store.replication.pull([short("memory:c")], [], model=MODEL,
                                  state={"cursor": "after-c"})
        assert [p.field for p in pulled.problems] == ["embedding"]
        assert "cursor" not in await store.replication.sync_state()
        reconciled = await reconcile(store, [short("memory:d")], [], model=MODEL)
        assert [p.field for p in reconciled.applied.problems] == ["embedding"]
    finally:
        await store.close()


# ---------------------------------------------------------------------- rows without a vector

async def served_rows(hub: HubStore) -> dict[str, list[NodeRow]]:
    """Every way the hub serves node rows."""
    fed, _, _, _ = await hub.feed(None)
    paged, _, _, _ = await hub.export_page("0", limit=100)
    changed, _ = await hub.changes_since(None, edge_version="created_at")
    async with hub.export_snapshot(page_rows=2) as snapshot:
        streamed = [n async for page in snapshot.node_pages() for n in page]
    return {"feed": fed, "export": (await hub.export())[0], "export_page": paged,
            "changes_since": changed, "export_snapshot": streamed}


async def test_every_node_served_carries_an_embedding_of_the_hub_width(
        hub_store: HubStore) -> None:
    """A tombstone, and a live row the hub has no vector for yet, carry zeros (the plane's "no
    vector"); a row with a vector carries it. Before, the first two came without ``embedding``."""
    await hub_store.apply([node("memory:v", "vector row", 1),
                           node("memory:n", "not embedded yet", 1, vector=False),
                           node("memory:t", "doomed", 1)], [], model=MODEL)
    await hub_store.apply([node("memory:t", "doomed", 2, deleted=True)], [],
                          model=MODEL)
    expected = HashingEmbedder().embed(["vector row"])[0]
    for way, nodes in (await served_rows(hub_store)).items():
        by_id = {n.id: n.embedding for n in nodes}
        assert set(by_id) == {"memory:v", "memory:n", "memory:t"}, way
        assert by_id["memory:n"] == ZEROS and by_id["memory:t"] == ZEROS, way
        vector = by_id["memory:v"]
        assert vector is not None and len(vector) == DIM, way
        assert max(abs(a - float(b)) for a, b in zip(vector, expected, strict=True)) < 1e-6


async def test_a_deleted_memory_reaches_a_kyma_client_with_a_full_width_embedding(
        served: Served) -> None:  # noqa: F811
    """Over HTTP, as a laptop pushes a delete (the ``deleted`` extension): the row
    served by ``changes`` and ``export`` has an embedding a Kyma client accepts."""
    for version in (sent("memory:a", "hello world", 1),
                    sent("memory:a", "hello world", 2, deleted=True)):
        status, result = await call(served, "POST", "/v1/agent/memory/import",
                                    {"memory_nodes": [version]}, served.write)
        assert status == 200 and result["applied_nodes"] == 1, result
    for path in ("changes", "export", "export?limit=10"):
        status, body = await call(served, "GET", f"/v1/agent/memory/{path}")
        assert status == 200, body
        assert [(n["id"], n["embedding"]) for n in body["memory_nodes"]] == [
            ("memory:a", ZEROS)], path


async def test_a_laptop_export_carries_zeros_for_a_memory_without_a_vector(
        tmp_path: Path) -> None:
    """``syncd export`` writes the plane's JSON: a Kyma import of it needs an embedding on
    every row, so a memory with no vector of the laptop's model carries zeros of its width.
    A vector asked for by another model's name (width unknown here) is still left out."""
    store = await Store.open(tmp_path / "a", embedder=HashingEmbedder())
    try:
        # pulled with the plane's vector only: no vector of the laptop's model yet
        await store.replication.apply([short("memory:pulled")], [], model="plane-model")
        saved = (await store.memories.save({"content": "embedded on save"}))["node_id"]
        nodes, _ = await store.feed.read()
        by_id = {n.id: n.embedding for n in nodes}
        assert by_id["memory:pulled"] == ZEROS
        assert by_id[saved] is not None and len(by_id[saved]) == DIM and any(by_id[saved])
        foreign, _ = await store.feed.read(model="plane-model")
        assert {n.id: n.embedding for n in foreign} == {"memory:pulled": [0.5, 0.25, 0.125],
                                                        saved: None}
    finally:
        await store.close()

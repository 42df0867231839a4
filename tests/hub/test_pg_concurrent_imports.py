"""The PostgreSQL hub store under concurrent imports (several hub processes on one database:
no deadlock, no stale vector), and where it must answer as the SQLite store does (what an
import counts and reports, how many rows an export page holds)."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import asyncpg
import numpy as np
import pytest

from local_store import HashingEmbedder, ValidationError
from protocol.rows import EdgeRow, NodeRow, edge_id
from protocol.timestamp import format_ns, parse_ns
from syncd.hub.pg import PgHubStore
from syncd.hub.pg import imports as pg_store
from syncd.hub.store import HubStore, StoreUnavailableError

EMB = HashingEmbedder()
MODEL = EMB.model_id
BASE = parse_ns("2026-11-01T10:00:00Z")


def stamp(n: int) -> str:
    return format_ns(BASE + n * 1_000_000_000)


def node(mid: str, content: str, n: int = 1, *, origin: str = "laptop-a", vector: bool = True,
         embedding: list[float] | None = None) -> NodeRow:
    if vector and embedding is None:
        embedding = list(EMB.embed([content])[0])
    return NodeRow(id=mid, content=content, updated_at=stamp(n), origin=origin,
                   embedding=embedding)


def edge(src: str, dst: str, n: int = 1, *, origin: str = "laptop-a") -> EdgeRow:
    return EdgeRow(id=edge_id(src, dst, "relates_to"), src=src, dst=dst, type="relates_to",
                   created_at=stamp(n), origin=origin)


async def open_store(dsn: str) -> PgHubStore:
    return await PgHubStore.open(dsn, embedder=EMB, follow=False)


# ---------------------------------------------------------------------- concurrent imports

async def test_imports_of_the_same_ids_in_other_orders_do_not_deadlock(pg_dsn: str) -> None:
    """Two processes each import the same 3000 ids (and edges between them), one in id order,
    the other reversed: both land (rows are locked in id order whatever the batch's)."""
    one, two = await open_store(pg_dsn), await open_store(pg_dsn)
    ids = [f"memory:{i:05d}" for i in range(3000)]
    try:
        for attempt in range(5):
            a_nodes, a_edges = _chain(ids, 10 + attempt, f"laptop-a{attempt}")
            b_nodes, b_edges = _chain(ids, 10 + attempt, f"laptop-b{attempt}")
            await asyncio.gather(
                one.apply(a_nodes, a_edges, model=MODEL),
                two.apply(b_nodes[::-1], b_edges[::-1], model=MODEL))
        nodes, edges = await one.export()
        assert {n.origin for n in nodes} == {"laptop-b4"}  # the larger version key, everywhere
        assert len(nodes) == 3000 and len(edges) == 2999
    finally:
        await one.close()
        await two.close()


def _chain(ids: list[str], n: int, origin: str) -> tuple[list[NodeRow], list[EdgeRow]]:
    return ([node(mid, f"{mid} from {origin}", n, origin=origin, vector=False) for mid in ids],
            [edge(a, b, n, origin=origin) for a, b in itertools.pairwise(ids)])


async def test_a_deadlocked_import_runs_again_and_then_is_an_outage(
        pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL may still abort an import for a deadlock (a third writer between the lock
    and the upsert): it runs again whole; one that keeps failing is a 503, never a 500."""
    store = await open_store(pg_dsn)
    monkeypatch.setattr(pg_store, "RETRY_PAUSE_SECS", 0.0)
    real, calls = store.imports._apply_in, []

    async def aborted(conn: Any, *args: Any) -> Any:
        calls.append(len(calls))
        if len(calls) < failures:
            raise asyncpg.DeadlockDetectedError("deadlock detected")
        return await real(conn, *args)

    try:
        monkeypatch.setattr(store.imports, "_apply_in", aborted)
        failures = pg_store.TX_ATTEMPTS  # the last attempt succeeds
        result = await store.apply([node("memory:a", "kept", 1)], [], model=MODEL)
        assert (result.applied_nodes, len(calls)) == (1, pg_store.TX_ATTEMPTS)
        calls.clear()
        failures = pg_store.TX_ATTEMPTS + 1  # every attempt fails
        with pytest.raises(StoreUnavailableError):
            await store.apply([node("memory:b", "lost", 1)], [], model=MODEL)
        assert len(calls) == pg_store.TX_ATTEMPTS
        nodes, _ = await store.export()
        assert [n.id for n in nodes] == ["memory:a"]
    finally:
        await store.close()


async def test_a_statement_timeout_is_an_outage(pg_dsn: str) -> None:
    """A statement cancelled by ``statement_timeout`` (a row held by a stuck session) is a
    database outage (503 + Retry-After), not a 500."""
    store = await PgHubStore.open(pg_dsn + "?statement_timeout=300", embedder=EMB,
                                  follow=False)
    await store.apply([node("memory:a", "held", 1)], [], model=MODEL)
    holder = await asyncpg.connect(pg_dsn)
    try:
        async with holder.transaction():
            await holder.execute("SELECT 1 FROM memories WHERE id = 'memory:a' FOR UPDATE")
            with pytest.raises(StoreUnavailableError):
                await store.apply([node("memory:a", "waits", 2)], [], model=MODEL)
    finally:
        await holder.close()
        await store.close()


async def _until_committed_or_waiting(dsn: str, committed: asyncio.Event) -> None:
    """Until ``committed`` is set or some session of the database waits for a row lock."""
    watcher = await asyncpg.connect(dsn)
    try:
        async with asyncio.timeout(30):
            while not committed.is_set():
                if await watcher.fetchval(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                        "current_database() AND wait_event_type = 'Lock'"):
                    return
                await asyncio.sleep(0.01)
    finally:
        await watcher.close()


C0, C1 = "the deploy script lives in ops", "completely different text about cats"


@pytest.mark.parametrize("interleave", [True, False])
async def test_a_concurrent_content_change_never_leaves_the_other_texts_vector(
        pg_dsn: str, interleave: bool) -> None:
    """B reads memory:x (text C0) and is about to write C0 again, newer, without a vector;
    meanwhile A tries to write C1 with C1's vector. B wins: its row must not keep C1's
    vector (nor any vector of another text). Before the fix A committed between B's read
    and B's write, and B kept A's vector because its content matched what B had read."""
    a, b = await open_store(pg_dsn), await open_store(pg_dsn)
    try:
        await a.apply([node("memory:x", C0, 1, origin="laptop-a")], [], model=MODEL)
        b_read, a_done = asyncio.Event(), asyncio.Event()
        real = b.imports._write_nodes

        async def after_a(*args: Any, **kw: Any) -> set[str]:
            b_read.set()
            await _until_committed_or_waiting(pg_dsn, a_done)
            return await real(*args, **kw)

        async def run_a() -> None:
            await b_read.wait()
            await a.apply([node("memory:x", C1, 2, origin="laptop-a")], [], model=MODEL)
            a_done.set()

        if interleave:
            b.imports._write_nodes = after_a  # type: ignore[method-assign]
            result_b, _ = await asyncio.gather(
                b.apply([node("memory:x", C0, 3, origin="laptop-b", vector=False)], [],
                        model=MODEL), run_a())
        else:
            await a.apply([node("memory:x", C1, 2, origin="laptop-a")], [], model=MODEL)
            result_b = await b.apply([node("memory:x", C0, 3, origin="laptop-b", vector=False)],
                                     [], model=MODEL)
        assert result_b.applied_nodes == 1
        await b.reembed_missing()
        nodes, _ = await b.export()
        assert nodes[0].content == C0
        got = np.asarray(nodes[0].embedding, dtype=np.float32)
        assert np.allclose(got, EMB.embed([C0])[0], atol=1e-6), "C0 served with another vector"
    finally:
        await a.close()
        await b.close()


# ---------------------------------------------------------------------- parity with SQLite

async def test_an_older_version_with_a_wrong_width_is_skipped_not_reported(
        hub_store: HubStore) -> None:
    await hub_store.apply([node("memory:a", "new text", 5)], [], model=MODEL)
    old = node("memory:a", "old text", 1, embedding=[0.5, 0.5, 0.5])
    result = await hub_store.apply([old], [], model=MODEL)
    assert (result.applied_nodes, result.skipped_nodes, result.problems) == (0, 1, []), (
        hub_store.kind, result)
    newer = node("memory:a", "newer text", 9, embedding=[0.5, 0.5, 0.5])
    result = await hub_store.apply([old, newer], [], model=MODEL)  # a winner is still checked
    assert (result.applied_nodes, result.skipped_nodes) == (0, 1), hub_store.kind
    assert [(p.index, p.field) for p in result.problems] == [(1, "embedding")], hub_store.kind


async def test_two_versions_of_one_id_in_one_batch_count_alike(hub_store: HubStore) -> None:
    """Every row that beats what the store holds at its turn counts as applied (the later
    is kept); a version older than one before it in the batch is skipped."""
    result = await hub_store.apply(
        [node("memory:a", "v1", 1), node("memory:a", "v2", 2), node("memory:a", "v0", 0)],
        [edge("memory:a", "memory:b", 1), edge("memory:a", "memory:b", 2),
         edge("memory:a", "memory:b", 0)], model=MODEL)
    assert (result.applied_nodes, result.skipped_nodes, result.applied_edges,
            result.skipped_edges) == (2, 1, 2, 1), (hub_store.kind, result)
    nodes, edges = await hub_store.export()
    assert [n.content for n in nodes] == ["v2"] and [e.created_at for e in edges] == [stamp(2)]


async def test_an_export_page_holds_at_most_limit_rows(hub_store: HubStore) -> None:
    """One import of 50 rows and 12 edges, read 7 rows a page: every page but the last holds
    7, and every row comes once — also when a row already read is rewritten between pages
    (it leaves the first import and comes again later)."""
    ids = [f"memory:{i:03d}" for i in range(50)]
    await hub_store.apply([node(mid, f"row {mid}", 1) for mid in ids],
                          [edge(ids[i], ids[i + 1]) for i in range(12)], model=MODEL)
    seen: list[str] = []
    sizes: list[int] = []
    cursor, more = "0", True
    while more:
        nodes, edges, cursor, more = await hub_store.export_page(cursor, limit=7)
        sizes.append(len(nodes) + len(edges))
        seen += [n.id or "" for n in nodes] + [e.id or "" for e in edges]
        if len(sizes) == 1:
            await hub_store.apply([node(ids[0], "rewritten", 2)], [], model=MODEL)
        assert len(sizes) < 20
    assert sizes[:-1] == [7] * (len(sizes) - 1) and 1 <= sizes[-1] <= 7, sizes
    assert sorted(seen) == sorted([*ids, ids[0], *(edge(ids[i], ids[i + 1]).id or ""
                                                    for i in range(12))]), hub_store.kind


@pytest.mark.parametrize("cursor", ["5.n6", "5.x6d", "5.n6D", "5.nff", "5.", ".n6d",
                                    f"{2**63}.n6d", "5.n6d.e6d", " 5", "5.n6d "])
async def test_a_bad_row_cursor_names_the_field(hub_store: HubStore, cursor: str) -> None:
    with pytest.raises(ValidationError) as err:
        await hub_store.export_page(cursor, limit=10)
    assert err.value.field == "cursor"


async def test_an_export_cursor_on_an_imports_boundary_is_the_seq_alone(pg_dsn: str) -> None:
    """A page that ends where an import ends gives the seq alone, as every cursor was before
    pages could end inside an import; such a cursor (a client's from then) still reads on."""
    store = await open_store(pg_dsn)
    try:
        for b in range(3):
            await store.apply([node(f"memory:{b}-{i}", f"row {b} {i}", 1) for i in range(3)],
                              [], model=MODEL)
        _, _, cursor, more = await store.export_page("0", limit=3)
        assert cursor.isdigit() and more
        inside = (await store.export_page(cursor, limit=2))[2]
        assert not inside.isdigit()
        nodes, _, _, more = await store.export_page(inside, limit=10)
        assert [n.id for n in nodes] == ["memory:1-2", "memory:2-0", "memory:2-1",
                                         "memory:2-2"] and not more
    finally:
        await store.close()


async def test_export_pages_walk_a_large_import_in_id_order(pg_dsn: str) -> None:
    store = await open_store(pg_dsn)
    try:
        ids = [f"memory:{i:05d}" for i in range(5000)]
        await store.apply([node(mid, f"row {mid}", 1, vector=False) for mid in ids[::-1]], [],
                          model=MODEL)
        cursor, more, seen = "0", True, []
        while more:
            nodes, _, cursor, more = await store.export_page(cursor, limit=500)
            assert len(nodes) == 500
            seen += [n.id for n in nodes]
        assert seen == ids
    finally:
        await store.close()

"""Replication semantics against the real hub, in both cursor modes ("ingest" and "origin", the
Kyma-like one): idempotence (R1), convergence under any delivery order (R2), the overlap window
(R8), deletes against updates (R12), hard deletes (R13), identical stamps (R14), no echo (R15),
bootstrap while the hub takes writes (R17) and edges (R18).

Counts come from the environment so ``make soak`` can raise them: ``SYNCD_PROPERTY_EXAMPLES``
(hypothesis examples, default 30), ``SYNCD_SYNC_PASSES`` (repeated or idle passes, default 5),
``SYNCD_BOOTSTRAP_ROWS`` (rows at the hub before a bootstrap, default 300).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from local_store import HashingEmbedder, NotFoundError, Store
from protocol.rows import EdgeRow, ImportRequest, NodeRow, edge_id, json_encoder
from protocol.timestamp import format_ns, parse_ns
from syncd.sync.engine import PassReport
from syncd.sync.plane import PlaneClient
from tests.store_probe import dump_tables, outbox_items, reconcile
from tests.sync.harness import MODEL, Hub, Laptop, start_hub, start_laptop

EXAMPLES = int(os.environ.get("SYNCD_PROPERTY_EXAMPLES", "30"))
PASSES = int(os.environ.get("SYNCD_SYNC_PASSES", "5"))
BOOTSTRAP_ROWS = int(os.environ.get("SYNCD_BOOTSTRAP_ROWS", "300"))
SECOND = 1_000_000_000
OVERLAP_SECS = 120.0  # the laptops' overlap window (the harness default)
# A store's identity: two different stores differ here by construction, whatever they applied.
IDENTITY_META = frozenset({"store_id", "replica_id", "hlc_node"})

Versions = dict[str, tuple[Any, ...]]


# ---------------------------------------------------------------------- the fleet


@dataclass
class Fleet:
    """A hub in one cursor mode, and the laptops, bare stores and clients a test opens
    (all closed at teardown)."""

    hub: Hub
    root: Path
    laptops: list[Laptop] = field(default_factory=list)
    stores: list[Store] = field(default_factory=list)
    clients: list[PlaneClient] = field(default_factory=list)
    importer: PlaneClient | None = None

    @property
    def mode(self) -> str:
        return self.hub.cursor

    async def laptop(self, name: str, **options: Any) -> Laptop:
        lap = await start_laptop(name, self.root / name, self.hub.url, self.hub.token, **options)
        self.laptops.append(lap)
        return lap

    async def reopen(self, lap: Laptop, **options: Any) -> Laptop:
        """The same laptop (data dir) restarted with other sync options."""
        self.laptops.remove(lap)
        await lap.close()
        return await self.laptop(lap.name, **options)

    async def store(self, name: str) -> Store:
        s = await Store.open(self.root / name, embedder=HashingEmbedder())
        self.stores.append(s)
        return s

    def client(self, *, write: bool = False) -> PlaneClient:
        c = PlaneClient(self.hub.url, self.hub.token if write else self.hub.read_token)
        self.clients.append(c)
        return c

    async def push(self, nodes: Sequence[NodeRow] = (), edges: Sequence[EdgeRow] = ()) -> None:
        """``POST /v1/agent/memory/import`` with the write token, as another client would."""
        body = json_encoder.encode(ImportRequest(memory_nodes=list(nodes),
                                                 memory_edges=list(edges)))
        if self.importer is None:
            self.importer = self.client(write=True)
        result = await self.importer.import_rows(body)
        assert not result.errors, result.errors

    async def close(self) -> None:
        for lap in self.laptops:
            await lap.close()
        for s in self.stores:
            await s.close()
        for c in self.clients:
            await c.close()


@pytest.fixture(params=["ingest", "origin"])
async def fleet(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Fleet]:
    hub = await start_hub(tmp_path / "hub", request.param)
    f = Fleet(hub, tmp_path)
    try:
        yield f
    finally:
        await f.close()
        await hub.close()


# ---------------------------------------------------------------------- helpers


async def sync_ok(lap: Laptop) -> PassReport:
    report = await lap.sync()
    assert report.ok, f"{lap.name}: {report.error}"
    return report


def shift(stamp: str, seconds: float) -> str:
    return format_ns(parse_ns(stamp) + int(seconds * SECOND))


def now_stamp(seconds: float = 0.0) -> str:
    return format_ns(time.time_ns() + int(seconds * SECOND))


def new_id() -> str:
    return f"memory:{uuid.uuid4()}"


def node_row(mid: str, stamp: str, content: str, *, origin: str | None = "kyma-client",
             deleted: bool = False, realm: str = "default", created: str | None = None,
             ) -> NodeRow:
    """A node version as another writer (or the plane itself, origin None) would send it."""
    born = created or stamp
    return NodeRow(id=mid, labels="Memory", realm=realm, memory_type="fact", content=content,
                   tags="", importance=0.5, status="active", created_at=born, valid_at=born,
                   updated_at=stamp, origin=origin, deleted=True if deleted else None)


def edge_row(src: str, dst: str, stamp: str, *, realm: str | None = "default",
             type_: str = "RELATES_TO", with_id: bool = True, props: str | None = None,
             ) -> EdgeRow:
    """An edge as the plane sends it: ``created_at`` is its version, no origin."""
    return EdgeRow(id=edge_id(src, dst, type_) if with_id else None, src=src, dst=dst,
                   type=type_, realm=realm, props=props, created_at=stamp)


async def replicated(store: Store) -> tuple[list[NodeRow], list[EdgeRow]]:
    """Every replicated row a store holds (tombstones included), as wire rows, by id."""
    nodes, edges = await store.feed.read(include_deleted=True)
    return sorted(nodes, key=lambda n: n.id or ""), sorted(edges, key=lambda e: e.id or "")


async def versions(store: Store) -> Versions:
    """id → the version a store holds and what it says: enough to tell two replicas apart."""
    nodes, edges = await store.feed.read(include_deleted=True)
    out: Versions = {f"node {n.id}": (n.updated_at, n.origin, bool(n.deleted), n.content,
                                      n.status, n.importance, n.invalid_at) for n in nodes}
    out.update({f"edge {e.id}": (e.updated_at, e.origin, bool(e.deleted), e.props)
                for e in edges})
    return out


async def dump_without(store: Store, keys: frozenset[str] = frozenset()) -> dict[str, Any]:
    """``store.dump()`` without the named ``meta`` keys."""
    dump = await dump_tables(store)
    dump["meta"] = [row for row in dump["meta"] if row[0] not in keys]
    return dump


async def node_of(store: Store, mid: str) -> NodeRow | None:
    nodes, _ = await store.feed.read(include_deleted=True)
    return next((n for n in nodes if n.id == mid), None)


async def edges_with_id(store: Store, eid: str) -> list[EdgeRow]:
    _, edges = await store.feed.read(include_deleted=True)
    return [e for e in edges if e.id == eid]


async def fts_hits(store: Store, token: str) -> int:
    rows = await store._fetch("SELECT count(*) FROM memories_fts WHERE memories_fts MATCH ?",
                              (token,))
    return int(rows[0][0])


async def populate(lap: Laptop, tag: str) -> list[str]:
    """A small history on a laptop: saves, a link, a supersede, an archive, a soft and a hard
    delete (so a pulled delta holds live rows, tombstones and edges of both kinds)."""
    ids = [(await lap.store.memories.save({"content": f"{tag} note {i}: keep the build green",
                                  "tags": [tag]}))["node_id"] for i in range(6)]
    await lap.store.graph.link({"memory_id": ids[0], "target_node_id": ids[1]})
    await lap.store.graph.link({"memory_id": ids[3], "target_node_id": ids[5]})
    await lap.store.graph.judge(ids[0], ids[2], "supersedes")
    await lap.store.memories.update_status(ids[1], "archived")
    await lap.store.memories.update_importance(ids[5], 0.9)
    await lap.store.memories.delete(ids[3])
    await lap.store.memories.delete(ids[4], hard=True)
    return ids


# ---------------------------------------------------------------------- R1


async def test_r1_repeated_passes_leave_the_store_unchanged(fleet: Fleet) -> None:
    """R1: syncing the same plane state 1 or N times gives the same store, cursor and rows."""
    a = await fleet.laptop("a")
    await populate(a, "alpha")
    await sync_ok(a)
    b = await fleet.laptop("b")
    await populate(b, "beta")
    await sync_ok(b)  # pulls a's rows, pushes its own, pulls again, runs anti-entropy
    # In origin mode every `changes` answers `until` = the hub's clock at that moment, and the
    # HLC receives it: the cursor and `hlc_last` follow the plane's clock even when nothing
    # changed. The ingest feed's `until` is its last mark, so there nothing may move at all.
    moving = frozenset({"sync.cursor", "hlc_last"}) if fleet.mode == "origin" else frozenset()
    once = await dump_without(b.store, moving)
    cursor = (await b.store.replication.sync_state())["cursor"]
    stats = await b.store.maintenance.stats()
    for _ in range(PASSES):
        report = await sync_ok(b)
        # in origin mode the overlap window re-delivers a's and b's rows on every pass
        assert (report.pulled_nodes, report.pulled_edges, report.pushed_nodes,
                report.pushed_edges) == (0, 0, 0, 0)
    assert await dump_without(b.store, moving) == once
    assert await b.store.maintenance.stats() == stats
    again = (await b.store.replication.sync_state())["cursor"]
    if fleet.mode == "ingest":
        assert again == cursor
    else:
        assert parse_ns(again) >= parse_ns(cursor)
    await sync_ok(a)
    assert await versions(b.store) == await versions(a.store) == await versions(fleet.hub.store)


async def test_r1_the_same_delta_or_export_applied_n_times(fleet: Fleet) -> None:
    """R1: one pulled delta / export applied 1 or N times (pull, apply, reconcile) → one store."""
    a = await fleet.laptop("a")
    await populate(a, "alpha")
    await sync_ok(a)
    client = fleet.client()
    page = await client.changes(None, None, None)
    export = await client.export(None, None, None)
    assert page.memory_nodes and page.memory_edges and export.memory_nodes
    state: dict[str, str | None] = {"cursor": page.until, "feed": page.feed or "",
                                    "plane_store_id": page.store_id}

    async def pull(s: Store) -> tuple[int, int]:
        res = await s.replication.pull(page.memory_nodes, page.memory_edges, model=MODEL, state=state,
                           until=page.until)
        assert not res.problems
        return res.applied_nodes, res.applied_edges

    once, many = await fleet.store("once"), await fleet.store("many")
    first = await pull(once)
    assert first == (len(page.memory_nodes), len(page.memory_edges))
    assert await pull(many) == first
    after_one = await dump_tables(many)
    for _ in range(PASSES):
        assert await pull(many) == (0, 0)
        applied = await many.replication.apply(page.memory_nodes, page.memory_edges, model=MODEL)
        assert (applied.applied_nodes, applied.applied_edges) == (0, 0)
    # The same store after 1 and after N applications: byte-for-byte the same, meta included
    # (the cursor, local_seq and hlc_last too).
    assert await dump_tables(many) == after_one
    # Two stores, one applied once and one N times: the same but for their identity.
    assert await dump_without(many, IDENTITY_META) == await dump_without(once, IDENTITY_META)
    assert (await many.replication.sync_state())["cursor"] == (await once.replication.sync_state())["cursor"] == page.until
    assert await many.maintenance.stats() == await once.maintenance.stats()

    # The same full export reconciled 1 or N times, on a fresh store and on one that pulled.
    fresh = await fleet.store("fresh")
    for s in (fresh, many):
        done = await reconcile(s, export.memory_nodes, export.memory_edges, model=MODEL,
                                 state={"anti_entropy_ns": "1"})
        assert done.requeued_nodes == done.requeued_edges == 0
        reconciled = await dump_tables(s)
        for _ in range(PASSES):
            done = await reconcile(s, export.memory_nodes, export.memory_edges, model=MODEL,
                                     state={"anti_entropy_ns": "1"})
            assert (done.applied.applied_nodes, done.applied.applied_edges,
                    done.requeued_nodes, done.requeued_edges) == (0, 0, 0, 0)
        assert await dump_tables(s) == reconciled
    assert await replicated(fresh) == await replicated(many) == await replicated(a.store)


# ---------------------------------------------------------------------- R2


@dataclass(frozen=True)
class History:
    """Every version a source store wrote (each captured before a later write replaced it),
    and the source's own final state."""

    nodes: list[NodeRow]
    edges: list[EdgeRow]
    final: tuple[list[NodeRow], list[EdgeRow]]

    @property
    def items(self) -> list[NodeRow | EdgeRow]:
        return [*self.nodes, *self.edges]


async def _record_history(root: Path) -> History:
    async with await Store.open(root, embedder=HashingEmbedder()) as src:
        nodes: list[NodeRow] = []
        edges: list[EdgeRow] = []
        seq = 0

        async def capture() -> None:
            nonlocal seq
            n, e, seq = (await src.feed.page(seq, limit=1000))[:3]
            nodes.extend(n)
            edges.extend(e)

        ids = []
        for text in ("alpha: deploys go through the release train",
                     "beta: the staging database is rebuilt nightly",
                     "gamma: the old on-call rota lives in the wiki",
                     "delta: the vendor escalation phone number",
                     "epsilon: laptops sync every five minutes"):
            ids.append((await src.memories.save({"content": text, "topic_key": text[:5]}))["node_id"])
            await capture()
        a, b, c, d, e = ids
        steps: list[Any] = [
            lambda: src.graph.link({"memory_id": a, "target_node_id": b}),
            lambda: src.graph.link({"memory_id": d, "target_node_id": e}),
            lambda: src.graph.judge(a, c, "supersedes"),
            lambda: src.memories.update_status(a, "archived"),
            lambda: src.memories.update_importance(b, 0.9),
            lambda: src.memories.save({"content": "epsilon: laptops sync every minute",
                              "topic_key": "epsil"}),
            lambda: src.memories.delete(b),
            lambda: src.memories.delete(d, hard=True),
            lambda: src.memories.update_status(a, "active"),
        ]
        for step in steps:
            await step()
            await capture()
        return History(nodes, edges, await replicated(src))


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> History:
    return asyncio.run(_record_history(tmp_path_factory.mktemp("history") / "source"))


def test_r2_history_has_deletes_after_inserts(history: History) -> None:
    """R2 (fixture check): the recorded history holds superseded versions and tombstones."""
    ids = [n.id for n in history.nodes]
    assert len(ids) > len(set(ids))  # several versions of one id
    assert any(n.deleted for n in history.nodes) and any(e.deleted for e in history.edges)
    assert any(n.deleted and not n.content for n in history.nodes)  # the hard delete


async def _apply_batches(root: Path, batches: list[list[NodeRow | EdgeRow]], via_pull: bool,
                         ) -> tuple[list[NodeRow], list[EdgeRow]]:
    async with await Store.open(root, embedder=HashingEmbedder()) as s:
        for i, batch in enumerate(batches):
            nodes = [r for r in batch if isinstance(r, NodeRow)]
            edges = [r for r in batch if isinstance(r, EdgeRow)]
            if via_pull:
                res = await s.replication.pull(nodes, edges, model=MODEL, state={"cursor": str(i)})
            else:
                res = await s.replication.apply(nodes, edges, model=MODEL)
            assert not res.problems
        return await replicated(s)


def _split(items: list[NodeRow | EdgeRow], cuts: Sequence[int]) -> list[list[NodeRow | EdgeRow]]:
    bounds = [0, *sorted(set(cuts)), len(items)]
    return [items[lo:hi] for lo, hi in itertools.pairwise(bounds)]


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_r2_any_permutation_and_split_converges(history: History, tmp_path: Path,
                                                data: st.DataObject) -> None:
    """R2: every version of a real history, in any order and batch split (repeats too) → the
    source's final state."""
    items = history.items
    order = data.draw(st.permutations(range(len(items))), label="order")
    repeats = data.draw(st.lists(st.integers(0, len(items) - 1), max_size=5), label="repeats")
    delivered = [items[i] for i in order] + [items[i] for i in repeats]
    cuts = data.draw(st.lists(st.integers(1, len(delivered) - 1), max_size=6), label="cuts")
    via_pull = data.draw(st.booleans(), label="via_pull")
    root = Path(tempfile.mkdtemp(dir=tmp_path))
    got = asyncio.run(_apply_batches(root, _split(delivered, cuts), via_pull))
    assert got == history.final


def test_r2_deletes_delivered_before_their_inserts(history: History, tmp_path: Path) -> None:
    """R2: newest first (every tombstone before the versions it follows), one by one or in one
    batch → the source's final state."""
    newest_first: list[NodeRow | EdgeRow] = list(reversed(history.items))
    for name, batches in (("single", [[r] for r in newest_first]), ("whole", [newest_first])):
        for via_pull in (False, True):
            got = asyncio.run(_apply_batches(tmp_path / f"{name}-{via_pull}", batches, via_pull))
            assert got == history.final


def _orders(items: list[NodeRow | EdgeRow]) -> Iterator[tuple[str, list[list[Any]]]]:
    yield "newest-first", [[r] for r in reversed(items)]
    for seed in (1, 2):
        rng = random.Random(seed)
        shuffled = items[:]
        rng.shuffle(shuffled)
        cuts = rng.sample(range(1, len(shuffled)), 4)
        yield f"shuffle-{seed}", _split(shuffled, cuts)


async def test_r2_any_delivery_order_converges_through_the_hub(tmp_path: Path) -> None:
    """R2: the same versions imported into a hub in several orders and splits → the hub and a
    laptop that syncs from it both hold the source's final state, in both cursor modes."""
    # Recorded here, not taken from the module fixture: its stamps must be recent, or a
    # laptop's origin-mode overlap window would (rightly) miss the later imports (R8).
    history = await _record_history(tmp_path / "source")
    for mode in ("ingest", "origin"):
        for name, batches in _orders(history.items):
            hub = await start_hub(tmp_path / f"hub-{mode}-{name}", mode)
            fleet = Fleet(hub, tmp_path / f"{mode}-{name}")
            try:
                lap = await fleet.laptop("lap")
                for i, batch in enumerate(batches):
                    await fleet.push([r for r in batch if isinstance(r, NodeRow)],
                                     [r for r in batch if isinstance(r, EdgeRow)])
                    if i == len(batches) // 2:
                        await sync_ok(lap)  # a laptop that saw half of them on the way
                await sync_ok(lap)
                assert await replicated(hub.store) == history.final, (mode, name)
                assert await replicated(lap.store) == history.final, (mode, name)
                assert (await lap.store.maintenance.stats())["outbox"] == 0
            finally:
                await fleet.close()
                await hub.close()


# ---------------------------------------------------------------------- R8


async def test_r8_late_rows_and_the_boundary_stamp_are_still_pulled(fleet: Fleet) -> None:
    """R8: rows that land at the plane after the `until` a laptop stored — stamped inside the
    overlap window or exactly at the boundary — are still pulled; older ones only in ingest
    mode (origin mode leaves them to anti-entropy)."""
    a = await fleet.laptop("a")
    seeded = (await a.store.memories.save({"content": "seed: the hub knows this one"}))["node_id"]
    await sync_ok(a)
    reader = await fleet.laptop("reader")
    await sync_ok(reader)
    assert await node_of(reader.store, seeded) is not None
    until = (await reader.store.replication.sync_state())["cursor"]

    within, boundary, old = new_id(), new_id(), new_id()
    # committed now, stamped in the past: the plane's `until` race / a slow writer's clock
    applied = await fleet.hub.store.replication.apply(
        [node_row(within, shift(until, -OVERLAP_SECS / 2), "within the overlap window")], [],
        model=MODEL)
    assert applied.applied_nodes == 1
    await fleet.push([node_row(boundary, until, "stamped exactly at the stored until")])
    applied = await fleet.hub.store.replication.apply(
        [node_row(old, shift(until, -5 * OVERLAP_SECS), "older than the overlap window")], [],
        model=MODEL)
    assert applied.applied_nodes == 1

    await sync_ok(reader)
    assert (await node_of(reader.store, within)) is not None
    assert (await node_of(reader.store, boundary)) is not None
    got_old = await node_of(reader.store, old)
    if fleet.mode == "ingest":
        assert got_old is not None  # the ingest feed never skips, whatever the stamp
    else:
        assert got_old is None  # the plane's origin-clock cursor misses it ...
        reader = await fleet.reopen(reader, anti_entropy_secs=0)
        report = await sync_ok(reader)
        assert report.anti_entropy  # ... and the full export diff repairs it
        assert (await node_of(reader.store, old)) is not None
    assert await versions(reader.store) == await versions(fleet.hub.store)


async def test_r8_ingest_pages_end_on_transaction_boundaries(tmp_path: Path) -> None:
    """R8: pages cut by `limit` at the ingest hub (the origin-cursor hub, like the plane, has
    no pagination) never split one import nor skip a row, when rows land between pages or
    share one stamp."""
    hub = await start_hub(tmp_path / "hub", "ingest")
    fleet = Fleet(hub, tmp_path)
    try:
        await _pages_end_on_transaction_boundaries(fleet)
    finally:
        await fleet.close()
        await hub.close()


async def _pages_end_on_transaction_boundaries(fleet: Fleet) -> None:
    stamp = now_stamp()
    batches = [[node_row(new_id(), stamp, f"batch {b} row {i}") for i in range(3)]
               for b in range(4)]
    for batch in batches[:2]:
        await fleet.push(batch)
    client = fleet.client()
    seen: list[str] = []
    page = await client.changes(None, None, 2)
    assert len(page.memory_nodes) == 3 and page.has_more  # limit 2, one import of 3: whole
    seen += [n.id or "" for n in page.memory_nodes]
    for batch in batches[2:]:
        await fleet.push(batch)  # lands after the `until` this page returned
    since = page.until
    while True:
        page = await client.changes(since, None, 2)
        seen += [n.id or "" for n in page.memory_nodes]
        since = page.until
        if not page.has_more:
            break
    assert sorted(seen) == sorted(n.id or "" for b in batches for n in b)
    assert len(seen) == len(set(seen))


# ---------------------------------------------------------------------- R12


async def test_r12_a_stale_update_never_resurrects_a_delete(fleet: Fleet) -> None:
    """R12: an update stamped before a delete loses in every delivery order (store, hub,
    laptops); an update stamped after the delete (its writer had seen it) wins."""
    t0 = now_stamp(-30)
    stale, tomb = shift(t0, 10), shift(t0, 20)

    def versions_of(mid: str) -> dict[str, NodeRow]:
        return {
            "create": node_row(mid, t0, "the first version", origin="replica-a"),
            "stale": node_row(mid, stale, "a stale edit", origin="replica-b"),
            "delete": node_row(mid, tomb, "the first version", origin="replica-a",
                               deleted=True, created=t0),
        }

    # Stores: all six orders, one row per batch, and all at once.
    for n, order in enumerate(itertools.permutations(("create", "stale", "delete"))):
        s = await fleet.store(f"order-{n}")
        mid = new_id()
        rows = versions_of(mid)
        for name in order:
            await s.replication.apply([rows[name]], [], model=MODEL)
        await s.replication.apply([rows[name] for name in reversed(order)], [], model=MODEL)
        got = await node_of(s, mid)
        assert got is not None and got.deleted and got.updated_at == tomb, order

    # The hub: the tombstone before the stale edit, and after it.
    a = await fleet.laptop("a")
    early, late = new_id(), new_id()
    first, second = versions_of(early), versions_of(late)
    await fleet.push([first["create"], second["create"]])
    await sync_ok(a)  # a holds both live
    await fleet.push([first["delete"]])
    await fleet.push([first["stale"], second["stale"]])
    await sync_ok(a)
    await fleet.push([second["delete"]])
    await sync_ok(a)
    b = await fleet.laptop("b")
    await sync_ok(b)
    for mid in (early, late):
        for store in (fleet.hub.store, a.store, b.store):
            got = await node_of(store, mid)
            assert got is not None and got.deleted and got.updated_at == tomb
            assert got.content == "the first version"

    # An update made after the delete: its writer saw the tombstone, so its stamp is later.
    seen = await node_of(fleet.hub.store, early)
    assert seen is not None and seen.updated_at is not None
    revived = node_row(early, shift(seen.updated_at, 0.001), "written again after the delete",
                       origin=None, created=t0)
    await fleet.push([revived])
    await sync_ok(a)
    await sync_ok(b)
    for store in (fleet.hub.store, a.store, b.store):
        got = await node_of(store, early)
        assert got is not None and not got.deleted
        assert got.content == "written again after the delete"
    assert await versions(a.store) == await versions(b.store) == await versions(fleet.hub.store)


@pytest.mark.parametrize("first", ["delete-pushed-first", "edit-pushed-first"])
async def test_r12_a_concurrent_edit_with_an_older_stamp_loses_to_the_delete(
        fleet: Fleet, first: str) -> None:
    """R12: b edits X, then a deletes X (a later stamp, neither saw the other) → the delete
    wins on every replica whichever of them reaches the plane first."""
    a, b = await fleet.laptop("a"), await fleet.laptop("b")
    mid = (await a.store.memories.save({"content": "the build runs on ci"}))["node_id"]
    await sync_ok(a)
    await sync_ok(b)
    await b.store.memories.update_importance(mid, 0.95)
    await a.store.memories.delete(mid)
    edit, tomb = await node_of(b.store, mid), await node_of(a.store, mid)
    assert edit is not None and tomb is not None and edit.updated_at and tomb.updated_at
    assert edit.updated_at < tomb.updated_at  # "later HLC stamp wins" → the delete
    for lap in ((a, b, a) if first == "delete-pushed-first" else (b, a, b)):
        await sync_ok(lap)
    for store in (fleet.hub.store, a.store, b.store):
        got = await node_of(store, mid)
        assert got is not None and got.deleted and got.importance != 0.95, first
    for lap in (a, b):
        assert await outbox_items(lap.store) == []
    assert await versions(a.store) == await versions(b.store) == await versions(fleet.hub.store)


# ---------------------------------------------------------------------- R13


async def test_r13_a_hard_delete_never_comes_back(fleet: Fleet) -> None:
    """R13: a hard delete's tombstone reaches the plane (empty content) while the local
    tombstone stays; overlapping re-pulls, anti-entropy and an old export re-imported do not
    bring the text back anywhere."""
    token = f"canary{uuid.uuid4().hex}"
    a, b = await fleet.laptop("a"), await fleet.laptop("b")
    # d will be offline during the delete, with the old version and anti-entropy on every pass
    d = await fleet.laptop("d", anti_entropy_secs=0)
    mid = (await a.store.memories.save({"content": f"the vendor pin is {token}", "title": token,
                               "tags": [token]}))["node_id"]
    other = (await a.store.memories.save({"content": "the vendor is acme"}))["node_id"]
    await a.store.graph.link({"memory_id": mid, "target_node_id": other})
    await sync_ok(a)
    await sync_ok(b)
    await sync_ok(d)
    old_export = await fleet.client().export(None, None, None)
    assert token in json_encoder.encode(old_export).decode()
    assert await fts_hits(b.store, token) == 1

    await a.store.memories.delete(mid, hard=True)
    local = await node_of(a.store, mid)
    assert local is not None and local.deleted and not local.content and local.title is None
    assert ("node", mid) in {(k, i) for k, i, _ in await outbox_items(a.store)}
    still = await node_of(fleet.hub.store, mid)
    assert still is not None and not still.deleted  # not at the plane yet

    await sync_ok(a)
    exported = (await fleet.client().export(None, None, None)).memory_nodes
    at_hub = next((n for n in exported if n.id == mid), None)
    assert at_hub is not None and at_hub.deleted and at_hub.content == ""
    assert at_hub.title is None and not at_hub.tags and at_hub.embedding == [0.0] * 384
    local = await node_of(a.store, mid)
    assert local is not None and local.deleted  # the tombstone itself stays
    assert await outbox_items(a.store) == []

    # An old export imported again, overlapping re-pulls and anti-entropy: still deleted.
    await fleet.push(old_export.memory_nodes, old_export.memory_edges)
    for lap in (a, b, d, a, b, d):
        await sync_ok(lap)
    late = await fleet.laptop("late", anti_entropy_secs=0)
    await sync_ok(late)
    await sync_ok(late)

    laptops = (a, b, d, late)
    for store in (fleet.hub.store, *(lap.store for lap in laptops)):
        got = await node_of(store, mid)
        assert got is not None and got.deleted and not got.content
        assert token not in repr(await dump_tables(store))
        assert await fts_hits(store, token) == 0
        hits = await store.recall.query({"query": token})
        assert mid not in [m.id for m in hits.memories]
        assert token not in json_encoder.encode(hits).decode()
    client = fleet.client()
    for body in (await client.export(None, None, None), await client.changes(None, None, None)):
        assert token not in json_encoder.encode(body).decode()
    for lap in laptops:
        assert (await lap.store.maintenance.stats())["outbox"] == 0
    expected = await versions(fleet.hub.store)
    for lap in laptops:
        assert await versions(lap.store) == expected


async def tables_holding(store: Store, needle: str) -> list[str]:
    """Every table (FTS5 shadow tables included) with a cell that contains ``needle``."""
    raw = needle.encode()
    found = []
    for (name,) in await store._fetch("SELECT name FROM sqlite_master WHERE type = 'table'"):
        for row in await store._fetch(f'SELECT * FROM "{name}"'):
            if any(raw in (v if isinstance(v, bytes) else str(v).encode()) for v in row):
                found.append(name)
                break
    return found


async def test_r13_a_hard_delete_leaves_its_text_in_no_table(fleet: Fleet) -> None:
    """R13: once a hard delete has synced, no table of the hub or of a laptop that held the
    memory (the keyword index's shadow tables included) still holds its text."""
    token = f"canary{uuid.uuid4().hex}"
    a, b = await fleet.laptop("a"), await fleet.laptop("b")
    mid = (await a.store.memories.save({"content": f"the door code is {token}"}))["node_id"]
    await a.store.memories.save({"content": "the door is at the back"})
    await sync_ok(a)
    await sync_ok(b)
    assert "memories" in await tables_holding(b.store, token)
    await a.store.memories.delete(mid, hard=True)
    await sync_ok(a)
    await sync_ok(b)
    for name, store in (("hub", fleet.hub.store), ("a", a.store), ("b", b.store)):
        assert await tables_holding(store, token) == [], name


# ---------------------------------------------------------------------- R14


async def test_r14_identical_stamps_pick_one_winner_everywhere(fleet: Fleet) -> None:
    """R14: versions of X with the same `updated_at` from different writers (or the same
    writer with other content) → every store, the hub and every laptop keep the same one."""
    stamp = now_stamp(-1)
    x1, x2 = new_id(), new_id()

    def rivals(mid: str) -> list[NodeRow]:
        return [node_row(mid, stamp, "written on a", origin="replica-a"),
                node_row(mid, stamp, "written on b", origin="replica-b"),
                node_row(mid, stamp, "written on b, other text", origin="replica-b"),
                node_row(mid, stamp, "written by the plane", origin=None)]

    winners = []
    for n, order in enumerate(itertools.permutations(range(4))):
        if n % 5:  # 5 of the 24 orders, spread over every first position
            continue
        s = await fleet.store(f"order-{n}")
        for i in order:
            await s.replication.apply([rivals(x1)[i]], [], model=MODEL)
        await s.replication.apply([rivals(x2)[i] for i in order], [], model=MODEL)  # one batch
        winners.append({mid: await node_of(s, mid) for mid in (x1, x2)})
    assert all(w[x1] == winners[0][x1] and w[x2] == winners[0][x2] for w in winners)
    expected = winners[0][x1]
    assert expected is not None and expected.origin == "replica-b"  # the origin breaks a tie

    # Laptops each hold one rival already; the hub gets them in opposite orders.
    laps = [await fleet.laptop(f"lap{i}") for i in range(3)]
    for i, lap in enumerate(laps):
        await lap.store.replication.apply([rivals(x1)[i], rivals(x2)[-1 - i]], [], model=MODEL)
    for i in range(4):
        await fleet.push([rivals(x1)[i]])
        await fleet.push([rivals(x2)[3 - i]])
        await sync_ok(laps[i % 3])
    for lap in laps:
        await sync_ok(lap)
    for store in (fleet.hub.store, *(lap.store for lap in laps)):
        for mid in (x1, x2):
            got = await node_of(store, mid)
            assert got is not None
            assert (got.content, got.origin, got.updated_at) == (
                expected.content, expected.origin, expected.updated_at)
        assert (await store.maintenance.stats())["outbox"] == 0


# ---------------------------------------------------------------------- R15


async def test_r15_no_echo(fleet: Fleet) -> None:
    """R15: A → plane → B, then N idle passes on both → the hub's rows, versions and feed are
    untouched, nothing is pushed, and each of B's idle passes is one request."""
    a, b = await fleet.laptop("a"), await fleet.laptop("b")
    c = await fleet.laptop("c", anti_entropy_secs=0)  # a full export diff on every pass
    mid = (await a.store.memories.save({"content": "x: the release checklist"}))["node_id"]
    await a.store.graph.link({"memory_id": mid, "target_node_id": "repo:syncd"})
    await sync_ok(a)

    async def hub_state() -> tuple[Any, ...]:
        feed = await fleet.hub.store._fetch("SELECT seq, stamp FROM feed ORDER BY seq")
        row = await fleet.hub.store._fetch(
            "SELECT updated_at, origin, local_seq FROM memories WHERE id = ?", (mid,))
        return await dump_tables(fleet.hub.store), [tuple(r) for r in feed], tuple(row[0])

    before = await hub_state()
    first = await sync_ok(b)
    assert first.pulled_nodes == 1 and first.pulled_edges == 1
    assert first.pushed_nodes == first.pushed_edges == 0
    await sync_ok(c)
    for _ in range(PASSES):
        report = await sync_ok(b)
        assert report.requests == 1, report
        assert (report.pushed_nodes, report.pushed_edges, report.push_requests) == (0, 0, 0)
        for lap in (a, c):
            report = await sync_ok(lap)
            assert (report.pushed_nodes, report.pushed_edges, report.push_requests) == (0, 0, 0)
            assert report.requeued == 0
    assert await hub_state() == before
    for lap in (a, b, c):
        assert await outbox_items(lap.store) == []
        assert await versions(lap.store) == await versions(fleet.hub.store)


# ---------------------------------------------------------------------- R17


async def _seed_hub(hub: Hub, count: int, chunk: int) -> list[str]:
    """``count`` memories saved at the hub itself, ``chunk`` per transaction (feed mark)."""
    ids: list[str] = []
    for start in range(0, count, chunk):
        saved = await hub.store.memories.save_many(
            [{"content": f"seeded memory {i}: service {i % 17} owns queue {i}"}
             for i in range(start, min(count, start + chunk))])
        ids += [f"memory:{u}" if not str(u).startswith("memory:") else str(u)
                for u in saved["ids"]]
    return ids


async def test_r17_paged_bootstrap_has_no_gap_while_the_hub_takes_writes(fleet: Fleet) -> None:
    """R17: a client paging `changes` with a small `limit` (ingest) or re-pulling with the
    overlap (origin), while another laptop pushes updates, deletes and new rows between pages
    → it ends with exactly every row and version the hub holds."""
    seeded = await _seed_hub(fleet.hub, 60, 3)
    writer = await fleet.laptop("writer")
    await sync_ok(writer)  # holds every seeded row, so it can update any of them
    client = fleet.client()
    target = await fleet.store("target")
    rounds = 0

    async def write_between_pages() -> None:
        nonlocal rounds
        await writer.store.memories.update_importance(seeded[rounds], 0.91)  # already paged
        await writer.store.memories.update_importance(seeded[-1 - rounds], 0.92)  # not paged yet
        await writer.store.memories.delete(seeded[20 + rounds])
        await writer.store.memories.save({"content": f"written during the bootstrap, round {rounds}"})
        await sync_ok(writer)
        rounds += 1

    since: str | None = None
    pages = 0
    while True:
        page = await client.changes(since, None, 7)
        res = await target.replication.pull(page.memory_nodes, page.memory_edges, model=MODEL,
                                state={"cursor": page.until}, until=page.until)
        assert not res.problems
        pages += 1
        wrote = rounds < 5
        if wrote:
            await write_between_pages()
        # a plane's `until` can pass rows still committing: re-read the overlap window
        since = page.until if page.feed == "ingest" else shift(page.until, -OVERLAP_SECS)
        if not page.has_more and not wrote:
            break
    if fleet.mode == "ingest":
        assert pages > 5
    assert rounds == 5
    assert await versions(target) == await versions(fleet.hub.store)


async def test_r17_laptop_bootstrap_while_another_laptop_pushes(fleet: Fleet) -> None:
    """R17: a fresh laptop bootstraps from a hub with many rows while another laptop keeps
    pushing in a concurrent task → after the bootstrap and one more pass it holds exactly
    every row at the hub."""
    await _seed_hub(fleet.hub, BOOTSTRAP_ROWS, 100)
    writer = await fleet.laptop("writer")
    own = [(await writer.store.memories.save({"content": f"writer note {i}"}))["node_id"]
           for i in range(6)]
    await sync_ok(writer)
    fresh = await fleet.laptop("fresh")

    async def keep_writing() -> None:
        for i in range(4):
            await writer.store.memories.save({"content": f"written while fresh bootstraps {i}"})
            await writer.store.memories.update_importance(own[i], 0.7)
            await writer.store.memories.delete(own[-1 - i] if i < 2 else own[i])
            await sync_ok(writer)

    bootstrap, _ = await asyncio.gather(fresh.sync(), keep_writing())
    assert bootstrap.ok, bootstrap.error
    await sync_ok(fresh)
    hub_versions = await versions(fleet.hub.store)
    assert len(hub_versions) >= BOOTSTRAP_ROWS + 6 + 4
    assert await versions(fresh.store) == hub_versions
    assert await versions(writer.store) == hub_versions


# ---------------------------------------------------------------------- R18


async def test_r18_edges_early_repeated_or_from_another_realm_in_a_store(tmp_path: Path) -> None:
    """R18: an edge delivered before its endpoints, three times, with and without its id,
    and with another realm's version → one local edge, no error."""
    async with await Store.open(tmp_path / "s", embedder=HashingEmbedder()) as s:
        src, dst = new_id(), new_id()
        eid = edge_id(src, dst, "RELATES_TO")
        t = now_stamp(-10)
        early = edge_row(src, dst, t)
        res = await s.replication.pull([], [early, early, early], model=MODEL, state={"cursor": t}, until=t)
        assert not res.problems and res.applied_edges == 1
        for again in ([early], [edge_row(src, dst, t, with_id=False)] * 3):
            res = await s.replication.apply([], again, model=MODEL)
            assert not res.problems and res.applied_edges == 0
        other_realm = edge_row(src, dst, shift(t, 1), realm="home", with_id=False)
        res = await s.replication.apply([], [other_realm, early, other_realm], model=MODEL)
        assert not res.problems
        with pytest.raises(NotFoundError):
            await s.memories.get(src)  # the endpoint has not arrived yet
        await s.replication.apply([node_row(src, t, "the source"), node_row(dst, t, "the target")], [],
                      model=MODEL)
        got = await edges_with_id(s, eid)
        assert len(got) == 1 and got[0].realm == "home"
        assert [e["id"] for e in (await s.memories.get(src))["edges"]] == [eid]
        assert (await s.maintenance.stats())["edges"] == 1 and (await s.maintenance.stats())["outbox"] == 0


async def test_r18_edges_early_repeated_or_from_another_realm_through_the_hub(
        fleet: Fleet) -> None:
    """R18: through the hub, an edge imported before its endpoints and three times, and a
    laptop syncing another realm → one edge on the hub and on every laptop, no failed pass."""
    home_src, home_dst = new_id(), new_id()
    eid = edge_id(home_src, home_dst, "RELATES_TO")
    t = now_stamp(-5)
    edge = edge_row(home_src, home_dst, t, realm="home")
    everyone = await fleet.laptop("everyone")
    work = await fleet.laptop("work", realm="work")
    await work.store.memories.save({"content": "work: the standup is at ten", "realm": "work"})

    await fleet.push([], [edge, edge, edge_row(home_src, home_dst, t, realm="home",
                                                with_id=False)])
    await fleet.push([], [edge])
    for lap in (everyone, work):
        await sync_ok(lap)
        assert len(await edges_with_id(lap.store, eid)) == 1
    with pytest.raises(NotFoundError):
        await everyone.store.memories.get(home_src)

    await fleet.push([node_row(home_src, t, "home: water the plants", realm="home"),
                      node_row(home_dst, t, "home: the plants", realm="home")], [edge])
    for _ in range(3):
        for lap in (everyone, work):
            report = await sync_ok(lap)
            assert report.pull_problems == 0 and report.pushed_edges == 0
    assert len(await edges_with_id(fleet.hub.store, eid)) == 1
    assert [e["id"] for e in (await everyone.store.memories.get(home_src))["edges"]] == [eid]
    for lap in (everyone, work):
        assert len(await edges_with_id(lap.store, eid)) == 1
        assert await outbox_items(lap.store) == []
    assert await node_of(work.store, home_src) is None  # the other realm's nodes stay away
    work_nodes = (await work.store.feed.read())[0]
    assert [n.realm for n in work_nodes] == ["work"]
    assert await node_of(fleet.hub.store, work_nodes[0].id or "") is not None

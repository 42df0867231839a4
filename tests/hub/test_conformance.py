"""The hub-store conformance suite: one set of behaviours, run on SQLite and on PostgreSQL
(``conftest.py``). Everything a hub persists — rows, edges, the change feed, export pages,
settings, counters, tokens, the signing key, the web page's sessions — and recall, through the
``HubStore`` interface."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from local_store import HashingEmbedder, ValidationError
from protocol.query import QueryRequest
from protocol.rows import EdgeRow, NodeRow, edge_id
from protocol.timestamp import format_ns, parse_ns
from syncd.hub.keys import KEY_FILENAME, load_or_create_key
from syncd.hub.store import HubStore, PageSession
from syncd.hub.tokens import AuthError, token_hash
from tests.hub.conftest import Opener

MODEL = HashingEmbedder().model_id
BASE = parse_ns("2026-11-01T10:00:00Z")


def stamp(n: int) -> str:
    return format_ns(BASE + n * 1_000_000_000)


def node(mid: str, content: str, n: int = 1, *, origin: str = "laptop-a", realm: str = "work",
         deleted: bool | None = None, vector: bool = True, **extra: object) -> NodeRow:
    embedding = HashingEmbedder().embed([content])[0] if vector and content else None
    return NodeRow(id=mid, content=content, realm=realm, memory_type="fact", importance=0.5,
                   status="active", created_at=stamp(0), updated_at=stamp(n), origin=origin,
                   deleted=deleted, embedding=None if embedding is None else list(embedding),
                   **extra)  # type: ignore[arg-type]


def edge(src: str, dst: str, n: int = 1, *, origin: str = "laptop-a",
         deleted: bool | None = None) -> EdgeRow:
    return EdgeRow(id=edge_id(src, dst, "RELATES_TO"), src=src, dst=dst, type="RELATES_TO",
                   realm="work", created_at=stamp(n), updated_at=stamp(n), origin=origin,
                   deleted=deleted)


async def contents(hub: HubStore) -> dict[str, tuple[str | None, bool]]:
    nodes, _ = await hub.export()
    return {n.id or "": (n.content, bool(n.deleted)) for n in nodes}


async def read_feed(hub: HubStore, since: str | None = None, *, limit: int | None = None,
                    **kw: str) -> tuple[list[str], str]:
    """Every row id (nodes then edges, page by page) from ``since`` to the end, and the last
    ``until``."""
    seen: list[str] = []
    for _ in range(1000):
        nodes, edges, until, more = await hub.feed(since, limit=limit, **kw)
        seen += [n.id or "" for n in nodes] + [e.id or "" for e in edges]
        since = until
        if not more:
            return seen, until
    raise AssertionError("the feed never ended")


# ---------------------------------------------------------------------- identity

async def test_store_id_survives_a_restart(open_hub: Opener) -> None:
    hub = await open_hub()
    first = hub.store_id
    assert len(first) >= 16
    await hub.close()
    assert (await open_hub()).store_id == first


# ---------------------------------------------------------------------- apply

async def test_apply_keeps_the_newest_version_and_is_idempotent(hub_store: HubStore) -> None:
    first = await hub_store.apply([node("memory:x", "x v2", 2)], [], model=MODEL)
    assert (first.applied_nodes, first.skipped_nodes) == (1, 0)
    older = await hub_store.apply([node("memory:x", "x v1", 1)], [], model=MODEL)
    assert (older.applied_nodes, older.skipped_nodes) == (0, 1)
    again = await hub_store.apply([node("memory:x", "x v2", 2)], [], model=MODEL)
    assert (again.applied_nodes, again.skipped_nodes) == (0, 1)
    newer = await hub_store.apply([node("memory:x", "x v3", 3)], [], model=MODEL)
    assert newer.applied_nodes == 1
    assert await contents(hub_store) == {"memory:x": ("x v3", False)}


async def test_equal_stamps_pick_the_same_winner_in_any_order(open_hub: Opener) -> None:
    a, b = node("memory:t", "from a", 5, origin="aaa"), node("memory:t", "from b", 5,
                                                             origin="bbb")
    hub = await open_hub()
    await hub.apply([b], [], model=MODEL)
    await hub.apply([a], [], model=MODEL)
    assert (await contents(hub))["memory:t"] == ("from b", False)  # origin "bbb" > "aaa"
    result = await hub.apply([a, b], [], model=MODEL)  # both again, in one batch
    assert result.applied_nodes == 0


async def test_a_tombstone_is_never_resurrected_by_an_older_update(hub_store: HubStore) -> None:
    await hub_store.apply([node("memory:d", "doomed", 1)], [], model=MODEL)
    await hub_store.apply([node("memory:d", "doomed", 3, deleted=True)], [], model=MODEL)
    stale = await hub_store.apply([node("memory:d", "stale edit", 2)], [], model=MODEL)
    assert stale.applied_nodes == 0
    assert (await contents(hub_store))["memory:d"][1] is True
    later = await hub_store.apply([node("memory:d", "edited after the delete", 4)], [],
                                  model=MODEL)
    assert later.applied_nodes == 1  # "later HLC stamp wins" (merge.py)
    assert (await contents(hub_store))["memory:d"] == ("edited after the delete", False)


async def test_bad_rows_are_reported_by_index_and_field_and_the_rest_apply(
        hub_store: HubStore) -> None:
    rows = [node("memory:good", "fine", 1), NodeRow(id="memory:bad", content="no version"),
            NodeRow(content="no id", updated_at=stamp(1)), node("memory:good2", "also fine", 1)]
    result = await hub_store.apply(rows, [EdgeRow(id="x", src="memory:good")], model=MODEL)
    assert result.applied_nodes == 2
    assert sorted((p.kind, p.index, p.field) for p in result.problems) == [
        ("edge", 0, "dst"), ("node", 1, "updated_at"), ("node", 2, "id")]
    assert set(await contents(hub_store)) == {"memory:good", "memory:good2"}


async def test_a_batch_of_only_bad_rows_leaves_the_store_unchanged(hub_store: HubStore) -> None:
    await hub_store.apply([node("memory:keep", "kept", 1)], [], model=MODEL)
    before_feed = await read_feed(hub_store)
    result = await hub_store.apply([NodeRow(id="memory:keep", content="x", updated_at="soon")],
                                   [], model=MODEL)
    assert [(p.index, p.field) for p in result.problems] == [(0, "updated_at")]
    assert await contents(hub_store) == {"memory:keep": ("kept", False)}
    assert await read_feed(hub_store) == before_feed


async def test_imported_private_text_is_redacted(hub_store: HubStore) -> None:
    await hub_store.apply([node("memory:p", "key is <private>hunter2</private> ok", 1)], [],
                          model=MODEL)
    nodes, _ = await hub_store.export()
    assert nodes[0].content is not None and "hunter2" not in nodes[0].content
    feed, _, _, _ = await hub_store.feed(None)
    assert feed[0].content == nodes[0].content
    hits = await hub_store.recall(QueryRequest(query="hunter2"))
    assert not [m for m in hits.memories if not hits.fallback]


async def test_edges_are_upserted_by_id_never_duplicated(hub_store: HubStore) -> None:
    await hub_store.apply([node("memory:a", "a", 1), node("memory:b", "b", 1)],
                          [edge("memory:a", "memory:b", 1)], model=MODEL)
    again = await hub_store.apply([], [edge("memory:a", "memory:b", 1)] * 3, model=MODEL)
    assert again.applied_edges == 0
    await hub_store.apply([], [edge("memory:a", "memory:b", 2, deleted=True)], model=MODEL)
    _, edges = await hub_store.export()
    assert [(e.id, e.deleted) for e in edges] == [(edge_id("memory:a", "memory:b",
                                                           "RELATES_TO"), True)]
    assert (await hub_store.stats())["edges"] == 0


# ---------------------------------------------------------------------- the change feed

async def test_the_feed_is_ingest_ordered_so_a_late_old_version_is_not_skipped(
        hub_store: HubStore) -> None:
    await hub_store.apply([node("memory:new", "stamped late", 50)], [], model=MODEL)
    seen, until = await read_feed(hub_store)
    assert seen == ["memory:new"]
    # pushed after that pull, but stamped long before it (an offline laptop's old edit)
    await hub_store.apply([node("memory:old", "stamped early", 1)], [], model=MODEL)
    seen, later = await read_feed(hub_store, until)
    assert seen == ["memory:old"]
    assert parse_ns(later) > parse_ns(until)


async def test_feed_pages_end_on_import_boundaries_and_see_each_row_once(
        hub_store: HubStore) -> None:
    batches = [[node(f"memory:{b}-{i}", f"batch {b} row {i}", 1) for i in range(size)]
               for b, size in enumerate([3, 5, 1, 4])]
    for batch in batches:
        await hub_store.apply(batch, [], model=MODEL)
    pages: list[list[str]] = []
    since: str | None = None
    while True:
        nodes, _, until, more = await hub_store.feed(since, limit=4)
        pages.append([n.id or "" for n in nodes])
        since = until
        if not more:
            break
    flat = [mid for page in pages for mid in page]
    assert sorted(flat) == sorted(n.id or "" for b in batches for n in b)
    assert len(flat) == len(set(flat))
    batch_of = {n.id: i for i, b in enumerate(batches) for n in b}
    for page in pages:  # every batch lies wholly inside one page
        for b in {batch_of[mid] for mid in page}:
            assert sum(1 for mid in page if batch_of[mid] == b) == len(batches[b])


async def test_an_empty_feed_page_keeps_until_and_an_unknown_since_goes_backwards(
        hub_store: HubStore) -> None:
    nodes, edges, until, more = await hub_store.feed(None)
    assert (nodes, edges, more) == ([], [], False)
    assert parse_ns(until) == 0
    await hub_store.apply([node("memory:a", "a", 1)], [], model=MODEL)
    _, until = await read_feed(hub_store)
    nodes, _, same, more = await hub_store.feed(until)
    assert (nodes, same, more) == ([], until, False)
    # a `since` this hub never served (a client of a hub restored from an older backup)
    unknown = format_ns(parse_ns(until) + 3_600_000_000_000)
    nodes, edges, back, more = await hub_store.feed(unknown)
    assert (nodes, edges, more) == ([], [], False)
    assert parse_ns(back) < parse_ns(unknown)


async def test_the_feed_filters_by_realm_and_leaves_out_the_callers_own_versions(
        hub_store: HubStore) -> None:
    await hub_store.apply([node("memory:w", "work", 1, origin="laptop-a"),
                           node("memory:h", "home", 1, origin="laptop-b", realm="home")],
                          [edge("memory:w", "memory:h", 1, origin="laptop-b")], model=MODEL)
    seen, _ = await read_feed(hub_store, realm="home")
    assert seen == ["memory:h", edge_id("memory:w", "memory:h", "RELATES_TO")]
    seen, _ = await read_feed(hub_store, exclude_origin="laptop-b")
    assert seen == ["memory:w"]


async def test_the_feed_carries_vectors_of_the_hub_model_and_tombstones(
        hub_store: HubStore) -> None:
    await hub_store.apply([node("memory:v", "vector row", 1),
                           node("memory:t", "gone", 2, deleted=True, vector=False)], [],
                          model=MODEL)
    nodes, _, _, _ = await hub_store.feed(None)
    by_id = {n.id: n for n in nodes}
    assert by_id["memory:t"].deleted is True
    vector = by_id["memory:v"].embedding
    assert vector is not None and len(vector) == HashingEmbedder().dim
    expected = HashingEmbedder().embed(["vector row"])[0]
    assert max(abs(a - float(b)) for a, b in zip(vector, expected, strict=True)) < 1e-6


async def test_origin_mode_changes_filter_on_the_rows_own_versions(hub_store: HubStore) -> None:
    await hub_store.apply([node("memory:1", "one", 1), node("memory:5", "five", 5)],
                          [edge("memory:1", "memory:5", 3)], model=MODEL)
    nodes, edges = await hub_store.changes_since(stamp(2), edge_version="created_at")
    assert [n.id for n in nodes] == ["memory:5"]
    assert [e.id for e in edges] == [edge_id("memory:1", "memory:5", "RELATES_TO")]
    nodes, edges = await hub_store.changes_since(stamp(5))
    assert (nodes, edges) == ([], [])
    with pytest.raises(ValidationError) as err:
        await hub_store.changes_since("yesterday")
    assert err.value.field == "since"



async def test_origin_mode_changes_stream_from_one_snapshot_across_tied_versions(
        hub_store: HubStore) -> None:
    """The origin-mode answer streams from ``changes_snapshot``: pages of 3 over rows sharing
    versions (the keyset must not skip or repeat a tie), tombstones included, realm filtering
    nodes only, edges filtered on the chosen version, and rows written between two pages not
    showing."""
    await hub_store.apply([node(f"memory:t{i:02d}", f"row {i}", i % 4,
                                realm="home" if i % 3 == 0 else "work") for i in range(16)],
                          [], model=MODEL)
    await hub_store.apply([node("memory:t01", "gone", 5, deleted=True)], [], model=MODEL)
    old_new = EdgeRow(id=edge_id("memory:t00", "memory:t02", "RELATES_TO"), src="memory:t00",
                      dst="memory:t02", type="RELATES_TO", realm="work", created_at=stamp(1),
                      updated_at=stamp(4), origin="laptop-a")
    await hub_store.apply([], [old_new, edge("memory:t02", "memory:t03", 3)], model=MODEL)
    expected = {f"memory:t{i:02d}" for i in range(16) if i % 4 > 1} | {"memory:t01"}
    async with hub_store.changes_snapshot(stamp(1), page_rows=3) as snapshot:
        pages = snapshot.node_pages()
        streamed = list(await anext(pages))
        await hub_store.apply([node("memory:t02", "changed", 20), node("memory:late", "x", 20)],
                              [edge("memory:t04", "memory:t05", 20)], model=MODEL)
        streamed += [n async for page in pages for n in page]
        links = [e.id async for page in snapshot.edge_pages() for e in page]
        assert (snapshot.memories, snapshot.edges) == (len(expected), 2)
    ids = [n.id for n in streamed]
    assert len(ids) == len(set(ids)) and set(ids) == expected
    assert [n.id for n in streamed if n.deleted] == ["memory:t01"]
    assert "changed" not in {n.content for n in streamed}
    assert set(links) == {old_new.id, edge_id("memory:t02", "memory:t03", "RELATES_TO")}
    async with hub_store.changes_snapshot(stamp(1), "home", edge_version="created_at",
                                          page_rows=2) as snapshot:
        home = [n.id async for page in snapshot.node_pages() for n in page]
        created = [e.id async for page in snapshot.edge_pages() for e in page]
    assert sorted(home) == ["memory:t03", "memory:t06", "memory:t15"]
    assert created == [edge_id("memory:t02", "memory:t03", "RELATES_TO"),
                       edge_id("memory:t04", "memory:t05", "RELATES_TO")]
    whole = await hub_store.changes_since(stamp(1), "home", edge_version="created_at")
    assert ([n.id for n in whole[0]], [e.id for e in whole[1]]) == (home, created)
    with pytest.raises(ValidationError) as err:
        hub_store.changes_snapshot("last tuesday")
    assert err.value.field == "since"


# ---------------------------------------------------------------------- export

async def test_export_pages_cover_every_row_with_tombstones(hub_store: HubStore) -> None:
    for b in range(4):
        await hub_store.apply([node(f"memory:{b}-{i}", f"row {b} {i}", 1) for i in range(3)],
                              [], model=MODEL)
    await hub_store.apply([node("memory:0-0", "row 0 0", 9, deleted=True)], [], model=MODEL)
    seen: list[tuple[str, bool]] = []
    cursor = "0"
    for _ in range(100):
        nodes, _, cursor, more = await hub_store.export_page(cursor, limit=4)
        seen += [(n.id or "", bool(n.deleted)) for n in nodes]
        if not more:
            break
    assert dict(seen) == {f"memory:{b}-{i}": (b, i) == (0, 0) for b in range(4) for i in range(3)}
    whole, _ = await hub_store.export()
    assert {n.id for n in whole} == {mid for mid, _ in seen}


async def test_an_export_snapshot_streams_exports_rows_and_ignores_later_writes(
        hub_store: HubStore) -> None:
    """The unpaged export answer streams from ``export_snapshot``: its pages hold exactly
    ``export``'s rows in its order, tombstones and vectors included, with its counts, from
    one snapshot (rows written between two pages do not show)."""
    await hub_store.apply([node(f"memory:s{i:02d}", f"row {i}", 1, realm="work" if i % 3 else
                                "home") for i in range(11)],
                          [edge("memory:s01", "memory:s02"), edge("memory:s02", "memory:s03")],
                          model=MODEL)
    await hub_store.apply([node("memory:s05", "row 5", 9, deleted=True)], [], model=MODEL)
    nodes, edges = await hub_store.export()
    async with hub_store.export_snapshot(page_rows=3) as snapshot:
        pages = snapshot.node_pages()
        streamed = list(await anext(pages))
        await hub_store.apply([node("memory:s00", "changed", 20), node("memory:zz", "new", 20)],
                              [edge("memory:s03", "memory:s04")], model=MODEL)
        streamed += [n async for page in pages for n in page]
        links = [e async for page in snapshot.edge_pages() for e in page]
        assert (snapshot.memories, snapshot.edges) == (11, 2)
    assert (streamed, links) == (nodes, edges)
    assert [n.id for n in streamed if n.deleted] == ["memory:s05"]
    assert all(n.embedding for n in streamed if not n.deleted)
    async with hub_store.export_snapshot("home", page_rows=2) as snapshot:
        home = [n.id async for page in snapshot.node_pages() for n in page]
        assert snapshot.memories == len(home) == 3  # memory:s00 moved to "work" above
    assert home == [n.id for n in (await hub_store.export("home"))[0]]


async def test_an_export_page_that_takes_the_last_row_says_there_is_no_more(
        hub_store: HubStore) -> None:
    """``has_more`` is false when a page ends exactly on the last row (a client otherwise
    fetches an empty page), and true when one row is left."""
    for i in range(3):
        await hub_store.apply([node(f"memory:x{i}", f"row {i}", 1)], [], model=MODEL)
    _, _, cursor, more = await hub_store.export_page("0", limit=2)
    assert more is True
    nodes, _, cursor, more = await hub_store.export_page(cursor, limit=1)
    assert len(nodes) == 1 and more is False
    assert (await hub_store.export_page(cursor, limit=1))[:2] == ([], [])
    _, _, _, more = await hub_store.export_page("0", limit=3)
    assert more is False

@pytest.mark.parametrize("cursor", ["", "-1", "abc", "1e3", "9" * 40, "9" * 19, "٣",
                                    str(2**63)])
async def test_a_bad_export_cursor_names_the_field(hub_store: HubStore, cursor: str) -> None:
    with pytest.raises(ValidationError) as err:
        await hub_store.export_page(cursor, limit=10)
    assert err.value.field == "cursor"


# ---------------------------------------------------------------------- settings, counters

async def test_settings_patch_merge_and_survive_a_restart(open_hub: Opener) -> None:
    hub = await open_hub()
    default = await hub.settings()
    merged = await hub.put_settings({"w_keyword": 0.9, "default_limit": 7})
    assert (merged.w_keyword, merged.default_limit, merged.w_rrf) == (0.9, 7, default.w_rrf)
    await hub.close()
    hub = await open_hub()
    assert ((await hub.settings()).w_keyword, (await hub.settings()).default_limit) == (0.9, 7)


async def test_a_bad_settings_patch_names_the_field_and_changes_nothing(
        hub_store: HubStore) -> None:
    before = await hub_store.settings()
    with pytest.raises(ValidationError) as err:
        await hub_store.put_settings({"default_limit": "lots"})
    assert "default_limit" in (err.value.field or "")
    assert await hub_store.settings() == before
    for patch, field in (({"w_graph": float("nan")}, "w_graph"), ({"rrf_k": 0}, "rrf_k"),
                         ({"default_limit": -1}, "default_limit"),
                         ({"dreaming": {"interval_secs": -5}}, "dreaming.interval_secs"),
                         ({"dreaming": {"mode": "nope"}}, "dreaming.mode"),
                         ({"hitl": {"ops": {"add": "bogus"}}}, "hitl.ops.add")):
        with pytest.raises(ValidationError) as err:
            await hub_store.put_settings(patch)
        assert err.value.field == field
        assert await hub_store.settings() == before


async def test_settings_strings_are_redacted(hub_store: HubStore) -> None:
    """P1/P7: a hub serves its settings to every client; a private span is never stored."""
    merged = await hub_store.put_settings({
        "embedding_model": "nightly <private>hub-settings-secret</private>"})
    assert merged.embedding_model == "nightly [redacted]"
    assert (await hub_store.settings()).embedding_model == "nightly [redacted]"


async def test_two_settings_patches_at_once_both_land(hub_store: HubStore) -> None:
    """Each merges onto what the other stored (the SQLite store once merged both onto the
    value before either, and the second write reverted the first)."""
    await asyncio.gather(hub_store.put_settings({"w_graph": 0.7}),
                         hub_store.put_settings({"w_rrf": 2.0}))
    after = await hub_store.settings()
    assert (after.w_graph, after.w_rrf) == (0.7, 2.0)


async def test_counters_grow_across_restarts(open_hub: Opener) -> None:
    hub = await open_hub()
    assert [await hub.next_counter("c") for _ in range(3)] == [1, 2, 3]
    assert await hub.next_counter("other") == 1
    await hub.close()
    assert await (await open_hub()).next_counter("c") == 4


# ---------------------------------------------------------------------- tokens, key

async def test_tokens_authenticate_by_role_and_revoke(hub_store: HubStore) -> None:
    tokens = hub_store.tokens
    raw = await tokens.create(role="write", name="laptop", plan="sync")
    assert await tokens.authenticate(f"Bearer {raw}", "read") == ("laptop", "write")
    assert await tokens.identify(raw) == ("laptop", "sync")
    with pytest.raises(AuthError) as denied:
        await tokens.authenticate(f"Bearer {raw}", "admin")
    assert denied.value.status == 403
    for header in (None, "Basic x", "Bearer nope"):
        with pytest.raises(AuthError) as unknown:
            await tokens.authenticate(header, "read")
        assert unknown.value.status == 401
    with pytest.raises(ValueError, match=r"^name:"):
        await tokens.create(role="read", name="laptop")
    with pytest.raises(ValueError, match=r"^role:"):
        await tokens.create(role="root", name="other")
    with pytest.raises(ValueError, match=r"^plan:"):
        await tokens.create(role="read", name="other", plan="gold")
    assert await tokens.revoke("laptop") is True
    assert await tokens.revoke("laptop") is False
    with pytest.raises(AuthError):
        await tokens.authenticate(f"Bearer {raw}", "read")
    listed = await tokens.list()
    assert [(t["name"], t["role"], t["revoked_at"] is not None) for t in listed] == [
        ("laptop", "write", True)]
    assert raw not in repr(listed)
    again = await tokens.create(role="read", name="laptop")  # the name is free again
    assert await tokens.authenticate(f"Bearer {again}", "read") == ("laptop", "read")


async def test_an_active_token_is_found_by_its_hash(hub_store: HubStore) -> None:
    """A page session knows its token by the hash only (``PageSession.token_sha256``)."""
    tokens = hub_store.tokens
    raw = await tokens.create(role="write", name="laptop", plan="sync")
    assert await tokens.lookup_hash(token_hash(raw)) == ("laptop", "write", "sync")
    assert await tokens.lookup_hash(token_hash("syncd_unknown")) is None
    assert await tokens.lookup_hash(raw) is None  # the raw token is no key
    await tokens.revoke("laptop")
    assert await tokens.lookup_hash(token_hash(raw)) is None


async def test_the_signing_key_is_created_once_and_kept(open_hub: Opener) -> None:
    def public(key: object) -> bytes:
        return key.public_key().public_bytes(  # type: ignore[attr-defined,no-any-return]
            serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    hub = await open_hub()
    first = public(await hub.signing_key())
    assert public(await hub.signing_key()) == first
    await hub.close()
    assert public(await (await open_hub()).signing_key()) == first


def test_processes_creating_the_key_at_once_all_get_the_one_key(tmp_path: Path) -> None:
    """The key file appears whole (written, then linked into place): a second process starting
    at the same moment never reads it empty, and all of them end up with the same key."""
    for round_ in range(20):
        data_dir = tmp_path / f"hub{round_}"
        with ThreadPoolExecutor(4) as pool:
            keys = list(pool.map(load_or_create_key, [data_dir] * 4))
        assert len({k.public_key().public_bytes(serialization.Encoding.Raw,
                                                serialization.PublicFormat.Raw)
                    for k in keys}) == 1
        assert sorted(p.name for p in data_dir.iterdir()) == [KEY_FILENAME]
        assert (data_dir / KEY_FILENAME).stat().st_mode & 0o777 == 0o600


# ---------------------------------------------------------------------- page sessions

NOW = 1_000 * 10**9  # page-session times are the callers' wall clock, in nanoseconds


def sid(n: int) -> str:
    return token_hash(f"session {n}")  # a session is kept by its id's SHA-256 hex


async def page_token(hub: HubStore, name: str) -> str:
    return token_hash(await hub.tokens.create(role="read", name=name))


async def test_a_page_session_is_found_until_it_expires_or_ends(hub_store: HubStore) -> None:
    owner = await page_token(hub_store, "viewer")
    kept = PageSession(token_sha256=owner, csrf="csrf-1", expires_ns=NOW + 100)
    await hub_store.add_page_session(sid(1), kept, now_ns=NOW, keep=4)
    assert await hub_store.page_session(sid(1), now_ns=NOW) == kept
    assert await hub_store.page_session(sid(1), now_ns=NOW + 99) == kept
    assert await hub_store.page_session(sid(1), now_ns=NOW + 100) is None  # expired
    assert await hub_store.page_session(sid(2), now_ns=NOW) is None
    await hub_store.end_page_session(sid(1))
    assert await hub_store.page_session(sid(1), now_ns=NOW) is None
    await hub_store.end_page_session(sid(1))  # ending it again is harmless


async def test_adding_a_page_session_sweeps_the_expired_ones(hub_store: HubStore) -> None:
    viewer, editor = await page_token(hub_store, "viewer"), await page_token(hub_store, "editor")
    await hub_store.add_page_session(sid(1), PageSession(viewer, "a", NOW + 10), now_ns=NOW,
                                     keep=4)
    await hub_store.add_page_session(sid(2), PageSession(viewer, "b", NOW + 50), now_ns=NOW,
                                     keep=4)
    await hub_store.add_page_session(sid(3), PageSession(editor, "c", NOW + 90), now_ns=NOW + 20,
                                     keep=4)
    # asked as of an earlier time, a swept session would still count: it is gone
    assert await hub_store.page_session(sid(1), now_ns=NOW) is None
    assert await hub_store.page_session(sid(2), now_ns=NOW) is not None  # not yet expired


async def test_a_token_keeps_its_newest_page_sessions_and_never_ends_anothers(
        hub_store: HubStore) -> None:
    """Bug: one pool for every token, so a read token signing in again and again ended an
    admin's session. Now only the signing-in token's own oldest end."""
    admin, reader = await page_token(hub_store, "admin"), await page_token(hub_store, "reader")
    await hub_store.add_page_session(sid(0), PageSession(admin, "admin", NOW + 100), now_ns=NOW,
                                     keep=3)
    for n in range(1, 9):
        await hub_store.add_page_session(sid(n), PageSession(reader, f"r{n}", NOW + 100),
                                         now_ns=NOW, keep=3)
    found = [await hub_store.page_session(sid(n), now_ns=NOW) for n in range(9)]
    assert found[0] == PageSession(admin, "admin", NOW + 100)
    assert [s.csrf if s else None for s in found[1:]] == [None] * 5 + ["r6", "r7", "r8"]


async def test_an_expired_page_session_leaves_its_token_room(hub_store: HubStore) -> None:
    """The cap counts a token's live sessions: an expired one ends first, not a live one."""
    owner = await page_token(hub_store, "viewer")
    await hub_store.add_page_session(sid(1), PageSession(owner, "1", NOW + 10), now_ns=NOW, keep=2)
    await hub_store.add_page_session(sid(2), PageSession(owner, "2", NOW + 99), now_ns=NOW, keep=2)
    await hub_store.add_page_session(sid(3), PageSession(owner, "3", NOW + 99), now_ns=NOW + 10,
                                     keep=2)  # sid(1) expired: sid(2) stays
    assert [await hub_store.page_session(sid(n), now_ns=NOW + 10) is not None
            for n in (1, 2, 3)] == [False, True, True]


# ---------------------------------------------------------------------- recall

async def test_recall_finds_words_identifiers_and_paths(hub_store: HubStore) -> None:
    await hub_store.apply([
        node("memory:deploy", "release: run scripts/deploy.sh then tag the build", 1),
        node("memory:db", "the staging database is postgres 15 on port 5433", 1),
        node("memory:home", "buy oat milk", 1, realm="home"),
    ], [], model=MODEL)
    hits = await hub_store.recall(QueryRequest(query="deploy"))
    assert hits.memories[0].id == "memory:deploy" and not hits.fallback
    hits = await hub_store.recall(QueryRequest(query="staging database port"))
    assert hits.memories[0].id == "memory:db"
    hits = await hub_store.recall(QueryRequest(query="milk", realms=["work"]))
    assert "memory:home" not in [m.id for m in hits.memories]
    assert "oat milk" not in hits.context and "staging database" in hits.context


async def test_recall_tag_filters_are_case_sensitive_literal_substrings(
        hub_store: HubStore) -> None:
    """One answer on both stores, the plane's on PostgreSQL: ``CI`` is not ``ci``; ``_`` and
    ``%`` are the tag's own characters."""
    await hub_store.apply([
        node("memory:lower", "deploy the billing service", 1, tags="ci,ops_team"),
        node("memory:upper", "deploy the billing worker", 1, tags="CI,100%"),
        node("memory:other", "deploy the billing cron", 1, tags="opsXteam"),
    ], [], model=MODEL)

    async def tagged(*tags: str) -> list[str]:
        hits = await hub_store.recall(QueryRequest(query="deploy billing", tags=list(tags)))
        return sorted(m.id for m in hits.memories if not m.fallback)

    assert await tagged("CI") == ["memory:upper"]
    assert await tagged("ci") == ["memory:lower"]
    assert await tagged("ops_team") == ["memory:lower"]
    assert await tagged("100%") == ["memory:upper"]
    assert await tagged("I,1") == ["memory:upper"]  # a substring of the comma string
    assert await tagged("Ci") == []


@pytest.mark.parametrize("query", ['"', "*", "NEAR(", "a & b | !c", "'unbalanced", "x" * 10_000,
                                   "deploy:*", "(((", "\\"])
async def test_recall_takes_any_text(hub_store: HubStore, query: str) -> None:
    await hub_store.apply([node("memory:a", "something to find", 1)], [], model=MODEL)
    answer = await hub_store.recall(QueryRequest(query=query))
    assert isinstance(answer.memories, list)


async def test_semantic_recall_uses_vectors_and_reembeds_rows_pushed_without(
        hub_store: HubStore) -> None:
    await hub_store.apply([node("memory:novec", "kubernetes cluster autoscaler settings", 1,
                                vector=False)], [], model=MODEL)
    assert await hub_store.reembed_missing() == 1
    assert await hub_store.reembed_missing() == 0
    nodes, _, _, _ = await hub_store.feed(None)
    assert nodes[0].embedding is not None  # the hub's own vector now travels too
    # the hashing embedder shares character n-grams: a near-paraphrase, no shared word
    hits = await hub_store.recall(QueryRequest(query="kubernetess clusterr autoscalerr"))
    assert [m.id for m in hits.memories][:1] == ["memory:novec"]


async def test_stats_count_live_rows_tombstones_and_edges(hub_store: HubStore) -> None:
    await hub_store.apply([node("memory:a", "a", 1), node("memory:b", "b", 1, deleted=True)],
                          [edge("memory:a", "memory:b", 1)], model=MODEL)
    stats = await hub_store.stats()
    assert (stats["memories"], stats["tombstones"], stats["edges"]) == (1, 1, 1)

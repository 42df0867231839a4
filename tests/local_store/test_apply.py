"""Applying remote rows: LWW, idempotence, order independence, redaction, per-row errors
(RELIABILITY R1, R2, R5, R12, R14, R18 and P5 at the store level)."""

from __future__ import annotations

import asyncio
import gc
import os
import random
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from local_store import Store, apply, writes
from local_store.apply import WireKey, node_from_wire, wire_key
from local_store.errors import ValidationError
from local_store.merge import NODE_HASHED, content_hash
from local_store.writes import KEYS_OF_JSON_IDS
from protocol.rows import EdgeRow, NodeRow, edge_id
from protocol.timestamp import format_autosi, format_ns
from tests.store_probe import dump_tables, outbox_items, reconcile

T0 = 1_780_000_000_000_000_000
MODEL = "plane-model"


@pytest.fixture(autouse=True, params=["helper", "inline"])
def hashing(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test here runs twice: with the wire rows hashed in the store's helper thread (as
    big batches are) and in the writer's own thread (as small ones are)."""
    monkeypatch.setattr(apply, "HELPER_FROM", 1 if request.param == "helper" else 10**9)


def node(i: int, version_ns: int, *, origin: str = "", content: str = "c", deleted: bool = False,
         autosi: bool = False, **extra: Any) -> NodeRow:
    stamp = format_autosi(version_ns) if autosi else format_ns(version_ns)
    return NodeRow(id=f"memory:{i:08d}", realm="p", memory_type="fact", content=content,
                   updated_at=stamp, created_at=stamp, importance=0.5, status="active",
                   origin=origin or None, deleted=deleted or None,
                   embedding=[1.0, 0.0, 0.0], **extra)


async def state(store: Store) -> dict[str, Any]:
    nodes, edges = await store.feed.read(include_deleted=True, model=MODEL)
    return {"nodes": sorted((n.id, n.updated_at, n.origin, n.content, n.deleted, n.embedding)
                            for n in nodes),
            "edges": sorted((e.id, e.updated_at, e.deleted, e.props) for e in edges)}


async def test_apply_is_idempotent(store: Store) -> None:
    rows = [node(i, T0 + i * 1000) for i in range(20)]
    edges = [EdgeRow(src=rows[0].id, dst=rows[1].id, type="RELATES_TO",
                     created_at=format_ns(T0))]
    first = await store.replication.apply(rows, edges, model=MODEL)
    assert (first.applied_nodes, first.applied_edges) == (20, 1)
    snapshot = await dump_tables(store)
    for _ in range(3):
        again = await store.replication.apply(rows, edges, model=MODEL)
        assert (again.applied_nodes, again.applied_edges) == (0, 0)
        assert (again.skipped_nodes, again.skipped_edges) == (20, 1)
    assert await dump_tables(store) == snapshot


async def test_applied_rows_are_not_queued_for_push(store: Store) -> None:
    await store.replication.apply([node(1, T0)], [], model=MODEL)
    assert await outbox_items(store) == []


async def test_newer_remote_replaces_a_pending_local_edit_and_older_does_not(
        store: Store) -> None:
    local = await store.memories.save({"content": "local edit"})
    mine = (await store.memories.get(local["id"]))["updated_at"]
    older = NodeRow(id=local["node_id"], content="stale", updated_at="2001-01-01T00:00:00Z")
    res = await store.replication.apply([older], [], model=MODEL)
    assert res.applied_nodes == 0 and (await store.memories.get(local["id"]))["content"] == "local edit"
    assert len(await outbox_items(store)) == 1
    newer = NodeRow(id=local["node_id"], content="remote wins", updated_at="2999-01-01T00:00:00Z")
    await store.replication.apply([newer], [], model=MODEL)
    assert (await store.memories.get(local["id"]))["content"] == "remote wins"
    assert await outbox_items(store) == []
    assert mine < "2999"


async def test_stale_update_never_resurrects_a_tombstone(store: Store) -> None:
    await store.replication.apply([node(1, T0 + 10, deleted=True)], [], model=MODEL)
    await store.replication.apply([node(1, T0 + 5, content="old update")], [], model=MODEL)
    nodes, _ = await store.feed.read(include_deleted=True)
    assert nodes[0].deleted is True
    assert (await store.maintenance.stats())["memories"] == 0


async def test_equal_versions_pick_the_same_winner_everywhere(tmp_path: Path) -> None:
    """R14: identical updated_at strings from two replicas → one deterministic winner."""
    a = node(1, T0, origin="aaaa", content="from a")
    b = node(1, T0, origin="bbbb", content="from b")
    c = node(1, T0, origin="bbbb", content="from b, other text")
    winners = []
    for order in ([a, b, c], [c, b, a], [b, a, c]):
        s = await Store.open(tmp_path / str(len(winners)))
        for row in order:
            await s.replication.apply([row], [], model=MODEL)
        winners.append((await s.feed.read())[0][0].content)
        await s.close()
    assert len(set(winners)) == 1
    expected = max([a, b, c], key=lambda r: (r.updated_at, r.origin, content_hash(
        {**{k: getattr(r, k, None) for k in NODE_HASHED}, "deleted": 0, "tags": "",
         "labels": None, "content_preview": r.content}, NODE_HASHED)))
    assert winners[0] in ("from b", "from b, other text") and expected.origin == "bbbb"


async def test_plane_timestamp_forms_are_stored_canonical(store: Store) -> None:
    await store.replication.apply([node(1, T0, autosi=True)], [], model=MODEL)
    nodes, _ = await store.feed.read()
    assert nodes[0].updated_at == format_ns(T0)
    res = await store.replication.apply([NodeRow(id="memory:z", content="x",
                                     updated_at="2026-06-01T12:00:00.5Z")], [], model=MODEL)
    assert res.applied_nodes == 1


async def test_one_bad_row_is_reported_and_the_rest_apply(store: Store) -> None:
    rows = [node(1, T0), NodeRow(id="memory:bad", updated_at="not a time"), node(2, T0),
            NodeRow(content="no id", updated_at=format_ns(T0)),
            NodeRow(id="memory:vec", updated_at=format_ns(T0), embedding=[float("nan")])]
    res = await store.replication.apply(rows, [EdgeRow(src="a", dst="", type="T", created_at="x")],
                            model=MODEL)
    assert res.applied_nodes == 2
    assert [(p.kind, p.index, p.field) for p in res.problems] == [
        ("node", 1, "updated_at"), ("node", 3, "id"), ("node", 4, "embedding"),
        ("edge", 0, "dst")]


async def test_imported_text_is_redacted(store: Store) -> None:
    row = NodeRow(id="memory:p", content="a <private>CANARY-1</private> b",
                  title="<private>CANARY-2", tags="x,<private>CANARY-3</private>",
                  provenance='{"k":"<private>CANARY-4</private>"}', updated_at=format_ns(T0))
    edge = EdgeRow(src="memory:p", dst="x", type="T", props="<private>CANARY-5</private>",
                   created_at=format_ns(T0))
    await store.replication.apply([row], [edge], model=MODEL)
    dump = repr(await dump_tables(store))
    assert "CANARY" not in dump and "[redacted]" in dump


async def test_a_vector_that_came_with_private_text_is_not_kept(store: Store) -> None:
    """A writer that does not redact (the plane) embedded the private span: the vector would
    answer for the secret, so it is dropped and the redacted text is embedded again later."""
    clean = NodeRow(id="memory:clean", content="nothing secret", embedding=[0.6, 0.8],
                    updated_at=format_ns(T0))
    secret = NodeRow(id="memory:secret", content="pin <private>4321</private>",
                     embedding=[0.8, 0.6], updated_at=format_ns(T0))
    await store.replication.apply([clean, secret], [], model=MODEL)
    nodes, _ = await store.feed.read(model=MODEL)
    vectors = {n.id: n.embedding for n in nodes}
    assert vectors["memory:clean"] is not None and vectors["memory:secret"] is None


async def test_edges_dedupe_by_id_and_arrive_before_their_endpoints(store: Store) -> None:
    """R18: an edge before its endpoint, three times, from another realm → one edge."""
    edge = EdgeRow(src="memory:later", dst="memory:other", type="RELATES_TO", realm="elsewhere",
                   created_at=format_ns(T0))
    for _ in range(3):
        await store.replication.apply([], [edge], model=MODEL)
    await store.replication.apply([node(7, T0)], [], model=MODEL)
    _, edges = await store.feed.read()
    assert [e.id for e in edges] == [edge_id("memory:later", "memory:other", "RELATES_TO")]


async def test_plane_edge_tombstone_in_props(store: Store) -> None:
    e = EdgeRow(src="a", dst="b", type="T", created_at=format_ns(T0))
    tomb = EdgeRow(src="a", dst="b", type="T", created_at=format_ns(T0 + 1000),
                   props='{"deleted":true,"deleted_at":"x"}')
    await store.replication.apply([], [tomb, e], model=MODEL)
    _, edges = await store.feed.read(include_deleted=True)
    assert edges[0].deleted is True


async def test_apply_receives_stamps_into_the_clock(store: Store) -> None:
    future = store.clock.physical_ns() + 60 * 1_000_000_000
    await store.replication.apply([node(1, future)], [], model=MODEL)
    res = await store.memories.save({"content": "after"})
    assert (await store.memories.get(res["id"]))["updated_at"] > format_ns(future)


# ------------------------------------------------------------------ property: convergence

versions = st.lists(
    st.tuples(st.integers(0, 4), st.integers(0, 6), st.sampled_from(["", "r1", "r2"]),
              st.sampled_from(["x", "y", "z"]), st.booleans()),
    min_size=1, max_size=25)


@settings(max_examples=int(os.environ.get("SYNCD_PROPERTY_EXAMPLES", "25")), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(versions, st.randoms(use_true_random=False), st.integers(1, 5))
def test_any_permutation_and_split_converges(spec: list[tuple[int, int, str, str, bool]],
                                             rng: Any, repeats: int) -> None:
    """R1 + R2: any order, any batch split, any repetition → the same store as the model."""
    rows = [node(i, T0 + v * 1000, origin=o, content=c, deleted=d) for i, v, o, c, d in spec]
    edges = [EdgeRow(src=f"memory:{i:08d}", dst="memory:00000000", type="RELATES_TO",
                     created_at=format_ns(T0 + v * 1000), props=c, deleted=d or None,
                     origin=o or None) for i, v, o, c, d in spec]

    async def run() -> list[dict[str, Any]]:
        results = []
        with tempfile.TemporaryDirectory() as tmp:
            for variant in range(2):
                async with await Store.open(Path(tmp) / str(variant)) as s:
                    shuffled = [*rows, *edges] * (repeats if variant else 1)
                    rng.shuffle(shuffled)
                    cut = rng.randint(0, len(shuffled))
                    for part in (shuffled[:cut], shuffled[cut:]):
                        await s.replication.apply([r for r in part if isinstance(r, NodeRow)],
                                      [r for r in part if isinstance(r, EdgeRow)], model=MODEL)
                    # applies skip SQLite's reference check: every vector still has its memory
                    assert await s._fetch("PRAGMA foreign_key_check") == []
                    results.append(await state(s))
        return results

    first, second = asyncio.run(run())
    assert first == second
    model: dict[str, tuple[str, str, str]] = {}
    for r in rows:
        key = (r.updated_at or "", r.origin or "", r.content or "")
        model[r.id or ""] = max(model.get(r.id or "", key), key, key=lambda k: k)
    got = {n[0]: n for n in first["nodes"]}
    assert set(got) == set(model)
    for mid, (stamp, origin, _) in model.items():
        assert (got[mid][1], got[mid][2] or "") == (stamp, origin)


_STAMPS = [format_ns(T0), format_autosi(T0), format_ns(T0 + 1), "2026-05-01T10:00:00Z",
           "2026-05-01T12:00:00+02:00"]
_TEXTS = [None, "", "a", " b ", "x <private>secret</private> y", "<private>s</private>"]
wire_nodes = st.builds(
    NodeRow, id=st.sampled_from(["memory:1", " memory:2 ", ""]),
    labels=st.sampled_from([None, "Memory"]), realm=st.sampled_from([None, "", "p"]),
    memory_type=st.sampled_from([None, "fact", " Decision ", "weird"]),
    title=st.sampled_from(_TEXTS), content=st.sampled_from(_TEXTS),
    tags=st.sampled_from(_TEXTS), status=st.sampled_from([None, "active", "ARCHIVED", "x"]),
    importance=st.sampled_from([None, 0.5, 1, 2.0, -1.0, -0.0, 0.0, float("nan"), True]),
    created_at=st.sampled_from([None, *_STAMPS]), updated_at=st.sampled_from([None, *_STAMPS]),
    valid_at=st.sampled_from([None, *_STAMPS]), invalid_at=st.sampled_from([None, *_STAMPS]),
    provenance=st.sampled_from([None, '{"s": 1}', '{"a": "<private>x</private>"}']),
    origin=st.sampled_from([None, "", "r1"]), deleted=st.sampled_from([None, False, True]))


_CANONICAL = NodeRow(id="memory:1", realm="p", memory_type="fact", content="a", tags="",
                     status="active", importance=0.5, created_at=format_ns(T0),
                     updated_at=format_ns(T0))


@settings(max_examples=int(os.environ.get("SYNCD_PROPERTY_EXAMPLES", "25")) * 20, deadline=None)
@given(st.one_of(wire_nodes, st.builds(
    msgspec.structs.replace, st.just(_CANONICAL),  # rows normalising leaves as they are...
    importance=st.sampled_from([0.5, 0.0, -0.0, 1.0, 1]),  # ...but for what it must change
    deleted=st.sampled_from([None, True]), provenance=st.sampled_from([None, '{"s": 1}']))))
@example(msgspec.structs.replace(_CANONICAL, importance=-0.0))  # == 0.0, printed otherwise
def test_a_wire_rows_own_hash_is_reused_only_when_it_is_the_rows_hash(wire: NodeRow) -> None:
    """``node_from_wire`` given the wire row's key (hashed as it came, in a helper thread)
    builds exactly the row it builds alone: the key's hash is taken only when normalising
    changed no hashed value, so every timestamp form, redaction, default and clamp above
    still gets its own hash."""
    def outcome(key: WireKey | None) -> object:
        try:
            return node_from_wire(wire, key)
        except ValidationError as exc:
            return exc.field, exc.message
    alone = outcome(None)
    assert outcome(wire_key(wire)) == alone
    if isinstance(alone, dict):
        assert alone["content_hash"] == content_hash(alone, NODE_HASHED)


async def test_reapply_fast_path_only_skips_the_exact_held_version(store: Store) -> None:
    """Same (updated_at, origin) but other content is not "already held": LWW decides."""
    first = node(1, T0, origin="r1", content="aaa")
    await store.replication.apply([first], [], model=MODEL)
    same = await store.replication.apply([node(1, T0, origin="r1", content="aaa")], [], model=MODEL)
    assert (same.applied_nodes, same.skipped_nodes) == (0, 1)
    other = node(1, T0, origin="r1", content="zzz")
    res = await store.replication.apply([other], [], model=MODEL)
    kept = (await store.feed.read())[0][0].content
    assert res.applied_nodes + res.skipped_nodes == 1
    # the same two versions in the other order pick the same winner
    async with await Store.open(store.data_dir.parent / "other") as s2:
        await s2.replication.apply([other], [], model=MODEL)
        await s2.replication.apply([first], [], model=MODEL)
        assert (await s2.feed.read())[0][0].content == kept
    # a plane-form timestamp of the held version is normalised first, then skipped
    autosi = node(1, T0, origin="r1", content=kept or "", autosi=True)
    assert (await store.replication.apply([autosi], [], model=MODEL)).skipped_nodes == 1


async def test_keyword_index_matches_the_rows_after_shuffled_batches(tmp_path: Path) -> None:
    """Applies write the FTS index in bulk, sorted by rowid: whatever order the batches carry
    new rows, updates and tombstones in, the index passes FTS5's own integrity check, each live
    row is found by its own word and nothing else is indexed. (The check against the content
    table does not apply: tombstones stay in ``memories`` and are deliberately not indexed.)"""
    rng = random.Random(7)
    versions = [node(i, T0 + v * 1000, origin=rng.choice(["", "r1"]), content=f"w{i}x{v} common",
                     deleted=rng.random() < 0.2)
                for i in range(300) for v in rng.sample(range(5), 3)]
    rng.shuffle(versions)
    async with await Store.open(tmp_path / "s") as s:
        for start in range(0, len(versions), 97):
            await s.replication.apply(versions[start:start + 97], [], model=MODEL)
        live_ids = [n.id for n in (await s.feed.read(model=MODEL))[0]]
        await s.memories.delete(live_ids[0], hard=True)
        live = {n.id: n.content for n in (await s.feed.read(include_deleted=False, model=MODEL))[0]}
    conn = sqlite3.connect(tmp_path / "s" / "memory.db")
    try:
        conn.execute("INSERT INTO memories_fts (memories_fts, rank) VALUES ('integrity-check', 0)")
        assert len(live) > 100
        for mid, content in live.items():
            word = (content or "").split()[0]
            found = conn.execute("SELECT m.id FROM memories_fts JOIN memories m "
                                 "ON m.rowid = memories_fts.rowid WHERE memories_fts MATCH ?",
                                 (f'"{word}"',)).fetchall()
            assert found == [(mid,)], word
        assert conn.execute("SELECT count(*) FROM memories_fts WHERE memories_fts MATCH 'common'"
                            ).fetchone()[0] == len(live)
    finally:
        conn.close()


async def test_new_and_held_ids_mix_in_one_batch(store: Store) -> None:
    """New ids take plain INSERTs: an id already held (even sent with surrounding spaces) or sent
    twice in one batch must still be an update, never a duplicate-key failure."""
    await store.replication.apply([node(1, T0, content="one"), node(2, T0, content="two")], [], model=MODEL)
    spaced = node(1, T0 + 5, content="one, newer")
    spaced.id = f"  {spaced.id} "
    batch = [spaced, node(3, T0, content="three"), node(3, T0 + 9, content="three, newer"),
             node(2, T0 - 1, content="two, older"), node(4, T0, content="four")]
    result = await store.replication.apply(batch, [], model=MODEL)
    assert not result.problems
    assert (result.applied_nodes, result.skipped_nodes) == (4, 1)  # only 2's older version loses
    contents = {n.id: n.content for n in (await store.feed.read(model=MODEL))[0]}
    assert contents == {"memory:00000001": "one, newer", "memory:00000002": "two",
                        "memory:00000003": "three, newer", "memory:00000004": "four"}
    found = await store.recall.query({"query": "newer"}, mode="keyword")
    assert {m.id for m in found.memories} >= {"memory:00000001", "memory:00000003"}


async def test_rows_with_different_null_columns_store_exactly_what_they_carry(
        store: Store) -> None:
    """Rows are written in groups by which columns are NULL (literal NULLs instead of bound
    Nones): every pattern, new or replacing a version with the opposite pattern, stores its
    own values — a field cleared by the newer version is NULL, not left over."""
    def version(i: int, ns: int, filled: bool) -> NodeRow:
        extra = ({"title": f"t{i}", "topic_key": f"k{i}", "superseded_by": "memory:x",
                  "provenance": '{"a":1}', "invalid_at": format_ns(ns), "space": "s"}
                 if filled else {})
        return node(i, ns, content=f"c{i}-{filled}", **extra)

    first = [version(i, T0, filled=i % 2 == 0) for i in range(40)]
    await store.replication.apply(first, [], model=MODEL)
    second = [version(i, T0 + 10, filled=i % 2 == 1) for i in range(0, 40, 3)]  # flip a third
    await store.replication.apply(second, [], model=MODEL)
    got = {n.id: n for n in (await store.feed.read(model=MODEL, include_deleted=True))[0]}
    expected = {r.id: r for r in first} | {r.id: r for r in second}
    assert set(got) == set(expected)
    for mid, sent in expected.items():
        held = got[mid]
        for name in ("title", "topic_key", "superseded_by", "provenance", "invalid_at",
                     "space", "content", "updated_at"):
            assert getattr(held, name) == getattr(sent, name), (mid, name)


def _writer_checks_references(store: Store) -> bool:
    return bool(store._writer.conn.execute("PRAGMA foreign_keys").fetchone()[0])


async def test_batch_applies_keep_every_vector_with_its_memory(store: Store) -> None:
    """Applies, pulls and reconciles run without SQLite's per-vector reference check; their
    vectors must still all belong to memory rows (new, updated, deleted, hard-deleted, redacted,
    re-applied), and the writer checks references again afterwards — also after a failure."""
    rows = [node(i, T0 + i) for i in range(30)]
    await store.replication.apply(rows, [], model=MODEL)
    changed = [node(i, T0 + 1000 + i, content=f"v2 {i}") for i in range(0, 30, 3)]
    changed += [node(i, T0 + 1000 + i, deleted=True) for i in range(1, 30, 3)]
    changed += [node(i, T0 + 1000 + i, content="", deleted=True) for i in range(2, 30, 9)]
    changed += [node(100, T0, content="key <private>sk-1</private>")]
    await store.replication.apply(changed, [], model=MODEL)
    await store.replication.apply(changed, [], model=MODEL)
    await store.replication.pull([node(200 + i, T0 + i) for i in range(10)], [], model=MODEL,
                     state={"cursor": "c1"})
    await reconcile(store, [node(300 + i, T0 + i) for i in range(10)], [], model=MODEL)
    assert await store._fetch("PRAGMA foreign_key_check") == []
    vectors = await store._fetch("SELECT count(*) FROM vectors v JOIN memories m "
                                 "ON m.id = v.memory_id WHERE m.deleted = 0")
    assert vectors[0][0] > 30  # the check looked at real rows
    assert _writer_checks_references(store)

    before = await dump_tables(store)
    try:
        await store.replication.apply([node(400, T0), "not a row"], [], model=MODEL)  # type: ignore[list-item]
    except Exception:
        pass
    else:
        raise AssertionError("a batch holding a non-row must fail")
    assert await dump_tables(store) == before
    assert _writer_checks_references(store)


async def test_the_reference_check_sees_an_orphan_vector(store: Store) -> None:
    """The check the test above relies on does find a vector without its memory."""
    await store.replication.apply([node(1, T0)], [], model=MODEL)
    conn = store._writer.conn
    conn.execute("PRAGMA foreign_keys = OFF")
    try:
        conn.execute("INSERT INTO vectors (memory_id, model, dim, vec) "
                     "VALUES ('memory:nowhere', 'm', 1, x'00000000')")
    finally:
        conn.execute("PRAGMA foreign_keys = ON")
    assert [tuple(r) for r in await store._fetch("PRAGMA foreign_key_check")] == [
        ("vectors", 2, "memories", 0)]


async def test_reapply_finds_held_ids_with_any_characters(store: Store) -> None:
    """The re-apply lookup sends ids as JSON (or, for ids holding a NUL, which JSON cannot
    carry through SQLite, as IN lists): every id must be found again, so a re-applied batch
    skips every row instead of failing on a duplicate insert."""
    odd = ["memory:a\x00b", 'memory:q"uote\\', "memory:é✓𝄞", "memory:tab\tnl\n", "memory:x"]
    rows = [msgspec.structs.replace(node(0, T0 + i, content=f"c{i}"), id=mid)
            for i, mid in enumerate(odd)]
    plain = [r for r in rows if "\x00" not in (r.id or "")]
    first = await store.replication.apply(rows, [], model=MODEL)
    assert (first.applied_nodes, first.problems) == (len(odd), [])
    snapshot = await dump_tables(store)
    assert store._writer.json_ids  # this SQLite has json_each; without it, IN lists for all
    for json_ids in (True, False):
        store._writer.json_ids = json_ids
        for batch in (rows, plain, rows[::-1]):
            again = await store.replication.apply(batch, [], model=MODEL)
            assert (again.applied_nodes, again.skipped_nodes, again.problems) == (
                0, len(batch), [])
    assert await dump_tables(store) == snapshot


async def test_a_reapply_lookup_split_into_chunks_finds_every_id(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Big batches are looked up 20,000 ids a statement: every chunk's answer counts."""
    rows = [node(i, T0 + i) for i in range(7)]
    await store.replication.apply(rows, [], model=MODEL)
    monkeypatch.setattr(writes, "JSON_IDS_CHUNK", 3)
    again = await store.replication.apply(rows, [], model=MODEL)
    assert (again.applied_nodes, again.skipped_nodes) == (0, 7)


async def test_the_reapply_lookup_searches_the_primary_key(store: Store) -> None:
    """One probe of the id index per wanted id, never a scan of the table."""
    sql = KEYS_OF_JSON_IDS.format(table="memories")
    plan = [str(r[3]) for r in store._writer.conn.execute(f"EXPLAIN QUERY PLAN {sql}",
                                                          ('["memory:x"]',))]
    assert plan == ["SCAN j VIRTUAL TABLE INDEX 1:",
                    "SEARCH t USING INDEX sqlite_autoindex_memories_1 (id=?)"], plan


async def test_a_refused_rows_message_never_quotes_a_private_span(store: Store) -> None:
    """A bad timestamp's message quotes the value — except when it holds a private span: the
    message goes back in the import answer and into ``syncd status`` (P5, P7)."""
    stamp = format_ns(1_780_000_000_000_000_000)
    result = await store.replication.apply(
        [NodeRow(id="memory:a", content="c", updated_at=stamp, created_at=stamp,
                 valid_at="<private>CANARY123</private>"),
         NodeRow(id="memory:b", content="c", updated_at=stamp, valid_at="soon")],
        [EdgeRow(src="memory:a", dst="memory:b", type="X",
                 created_at="x </private> CANARY123")], model="m")
    problems = {(p.kind, p.id, p.field): p.message for p in result.problems}
    assert problems[("node", "memory:a", "valid_at")] == "invalid RFC 3339 timestamp"
    assert problems[("node", "memory:b", "valid_at")] == "invalid RFC 3339 timestamp: 'soon'"
    assert len(problems) == 3 and not any("CANARY123" in m for m in problems.values())


async def test_a_vector_of_another_width_is_never_pushed(store: Store) -> None:
    """A pulled vector not as wide as the plane's is pushed back as zeros (no vector), never as
    it was: the plane refuses a vector of another width, and it is not the plane model's."""
    stamp = format_ns(1_780_000_000_000_000_000)
    await store.replication.apply([NodeRow(id="memory:a", content="a", updated_at=stamp, created_at=stamp,
                               embedding=[1.0, 0.0, 0.0]),
                       NodeRow(id="memory:b", content="b", updated_at=stamp, created_at=stamp,
                               embedding=[0.0, 1.0, 0.0, 0.0, 0.0])], [], model="plane-model")
    for mid in ("memory:a", "memory:b"):
        await store.memories.update_importance(mid, 0.9)  # local edits queue both for push
    _, nodes, _ = await store.replication.stage_push(10, model="plane-model", dim=3)
    sent = {n.id: n.embedding for n in nodes}
    assert sent == {"memory:a": [1.0, 0.0, 0.0], "memory:b": [0.0, 0.0, 0.0]}


async def test_a_large_batch_runs_with_the_collector_paused(store: Store) -> None:
    """A 10k-row apply allocated its row dicts and tuples by the ten thousand: over a hundred
    automatic collections ran inside it, and in a small process (a daemon) a full one that
    walked every live object, each pulled row's embedding list included (~65 ms per 10k rows).
    A batch of ``HELPER_FROM`` rows or more pauses the collector and leaves it as it was."""
    rng = random.Random(5)
    base = 1_700_000_000 * 10**9
    rows = [msgspec.structs.replace(node(i, base + i, content=f"row {i} " * 20),
                                    embedding=[rng.uniform(-1, 1) for _ in range(384)])
            for i in range(10_000)]
    collections: list[int] = []

    def watch(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    gc.collect()
    gc.callbacks.append(watch)
    try:
        result = await store.replication.apply(rows, [], model="m")
    finally:
        gc.callbacks.remove(watch)
    assert result.applied_nodes == len(rows)
    paused = len(rows) >= apply.HELPER_FROM  # the fixture also runs it with no helper at all
    assert (len(collections) <= 2) if paused else (len(collections) > 50), collections
    assert gc.isenabled()


def test_the_collector_is_restored_as_it_was() -> None:
    assert gc.isenabled()
    with pytest.raises(RuntimeError), apply.gc_paused(True):
        assert not gc.isenabled()
        raise RuntimeError("a failing batch")
    assert gc.isenabled()
    with apply.gc_paused(False):
        assert gc.isenabled()
    gc.disable()
    try:
        with apply.gc_paused(True):
            assert not gc.isenabled()
        assert not gc.isenabled()  # it was off: left off
    finally:
        gc.enable()

"""The write path: save, upsert, dedupe, mutations, judge, entities, links, deletes."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from local_store import (
    NotFoundError,
    Store,
    StoreFullError,
    StoreLockedError,
    StoreUnusableError,
    ValidationError,
)
from local_store.redact import REDACTED
from local_store.writes import bare_tombstone
from protocol.rows import EdgeRow
from protocol.timestamp import format_ns, is_canonical
from tests.store_probe import dump_tables, outbox_items


async def test_save_and_get_round_trip(store: Store) -> None:
    res = await store.memories.save({"content": "Use ruff for linting", "title": "lint",
                            "memory_type": "decision", "tags": ["tooling", "python"],
                            "realm": "proj", "importance": 0.8})
    assert res["saved"] is True and res["node_id"] == f"memory:{res['id']}"
    got = await store.memories.get(res["id"])
    assert got["content"] == "Use ruff for linting"
    assert got["memory_type"] == "decision"
    assert got["tags"] == ["tooling", "python"]
    assert got["realm"] == "proj" and got["importance"] == 0.8 and got["status"] == "active"
    assert is_canonical(got["updated_at"]) and got["created_at"] == got["updated_at"]
    assert got["valid_at"] == got["created_at"] and got["invalid_at"] is None
    assert got["provenance"]["writer"]["source"] == "syncd"
    assert got["origin"] == store.replica_id


async def test_why_where_learned_fold_exactly_like_the_plane(store: Store) -> None:
    res = await store.memories.save({"content": "body ", "why": " because ", "where": "",
                            "learned": "x"})
    got = await store.memories.get(res["node_id"])
    assert got["content"] == "body \nWhy: because\nLearned: x"


async def test_unknown_type_is_coerced_and_reported(store: Store) -> None:
    res = await store.memories.save({"content": "c", "memory_type": "Gossip"})
    assert res["coerced"] == {"memory_type": "unknown memory_type 'Gossip' stored as 'fact'"}
    assert (await store.memories.get(res["id"]))["memory_type"] == "fact"


async def test_preview_is_280_chars_plus_ellipsis(store: Store) -> None:
    res = await store.memories.save({"content": "  " + "é" * 300 + "  "})
    got = await store.memories.get(res["id"])
    assert got["content_preview"] == "é" * 280 + "…"


async def test_importance_is_clamped(store: Store) -> None:
    res = await store.memories.save({"content": "a", "importance": 7})
    assert (await store.memories.get(res["id"]))["importance"] == 1.0
    assert res["coerced"] == {"importance": "importance 7 is outside 0..1: stored as 1"}
    low = await store.memories.save({"content": "b", "importance": -0.5})
    assert (await store.memories.get(low["id"]))["importance"] == 0.0
    assert low["coerced"] == {"importance": "importance -0.5 is outside 0..1: stored as 0"}
    inside = await store.memories.save({"content": "c", "importance": 1})
    assert "coerced" not in inside


async def test_topic_key_upsert_keeps_the_id(store: Store) -> None:
    first = await store.memories.save({"content": "v1", "topic_key": "build", "realm": "p"})
    second = await store.memories.save({"content": "v2", "topic_key": "build", "realm": "p"})
    other = await store.memories.save({"content": "v1", "topic_key": "build", "realm": "q"})
    assert second["upserted"] is True and second["id"] == first["id"]
    assert other["id"] != first["id"]
    assert (await store.memories.get(first["id"]))["content"] == "v2"
    assert (await store.maintenance.stats())["memories"] == 2


async def test_exact_duplicate_is_not_stored_twice(store: Store) -> None:
    first = await store.memories.save({"content": "Deploy with make release", "realm": "p"})
    again = await store.memories.save({"content": "  deploy WITH   make release ", "realm": "p"})
    assert again == {"saved": True, "deduped": True, "id": first["id"],
                     "node_id": first["node_id"]}
    assert (await store.maintenance.stats())["memories"] == 1


async def test_references_become_edges(store: Store) -> None:
    res = await store.memories.save({"content": "touches the repo", "references": ["default::repo:x"]})
    got = await store.memories.get(res["id"])
    assert [e["id"] for e in got["edges"]] == [f"{res['node_id']}->default::repo:x:REFERENCES"]


async def test_save_many_reports_bad_items_and_saves_the_rest(store: Store) -> None:
    res = await store.memories.save_many([{"content": "a"}, {"content": 3}, {"content": "b"}])
    assert res["count"] == 2 and res["ids"][1] is None
    assert res["errors"] == ["#1: memories[1].content: is required and must be a string"]
    with pytest.raises(ValidationError) as exc:
        await store.memories.save_many([])
    assert exc.value.field == "memories"


@pytest.mark.parametrize(("args", "field"), [
    ({}, "content"),
    ({"content": ""}, "content"),
    ({"content": "   "}, "content"),
    ({"content": "<private>all secret</private>"}, "content"),
    ({"content": "x", "tags": "a,b"}, "tags"),
    ({"content": "x", "tags": ["a", 1]}, "tags[1]"),
    ({"content": "x", "tags": ["a,b"]}, "tags[0]"),
    ({"content": "x", "importance": "high"}, "importance"),
    ({"content": "x", "importance": float("nan")}, "importance"),
    ({"content": "x", "importance": True}, "importance"),
    ({"content": "x", "realm": 5}, "realm"),
    ({"content": "x", "title": ["t"]}, "title"),
    ({"content": "x", "valid_at": "yesterday"}, "valid_at"),
    ({"content": "x", "references": "memory:1"}, "references"),
    ({"content": "x" * (256 * 1024 + 1)}, "content"),
])
async def test_bad_input_names_the_field_and_changes_nothing(
        store: Store, args: dict[str, object], field: str) -> None:
    await store.memories.save({"content": "existing"})
    before = await dump_tables(store)
    with pytest.raises(ValidationError) as exc:
        await store.memories.save(args)
    assert exc.value.field == field
    assert await dump_tables(store) == before


@pytest.mark.parametrize(("content", "message"), [
    ("", "is empty"),
    (" \n", "is empty"),
    ("<private>all secret</private>", "is empty after removing <private> sections"),
    ("<private>a</private> <private>b</private>", "is empty after removing <private> sections"),
])
async def test_empty_content_says_whether_redaction_emptied_it(
        store: Store, content: str, message: str) -> None:
    with pytest.raises(ValidationError) as exc:
        await store.memories.save({"content": content})
    assert (exc.value.field, exc.value.message) == ("content", message)


async def test_status_and_importance_updates_make_new_versions(store: Store) -> None:
    res = await store.memories.save({"content": "x"})
    v1 = (await store.memories.get(res["id"]))["updated_at"]
    await store.memories.update_status(res["id"], "background")
    await store.memories.update_importance(res["node_id"], 0.9)
    got = await store.memories.get(res["id"])
    assert got["status"] == "background" and got["importance"] == 0.9
    assert got["updated_at"] > v1
    before = await dump_tables(store)
    with pytest.raises(ValidationError) as exc:
        await store.memories.update_status(res["id"], "gone")
    assert exc.value.field == "status"
    with pytest.raises(NotFoundError):
        await store.memories.update_importance("memory:nope", 0.1)
    assert await dump_tables(store) == before


async def test_judge_supersedes_invalidates_with_edge(store: Store) -> None:
    old = await store.memories.save({"content": "we deploy on fridays", "realm": "p"})
    new = await store.memories.save({"content": "we never deploy on fridays", "realm": "p"})
    res = await store.graph.judge(new["id"], old["id"], "Supersedes", "policy changed")
    assert res["verdict"] == "supersedes"
    got = await store.memories.get(old["id"])
    assert got["superseded_by"] == new["node_id"] and got["invalid_at"] is not None
    edge = next(e for e in got["edges"] if e["type"] == "INVALIDATES")
    assert edge["src"] == new["node_id"] and edge["props"] == {"reason": "policy changed"}
    listed = await store.memories.list_memories({"realm": "p"})
    assert [r["id"] for r in listed["rows"]] == [new["node_id"]]


async def test_judge_merged_archives_and_other_verdicts_relate(store: Store) -> None:
    a = await store.memories.save({"content": "a"})
    b = await store.memories.save({"content": "b"})
    c = await store.memories.save({"content": "c"})
    merged = await store.graph.judge(a["id"], b["id"], "merged")
    assert merged == {"ok": True, "verdict": "merged", "into": a["node_id"], "from": b["node_id"]}
    assert (await store.memories.get(b["id"]))["status"] == "archived"
    into = next(e for e in (await store.memories.get(b["id"]))["edges"] if e["type"] == "MERGED_INTO")
    assert into["props"] is None  # no reason given, no props
    await store.graph.judge(a["id"], c["id"], "conflicts", "they disagree")
    edge = next(e for e in (await store.memories.get(c["id"]))["edges"] if e["type"] == "RELATES_TO")
    assert edge["props"] == {"verdict": "conflicts", "reason": "they disagree"}
    with pytest.raises(NotFoundError):
        await store.graph.judge(a["id"], "memory:missing", "related")


async def test_ingest_entity_is_idempotent_per_realm_kind_name(store: Store) -> None:
    first = await store.graph.ingest_entity({"name": "Billing API", "kind": "service",
                                       "properties": {"owner": "team-a", "port": 8080},
                                       "links": [{"target_node_id": "github::repo:billing",
                                                  "target_namespace": "github",
                                                  "relationship_type": "RESOLVES_TO"}]})
    again = await store.graph.ingest_entity({"name": "billing api", "kind": "service"})
    assert first["topic_key"] == "entity/service/billing-api"
    assert again["upserted"] is True and again["id"] == first["id"]
    got = await store.memories.get(first["id"])
    assert got["memory_type"] == "entity" and got["content"].startswith("billing api\nKind: service")
    with pytest.raises(ValidationError) as exc:
        await store.graph.ingest_entity({"name": "  "})
    assert exc.value.field == "name"



async def test_entity_names_in_any_script_keep_their_identity(store: Store) -> None:
    """The slug keeps Unicode letters and digits, as the plane's (Rust ``is_alphanumeric``):
    an ASCII-only slug made every non-Latin name ``entity/city/``, so 大阪 overwrote 東京."""
    tokyo = await store.graph.ingest_entity({"name": "東京", "kind": "city"})
    osaka = await store.graph.ingest_entity({"name": "大阪", "kind": "city"})
    cafe = await store.graph.ingest_entity({"name": "Café Olé_2", "kind": "place"})
    assert (tokyo["topic_key"], osaka["topic_key"], cafe["topic_key"]) == (
        "entity/city/東京", "entity/city/大阪", "entity/place/café-olé-2")
    assert osaka["upserted"] is False and osaka["id"] != tokyo["id"]
    assert (await store.memories.get(tokyo["id"]))["title"] == "東京"
    again = await store.graph.ingest_entity({"name": "CAFÉ olé 2", "kind": "place"})
    assert again["upserted"] is True and again["id"] == cafe["id"]


async def test_link_defaults_to_the_memorys_realm(store: Store) -> None:
    m = await store.memories.save({"content": "x", "realm": "proj"})
    res = await store.graph.link({"memory_id": m["id"], "target_node_id": "default::repo:y"})
    assert res["type"] == "REFERENCES"
    edge = (await store.memories.get(m["id"]))["edges"][0]
    assert edge["realm"] == "proj"
    with pytest.raises(NotFoundError):
        await store.graph.link({"memory_id": "memory:none", "target_node_id": "x"})


async def test_session_summary(store: Store) -> None:
    res = await store.memories.session_summary({"goal": "ship", "files": ["a.py", "b.py"]})
    got = await store.memories.get(res["id"])
    assert got["content"] == "Session summary.\nGoal: ship\nFiles: a.py, b.py"
    assert got["memory_type"] == "summary" and got["tags"] == ["session-summary"]
    with pytest.raises(ValidationError):
        await store.memories.session_summary({})


async def test_soft_and_hard_delete_leave_tombstones(store: Store) -> None:
    soft = await store.memories.save({"content": "soft one", "references": ["x::y"]})
    hard = await store.memories.save({"content": "hard secret text"})
    await store.memories.delete(soft["id"])
    await store.memories.delete(hard["id"], hard=True)
    for res in (soft, hard):
        with pytest.raises(NotFoundError):
            await store.memories.get(res["id"])
    nodes, edges, _ = (await store.feed.page(0))[:3]
    tombs = {n.id: n for n in nodes if n.deleted}
    assert set(tombs) == {soft["node_id"], hard["node_id"]}
    assert tombs[hard["node_id"]].content == ""
    assert tombs[hard["node_id"]].embedding == [0.0] * 384  # the plane's "no vector"
    assert all(e.deleted and '"deleted":true' in (e.props or "") for e in edges)
    assert (await store.maintenance.stats())["memories"] == 0



async def test_a_hard_delete_purges_every_user_text_also_after_a_soft_delete(
        store: Store) -> None:
    """Hard delete purges the text, the identity keys and the reasons on the memory's edges —
    whether it follows a soft delete (whose tombstone keeps the text, and whose edge
    tombstones keep their props) or not. Deleting a tombstone once more is not_found."""
    canary = "purgecanary7741"
    for soft_first in (False, True):
        victim = await store.memories.save({"content": f"plan {canary}", "title": f"t {canary}",
                                   "topic_key": f"project/{canary}", "tags": [canary]})
        other = await store.memories.save({"content": f"other memory {soft_first}"})
        await store.graph.judge(other["id"], victim["id"], "conflicts", f"because {canary}")
        if soft_first:
            await store.memories.delete(victim["id"])
            assert canary in json.dumps(await dump_tables(store), default=str)  # soft keeps it
            with pytest.raises(NotFoundError):
                await store.memories.delete(victim["id"])
        await store.memories.delete(victim["id"], hard=True)
        assert canary not in json.dumps(await dump_tables(store), default=str), soft_first
        with pytest.raises(NotFoundError):
            await store.memories.delete(victim["id"], hard=True)  # nothing left to purge
        nodes, edges, _ = (await store.feed.page(0))[:3]
        assert [n.content for n in nodes if n.id == victim["node_id"]] == [""]
        assert all(e.deleted and bare_tombstone(e.props) for e in edges
                   if victim["node_id"] in (e.src, e.dst))


async def test_list_filters(store: Store) -> None:
    await store.memories.save({"content": "a", "realm": "r1", "tags": ["x", "y"], "memory_type": "decision"})
    await store.memories.save({"content": "b", "realm": "r1", "tags": ["xy"]})
    c = await store.memories.save({"content": "c", "realm": "r2"})
    await store.memories.update_status(c["id"], "archived")
    assert [r["content_preview"] for r in (await store.memories.list_memories({"tags": ["x"]}))["rows"]] == ["a"]
    assert len((await store.memories.list_memories({"realm": "r1"}))["rows"]) == 2
    assert (await store.memories.list_memories({"status": "archived"}))["rows"][0]["content_preview"] == "c"
    assert len((await store.memories.list_memories({"memory_type": "decision"}))["rows"]) == 1
    assert len((await store.memories.list_memories({"limit": 1}))["rows"]) == 1
    with pytest.raises(ValidationError) as exc:
        await store.memories.list_memories({"limit": "ten"})
    assert exc.value.field == "limit"


async def test_local_seq_is_commit_ordered_and_outbox_coalesces(store: Store) -> None:
    a = await store.memories.save({"content": "a"})
    await store.memories.save({"content": "b"})
    await store.memories.update_importance(a["id"], 0.1)
    nodes, _, cursor = (await store.feed.page(0))[:3]
    assert [n.content for n in nodes] == ["b", "a"]
    assert cursor == 3
    assert [(k, i) for k, i, _ in await outbox_items(store)] == [
        ("node", nodes[0].id), ("node", a["node_id"])]
    assert ((await store.feed.page(cursor))[:3])[0] == []


async def test_second_open_of_a_data_dir_is_refused(tmp_path: Path) -> None:
    s = await Store.open(tmp_path)
    try:
        with pytest.raises(StoreLockedError, match="in use by another syncd process"):
            await Store.open(tmp_path)
    finally:
        await s.close()
    reopened = await Store.open(tmp_path)
    await reopened.close()


def _files(data: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(data.iterdir()) if p.name != "syncd.lock"}


async def test_a_file_that_is_not_a_database_is_refused_and_left_alone(tmp_path: Path) -> None:
    (tmp_path / "memory.db").write_bytes(b"these are not the bytes of a database\n" * 200)
    before = _files(tmp_path)
    for _ in range(3):
        with pytest.raises(StoreUnusableError, match=r"memory\.db cannot be used: file is not "
                                                     r"a database\. It was left as it is"):
            await Store.open(tmp_path)
    assert _files(tmp_path) == before
    # nothing is left holding the lock or the file: once the file is moved aside, the data
    # directory opens
    (tmp_path / "memory.db").rename(tmp_path / "memory.db.corrupt")
    reopened = await Store.open(tmp_path)
    await reopened.close()


@pytest.mark.parametrize("where", ["file", "under a file"])
async def test_a_data_directory_that_cannot_be_one_is_refused(tmp_path: Path,
                                                            where: str) -> None:
    in_the_way = tmp_path / "data"
    in_the_way.write_bytes(b"notes\n")
    data = in_the_way if where == "file" else in_the_way / "sub"
    with pytest.raises(StoreUnusableError, match=f"data directory {data} cannot be used: "):
        await Store.open(data)
    assert in_the_way.read_bytes() == b"notes\n"


async def test_a_corrupt_database_is_refused_and_left_alone(tmp_path: Path) -> None:
    s = await Store.open(tmp_path)
    await s.memories.save({"content": "a"})
    await s.close()
    db = tmp_path / "memory.db"
    for name in ("memory.db-wal", "memory.db-shm"):
        assert not (tmp_path / name).exists()  # closed cleanly: all in the main file
    data = bytearray(db.read_bytes())
    data[4096:8192] = b"\xff" * 4096  # page 2: part of the schema's b-tree
    db.write_bytes(bytes(data))
    before = _files(tmp_path)
    with pytest.raises(StoreUnusableError, match="malformed"):
        await Store.open(tmp_path)
    assert _files(tmp_path) == before


async def test_a_store_migrated_by_a_newer_syncd_is_refused(tmp_path: Path) -> None:
    s = await Store.open(tmp_path)
    await s.close()
    conn = sqlite3.connect(tmp_path / "memory.db")
    with conn:
        conn.execute("INSERT INTO schema_migrations VALUES (9999, '9999_future.sql', 'x')")
    conn.close()
    before = _files(tmp_path)
    with pytest.raises(StoreUnusableError, match="schema is version 9999, newer than this "
                                                 "syncd knows"):
        await Store.open(tmp_path)
    assert _files(tmp_path) == before


async def test_a_full_disk_fails_the_write_whole_and_writes_work_once_there_is_room(
        store: Store) -> None:
    """SQLite's own SQLITE_FULL, reached through its page limit (as a full disk reports it)."""
    await store.memories.save({"content": "before the disk filled"})
    conn = store._writer.conn
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages}")
    before = await dump_tables(store)
    with pytest.raises(StoreFullError, match="is full: nothing was written") as exc:
        await store.memories.save_many([{"content": f"note {i} " + "x" * 2000} for i in range(50)])
    assert exc.value.code == "disk_full"
    assert await dump_tables(store) == before
    conn.execute("PRAGMA max_page_count = 1073741823")
    assert (await store.memories.save({"content": "after there is room"}))["saved"] is True


async def test_hlc_and_identity_survive_restart(tmp_path: Path) -> None:
    s = await Store.open(tmp_path)
    await s.memories.save({"content": "a"})
    last, store_id, replica = s.clock.last_ns, s.store_id, s.replica_id
    await s.close()
    s = await Store.open(tmp_path, wall=lambda: 0)  # the wall clock went back to 1970
    try:
        res = await s.memories.save({"content": "b"})
        assert s.store_id == store_id and s.replica_id == replica
        got = await s.memories.get(res["id"])
        assert got["updated_at"] > format_ns(last)
    finally:
        await s.close()


async def test_private_is_redacted_in_every_text_field(store: Store) -> None:
    res = await store.memories.save({
        "content": "key <private>sk-1</private> ok", "title": "t <private>T</private>",
        "tags": ["<private>tag</private>x"], "why": "<PRIVATE reason='r'>w</PRIVATE> why",
        "provenance": {"note": "<private>p</private>"}, "topic_key": "k",
    })
    got = await store.memories.get(res["id"])
    blob = json.dumps(got)
    for secret in ("sk-1", "'r'", ">w<", "tag</", "\"p\""):
        assert secret not in blob
    assert got["content"] == f"key {REDACTED} ok\nWhy: {REDACTED} why"


@pytest.mark.parametrize(("call", "field"), [
    ({"content": "a", "topic_key": "project/<private>alpha</private>"}, "topic_key"),
    ({"content": "a", "references": ["ok::1", "acct::<private>9</private>"]}, "references[1]"),
    ({"link": "<private>acct-1</private>"}, "target_node_id"),
    ({"link": "acct-1", "type": "OWNS <private>x</private>"}, "relationship_type"),
    ({"entity": {"name": "<private>Jane Roe</private>", "kind": "person"}}, "name"),
    ({"entity": {"name": "Jane <private>Roe</private>", "kind": "person"}}, "name"),
    ({"entity": {"name": "Jane", "kind": "p</private>x"}}, "kind"),
    ({"entity": {"name": "Jane", "links": [{"target_node_id": "<PRIVATE>x"}]}},
     "links[0].target_node_id"),
])
async def test_an_identity_key_holding_a_private_span_is_refused_not_rewritten(
        store: Store, call: dict[str, Any], field: str) -> None:
    """Redacted, two different private topic keys (or entity names, or link targets) would
    both become ``[redacted]``: the second save would overwrite the first, two links would
    be one edge. Refused instead, naming the field, without echoing it; nothing written."""
    first = await store.memories.save({"content": "first", "topic_key": "project/kept"})
    before = await dump_tables(store)
    with pytest.raises(ValidationError) as exc:
        if "link" in call:
            await store.graph.link({"memory_id": first["id"], "target_node_id": call["link"],
                              "relationship_type": call.get("type")})
        elif "entity" in call:
            await store.graph.ingest_entity(call["entity"])
        else:
            await store.memories.save(call)
    assert exc.value.field == field
    assert not {"alpha", "Roe", "acct", "9", "x"} & set(exc.value.message.split())
    assert await dump_tables(store) == before



async def test_a_hard_delete_leaves_an_older_syncds_bare_edge_tombstone_alone(store: Store) -> None:
    """An older syncd kept no props on an edge tombstone: nothing to purge, so a hard delete
    writes (and pushes) no new version of it."""
    a = (await store.memories.save({"content": "alpha memory"}))["node_id"]
    b = (await store.memories.save({"content": "beta memory"}))["node_id"]
    eid = f"{a}->{b}:RELATES_TO"
    legacy = EdgeRow(id=eid, src=a, dst=b, type="RELATES_TO", realm="default",
                     created_at="2026-01-01T00:00:00.000000001Z",
                     updated_at="2026-01-01T00:00:00.000000001Z", origin="old", deleted=True)
    assert (await store.replication.apply([], [legacy], model=store.embedder.model_id)).applied_edges == 1
    await store.memories.delete(a, hard=True)
    assert [e for e in await outbox_items(store) if e[0] == "edge"] == []

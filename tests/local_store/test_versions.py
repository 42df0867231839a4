"""Version history (local_store/versions.py): what is kept, why, for how long, and what a hard
delete leaves of it. Real stores in tmp_path; remote rows are another real store's export."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import pytest

from local_store import HashingEmbedder, NotFoundError, Store, ValidationError
from local_store.backups import backup, restore
from local_store.redact import REDACTED
from local_store.versions import VersionPolicy, loser_is_conflict, replaced_reason
from protocol.rows import NodeRow
from tests.conftest import FakeWall
from tests.store_probe import dump_tables

MODEL = HashingEmbedder().model_id
T0, T1, T2 = (f"2026-01-01T00:00:0{i}.000000000+00:00" for i in range(3))


@pytest.mark.parametrize(("base", "deleted", "pending", "reason"), [
    (T1, False, False, "replaced"),   # written over the local version itself
    (T2, False, True, "replaced"),    # written over a later version: history, pending or not
    (T0, False, False, "conflict"),   # written over an older one: it never had the local one
    (T0, True, False, "conflict"),    # a concurrent delete is a conflict too
    (T1, True, False, "deleted"),
    ("", False, False, "conflict"),   # its writer created the id without ever holding ours
    (None, False, True, "conflict"),  # unknown base (Kyma): a pending local edit lost
    (None, False, False, "replaced"),
    (None, True, False, "deleted"),
])
def test_the_rule_for_a_local_version_a_pulled_one_beat(
        base: str | None, deleted: bool, pending: bool, reason: str) -> None:
    assert replaced_reason(base, deleted, T1, pending) == reason


@pytest.mark.parametrize(("base", "conflict"), [
    (T0, True), ("", True), (T1, False), (T2, False), (None, False)])
def test_the_rule_for_a_pulled_version_that_lost(base: str | None, conflict: bool) -> None:
    assert loser_is_conflict(base, T1) is conflict


def reasons(history: dict[str, Any]) -> list[tuple[str, str]]:
    return [(v["reason"], v["content"]) for v in history["versions"]]


async def test_every_local_change_keeps_the_version_it_replaced(store: Store) -> None:
    saved = await store.memories.save({"content": "one", "topic_key": "k", "title": "T", "tags": ["a"]})
    mid = saved["node_id"]
    await store.memories.save({"content": "two", "topic_key": "k", "title": "T", "tags": ["a"]})
    await store.memories.update_importance(mid, 0.9)
    await store.memories.update_status(mid, "background")
    history = await store.versions.history(mid)
    assert reasons(history) == [("current", "two"), ("replaced", "two"), ("replaced", "two"),
                                ("replaced", "one")]
    current, *kept = history["versions"]
    assert current["n"] is None and current["status"] == "background"
    assert [v["importance"] for v in kept] == [0.9, 0.5, 0.5]
    assert [v["status"] for v in kept] == ["active", "active", "active"]
    assert kept[-1]["tags"] == ["a"] and kept[-1]["title"] == "T"
    stamps = [v["updated_at"] for v in history["versions"]]
    assert stamps == sorted(stamps, reverse=True)  # newest first
    assert {v["origin"] for v in history["versions"]} == {store.replica_id}
    assert set(current) >= {"content", "title", "tags", "importance", "status", "updated_at",
                            "origin", "reason"}


async def test_a_change_that_changes_nothing_keeps_no_version(store: Store) -> None:
    mid = (await store.memories.save({"content": "same", "importance": 0.5}))["node_id"]
    await store.memories.update_importance(mid, 0.5)
    assert reasons(await store.versions.history(mid)) == [("current", "same")]


async def test_a_restore_is_a_new_edit_that_syncs(store: Store) -> None:
    mid = (await store.memories.save({"content": "first words", "topic_key": "k"}))["node_id"]
    await store.memories.save({"content": "second words", "topic_key": "k"})
    staged, _, _ = await store.replication.stage_push(100, model=MODEL, dim=384)
    await store.replication.ack_push(staged)
    assert await store.replication.outbox_depth() == 0
    first = (await store.versions.history(mid))["versions"][-1]
    result = await store.versions.restore(mid, first["n"])
    assert result["restored"] == first["n"]
    assert (await store.memories.get(mid))["content"] == "first words"
    _, nodes, _ = await store.replication.stage_push(100, model=MODEL, dim=384)
    assert [n.content for n in nodes] == ["first words"]  # the restore is pushed, as an edit
    assert nodes[0].base == (await store.versions.history(mid))["versions"][1]["updated_at"]
    assert reasons(await store.versions.history(mid))[:2] == [("current", "first words"),
                                                      ("replaced", "second words")]
    found = await store.recall.query({"query": "first words", "limit": 1})  # indexed, embedded
    assert [m.id for m in found.memories if not m.fallback] == [mid]
    assert mid in store.index


async def test_a_soft_delete_keeps_the_text_and_a_restore_brings_it_back(store: Store) -> None:
    mid = (await store.memories.save({"content": "keep me", "importance": 0.7}))["node_id"]
    await store.memories.delete(mid)
    with pytest.raises(NotFoundError):
        await store.memories.get(mid)
    history = await store.versions.history(mid)
    assert history["versions"][0]["deleted"] is True
    assert reasons(history)[1] == ("deleted", "keep me")
    await store.versions.restore(mid, history["versions"][1]["n"])
    got = await store.memories.get(mid)
    assert got["content"] == "keep me" and got["status"] == "active"
    assert got["importance"] == 0.7 and got["invalid_at"] is None


async def test_versions_are_bounded_per_memory(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "d", versions=VersionPolicy(keep=3))
    try:
        mid = (await store.memories.save({"content": "v0", "topic_key": "k"}))["node_id"]
        for i in range(1, 8):
            await store.memories.save({"content": f"v{i}", "topic_key": "k"})
        assert reasons(await store.versions.history(mid)) == [
            ("current", "v7"), ("replaced", "v6"), ("replaced", "v5"), ("replaced", "v4")]
        assert len((await dump_tables(store))["memory_versions"]) == 3
    finally:
        await store.close()


async def test_versions_are_forgotten_after_the_age_bound(tmp_path: Path,
                                                          wall: FakeWall) -> None:
    store = await Store.open(tmp_path / "d", wall=wall,
                             versions=VersionPolicy(max_age_days=180))
    try:
        old = (await store.memories.save({"content": "old", "topic_key": "a"}))["node_id"]
        await store.memories.save({"content": "old, edited", "topic_key": "a"})
        wall.advance(100 * 86_400)
        young = (await store.memories.save({"content": "young", "topic_key": "b"}))["node_id"]
        await store.memories.save({"content": "young, edited", "topic_key": "b"})
        wall.advance(81 * 86_400)  # the first kept 181 days ago, the second 81
        assert await store.versions.prune() == 1
        assert reasons(await store.versions.history(old)) == [("current", "old, edited")]
        assert reasons(await store.versions.history(young))[1] == ("replaced", "young")
        assert await store.versions.prune() == 0
    finally:
        await store.close()


async def test_the_age_bound_also_prunes_on_write(tmp_path: Path, wall: FakeWall) -> None:
    store = await Store.open(tmp_path / "d", wall=wall, versions=VersionPolicy(max_age_days=1))
    try:
        mid = (await store.memories.save({"content": "a", "topic_key": "a"}))["node_id"]
        await store.memories.save({"content": "b", "topic_key": "a"})
        wall.advance(2 * 86_400)
        await store.memories.save({"content": "other", "topic_key": "z"})
        await store.memories.save({"content": "other, edited", "topic_key": "z"})
        assert reasons(await store.versions.history(mid)) == [("current", "b")]
    finally:
        await store.close()


def test_a_policy_refuses_bad_bounds_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="keep"):
        VersionPolicy(keep=-1)
    with pytest.raises(ValidationError, match="max_age_days"):
        VersionPolicy(max_age_days=float("nan"))


async def test_a_hard_delete_purges_every_version(store: Store) -> None:
    mid = (await store.memories.save({"content": "secret one", "topic_key": "k"}))["node_id"]
    await store.memories.save({"content": "secret two", "topic_key": "k"})
    await store.memories.delete(mid)
    other = (await store.memories.save({"content": "unrelated", "topic_key": "o"}))["node_id"]
    await store.memories.save({"content": "unrelated, edited", "topic_key": "o"})
    await store.memories.delete(mid, hard=True)
    kept = (await dump_tables(store))["memory_versions"]
    assert [row[1] for row in kept] == [other]
    assert "secret" not in repr(kept)
    with pytest.raises(NotFoundError, match="memory_id"):
        await store.versions.history(mid)


async def test_a_pulled_hard_delete_purges_the_versions_too(tmp_path: Path) -> None:
    a = await Store.open(tmp_path / "a")
    b = await Store.open(tmp_path / "b")
    try:
        mid = (await a.memories.save({"content": "secret one", "topic_key": "k"}))["node_id"]
        await b.replication.apply(*(await a.feed.read()), model=MODEL)
        await a.memories.save({"content": "secret two", "topic_key": "k"})
        await b.replication.apply(*(await a.feed.read()), model=MODEL)
        assert reasons(await b.versions.history(mid)) == [("current", "secret two"),
                                                  ("replaced", "secret one")]
        await a.memories.delete(mid, hard=True)
        await b.replication.apply(*(await a.feed.read(include_deleted=True)), model=MODEL)
        assert (await dump_tables(b))["memory_versions"] == []
    finally:
        await a.close()
        await b.close()


async def apart(tmp_path: Path) -> tuple[Store, Store, str]:
    """Two stores holding one memory, which each then edits while apart (A first)."""
    a = await Store.open(tmp_path / "a")
    b = await Store.open(tmp_path / "b")
    mid = (await a.memories.save({"content": "common", "topic_key": "k"}))["node_id"]
    await b.replication.apply(*(await a.feed.read()), model=MODEL)
    await a.memories.save({"content": "A's words", "topic_key": "k"})
    await b.memories.save({"content": "B's words", "topic_key": "k"})  # later: B wins LWW
    return a, b, mid


async def test_two_stores_that_edit_apart_both_keep_the_loser_as_a_conflict(
        tmp_path: Path) -> None:
    a, b, mid = await apart(tmp_path)
    try:
        from_a, from_b = await a.feed.read(), await b.feed.read()
        await a.replication.apply(*from_b, model=MODEL)  # A's pending edit is beaten: kept on A
        await b.replication.apply(*from_a, model=MODEL)  # A's edit loses on B: kept on B
        for store in (a, b):
            assert (await store.memories.get(mid))["content"] == "B's words"
            history = reasons(await store.versions.history(mid))
            assert history[0] == ("current", "B's words")
            assert ("conflict", "A's words") in history
            assert ("conflict", "common") not in history and ("replaced", "common") in history
            conflicts = await store.versions.conflicts()
            assert conflicts["count"] == 1 and conflicts["items"][0]["memory_id"] == mid
        await b.replication.apply(*from_a, model=MODEL)  # again: still one conflict
        assert (await b.versions.conflicts())["count"] == 1
        dismissed = (await b.versions.conflicts())["items"][0]["n"]
        await b.versions.dismiss(mid, dismissed)
        await b.replication.apply(*from_a, model=MODEL)  # a re-delivery never reopens a dismissed one
        assert (await b.versions.conflicts())["count"] == 0
        assert (await b.versions.history(mid))["versions"][1]["reviewed"] is True
    finally:
        await a.close()
        await b.close()


async def test_an_edit_made_after_seeing_a_version_is_no_conflict(tmp_path: Path) -> None:
    a = await Store.open(tmp_path / "a")
    b = await Store.open(tmp_path / "b")
    try:
        mid = (await a.memories.save({"content": "first", "topic_key": "k"}))["node_id"]
        await b.replication.apply(*(await a.feed.read()), model=MODEL)
        await b.memories.save({"content": "second, over first", "topic_key": "k"})
        await a.replication.apply(*(await b.feed.read()), model=MODEL)
        await a.memories.save({"content": "third, over second", "topic_key": "k"})
        await b.replication.apply(*(await a.feed.read()), model=MODEL)
        for store in (a, b):
            assert (await store.versions.conflicts())["count"] == 0
        assert reasons(await b.versions.history(mid)) == [
            ("current", "third, over second"), ("replaced", "second, over first"),
            ("replaced", "first")]
    finally:
        await a.close()
        await b.close()


async def test_a_pending_edit_beaten_by_a_row_without_a_base_is_a_conflict(
        tmp_path: Path) -> None:
    """A Kyma plane drops the ``base`` extension: the pending-edit rule decides."""
    a, b, mid = await apart(tmp_path)
    try:
        nodes, edges = await b.feed.read()
        await a.replication.apply([_without_base(n) for n in nodes], edges, model=MODEL)
        assert ("conflict", "A's words") in reasons(await a.versions.history(mid))
    finally:
        await a.close()
        await b.close()


def _without_base(node: NodeRow) -> NodeRow:
    return msgspec.structs.replace(node, base=None)


async def test_a_losing_row_is_kept_redacted(tmp_path: Path) -> None:
    a, b, mid = await apart(tmp_path)
    try:
        nodes, edges = await a.feed.read()
        leaked = [_with_content(n, "A's <private>canary-7731</private> words") for n in nodes]
        await b.replication.apply(leaked, edges, model=MODEL)
        kept = [v for v in (await b.versions.history(mid))["versions"] if v["reason"] == "conflict"]
        assert kept[0]["content"] == f"A's {REDACTED} words"
        assert "canary-7731" not in repr(await dump_tables(b))
    finally:
        await a.close()
        await b.close()


def _with_content(node: NodeRow, content: str) -> NodeRow:
    return msgspec.structs.replace(node, content=content)


async def test_restoring_the_conflict_makes_it_current_and_reviews_it(tmp_path: Path) -> None:
    a, b, mid = await apart(tmp_path)
    try:
        await a.replication.apply(*(await b.feed.read()), model=MODEL)
        n = (await a.versions.conflicts())["items"][0]["n"]
        await a.versions.restore(mid, n)
        assert (await a.memories.get(mid))["content"] == "A's words"
        assert (await a.versions.conflicts())["count"] == 0
        await b.replication.apply(*(await a.feed.read()), model=MODEL)  # a plain edit over B's words
        assert (await b.memories.get(mid))["content"] == "A's words"
        assert (await b.versions.conflicts())["count"] == 0
    finally:
        await a.close()
        await b.close()


@pytest.mark.parametrize("n", ["0", "-1", "x", "1.5", "", "٣", True, None, 2**63, "9" * 30])
async def test_a_bad_version_number_names_n_and_changes_nothing(store: Store, n: object) -> None:
    mid = (await store.memories.save({"content": "a", "topic_key": "k"}))["node_id"]
    await store.memories.save({"content": "b", "topic_key": "k"})
    before = await dump_tables(store)
    for call in (store.versions.restore, store.versions.dismiss):
        with pytest.raises(ValidationError) as caught:
            await call(mid, n)
        assert caught.value.field == "n"
    assert await dump_tables(store) == before


async def test_unknown_versions_and_memories_are_named(store: Store) -> None:
    mid = (await store.memories.save({"content": "a", "topic_key": "k"}))["node_id"]
    other = (await store.memories.save({"content": "x", "topic_key": "o"}))["node_id"]
    await store.memories.save({"content": "y", "topic_key": "o"})
    before = await dump_tables(store)
    foreign = (await store.versions.history(other))["versions"][1]["n"]  # another memory's version
    for call in (store.versions.restore, store.versions.dismiss):
        with pytest.raises(NotFoundError) as caught:
            await call(mid, foreign)
        assert caught.value.field == "n" and str(foreign) in str(caught.value)
        with pytest.raises(NotFoundError) as caught:
            await call("memory:nope", 1)
        assert caught.value.field == "memory_id" and "memory:nope" in str(caught.value)
    with pytest.raises(ValidationError, match="not a conflict") as refused:
        await store.versions.dismiss(other, foreign)
    assert refused.value.field == "n"
    assert await dump_tables(store) == before


async def test_versions_are_never_pushed_or_exported(store: Store) -> None:
    mid = (await store.memories.save({"content": "old words", "topic_key": "k"}))["node_id"]
    await store.memories.save({"content": "new words", "topic_key": "k"})
    _, nodes, _ = await store.replication.stage_push(100, model=MODEL, dim=384)
    exported, _ = await store.feed.read(include_deleted=True)
    changed = await store.feed.read(since=None, include_deleted=True)
    assert "old words" not in repr((nodes, exported, changed))
    assert [v["content"] for v in (await store.versions.history(mid))["versions"]] == [
        "new words", "old words"]


async def test_a_backup_holds_the_versions(tmp_path: Path) -> None:
    data, copy, other = tmp_path / "data", tmp_path / "backup.db", tmp_path / "other"
    store = await Store.open(data)
    mid = (await store.memories.save({"content": "before", "topic_key": "k"}))["node_id"]
    await store.memories.save({"content": "after", "topic_key": "k"})
    await store.close()
    await asyncio.to_thread(backup, data, copy)
    await asyncio.to_thread(restore, other, copy)
    restored = await Store.open(other)
    try:
        assert reasons(await restored.versions.history(mid)) == [("current", "after"),
                                                         ("replaced", "before")]
    finally:
        await restored.close()

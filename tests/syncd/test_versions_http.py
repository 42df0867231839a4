"""The versions routes on a real daemon app (aiohttp on port 0, a real store): list, restore,
dismiss, the conflicts in the sync status, and bad input that names its field and changes
nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from local_store import HashingEmbedder, Store
from syncd.report import status_lines
from tests.store_probe import dump_tables, outbox_items
from tests.syncd.conftest import Daemon
from tests.syncd.processes import cli, daemon

MODEL = HashingEmbedder().model_id
FIELDS = {"content", "title", "tags", "importance", "status", "updated_at", "origin", "reason"}


async def ok(daemon: Daemon, method: str, path: str, **kw: object) -> Any:
    status, body, _ = await daemon.call(method, path, **kw)
    assert status == 200, (status, body)
    return body


async def edited(daemon: Daemon) -> str:
    saved = await ok(daemon, "POST", "/v1/agent/memory/tools/save_memory",
                     json={"content": "the build uses make", "topic_key": "build"})
    await ok(daemon, "POST", "/v1/agent/memory/tools/save_memory",
             json={"content": "the build uses just", "topic_key": "build"})
    return str(saved["id"])


async def test_versions_list_newest_first_with_the_current_one_first(daemon: Daemon) -> None:
    mid = await edited(daemon)
    body = await ok(daemon, "GET", f"/v1/agent/memory/items/{mid}/versions")
    versions = body["versions"]
    assert [(v["reason"], v["content"]) for v in versions] == [
        ("current", "the build uses just"), ("replaced", "the build uses make")]
    assert all(set(v) >= FIELDS for v in versions)
    assert versions[0]["updated_at"] > versions[1]["updated_at"]


async def test_a_restore_makes_the_version_current_and_queues_it(daemon: Daemon) -> None:
    mid = await edited(daemon)
    staged, _, _ = await daemon.store.replication.stage_push(100, model=MODEL, dim=384)
    await daemon.store.replication.ack_push(staged)  # as if synced: the outbox is empty
    assert await outbox_items(daemon.store) == []
    n = (await ok(daemon, "GET", f"/v1/agent/memory/items/{mid}/versions"))["versions"][1]["n"]
    restored = await ok(daemon, "POST", f"/v1/agent/memory/items/{mid}/versions/{n}/restore")
    assert restored["restored"] == n
    got = await ok(daemon, "GET", f"/v1/agent/memory/items/{mid}")
    assert got["content"] == "the build uses make"
    assert [item for _, item, _ in await outbox_items(daemon.store)] == [f"memory:{mid}"]
    versions = (await ok(daemon, "GET", f"/v1/agent/memory/items/{mid}/versions"))["versions"]
    assert [v["content"] for v in versions[:2]] == ["the build uses make",
                                                    "the build uses just"]


async def test_an_unknown_memory_is_a_404_naming_the_id(daemon: Daemon) -> None:
    for method, path in (("GET", "/versions"), ("POST", "/versions/1/restore"),
                         ("POST", "/versions/1/dismiss")):
        status, body, _ = await daemon.call(method, "/v1/agent/memory/items/nope" + path)
        assert status == 404, body
        assert isinstance(body, dict) and body["error"]["field"] == "memory_id"
        assert "memory:nope" in body["error"]["message"]


@pytest.mark.parametrize(("n", "status"), [("0", 422), ("-3", 422), ("abc", 422),
                                           ("1e3", 422), ("9" * 30, 422), ("999999", 404)])
async def test_a_bad_version_number_names_n_and_changes_nothing(
        daemon: Daemon, n: str, status: int) -> None:
    mid = await edited(daemon)
    before = await dump_tables(daemon.store)
    for action in ("restore", "dismiss"):
        code, body, _ = await daemon.call(
            "POST", f"/v1/agent/memory/items/{mid}/versions/{n}/{action}")
        assert code == status, body
        assert isinstance(body, dict) and body["error"]["field"] == "n", body
    assert await dump_tables(daemon.store) == before


async def test_dismissing_a_version_that_is_no_conflict_is_refused(daemon: Daemon) -> None:
    mid = await edited(daemon)
    n = (await ok(daemon, "GET", f"/v1/agent/memory/items/{mid}/versions"))["versions"][1]["n"]
    before = await dump_tables(daemon.store)
    status, body, _ = await daemon.call(
        "POST", f"/v1/agent/memory/items/{mid}/versions/{n}/dismiss")
    assert status == 422 and isinstance(body, dict) and body["error"]["field"] == "n"
    assert "not a conflict" in body["error"]["message"]
    assert await dump_tables(daemon.store) == before


async def conflicted(daemon: Daemon, tmp_path: Path) -> str:
    """The daemon's store and another edit one memory apart; the other's later edit wins."""
    other = await Store.open(tmp_path / "other", embedder=HashingEmbedder())
    try:
        mid = (await daemon.store.memories.save({"content": "common", "topic_key": "k"}))["node_id"]
        await other.replication.apply(*(await daemon.store.feed.read()), model=MODEL)
        await daemon.store.memories.save({"content": "the daemon's words", "topic_key": "k"})
        await other.memories.save({"content": "the other's words", "topic_key": "k"})
        await daemon.store.replication.apply(*(await other.feed.read()), model=MODEL)
    finally:
        await other.close()
    return str(mid)


async def test_the_sync_status_counts_conflicts_until_they_are_reviewed(
        daemon: Daemon, tmp_path: Path) -> None:
    mid = await conflicted(daemon, tmp_path)
    status = await ok(daemon, "GET", "/v1/agent/sync/status")
    assert status["conflicts"] == 1
    (item,) = status["conflict_versions"]
    assert item["memory_id"] == mid and item["content_preview"] == "the daemon's words"
    versions = (await ok(daemon, "GET", f"/v1/agent/memory/items/{mid}/versions"))["versions"]
    conflict = next(v for v in versions if v["reason"] == "conflict")
    assert conflict["n"] == item["n"] and conflict["reviewed"] is False
    assert (await ok(daemon, "GET", f"/v1/agent/memory/items/{mid}"))["content"] == (
        "the other's words")
    overall = await ok(daemon, "GET", "/v1/agent/status")
    assert overall["conflicts"] == 1 and overall["conflict_memories"] == [mid]
    lines = status_lines(overall)
    assert any(line.split()[:2] == ["conflicts", "1"] and mid in line for line in lines), lines
    await ok(daemon, "POST", f"/v1/agent/memory/items/{mid}/versions/{item['n']}/dismiss")
    status = await ok(daemon, "GET", "/v1/agent/sync/status")
    assert status["conflicts"] == 0 and status["conflict_versions"] == []
    overall = await ok(daemon, "GET", "/v1/agent/status")
    assert overall["conflicts"] == 0
    assert not any("conflicts" in line for line in status_lines(overall))
    assert (await ok(daemon, "GET", f"/v1/agent/memory/items/{mid}"))["content"] == (
        "the other's words")  # a dismiss changes nothing else


async def test_restoring_a_conflict_reviews_it(daemon: Daemon, tmp_path: Path) -> None:
    mid = await conflicted(daemon, tmp_path)
    n = (await ok(daemon, "GET", "/v1/agent/sync/status"))["conflict_versions"][0]["n"]
    await ok(daemon, "POST", f"/v1/agent/memory/items/{mid}/versions/{n}/restore")
    assert (await ok(daemon, "GET", "/v1/agent/sync/status"))["conflicts"] == 0
    assert (await ok(daemon, "GET", f"/v1/agent/memory/items/{mid}"))["content"] == (
        "the daemon's words")


async def test_the_routes_need_the_token(daemon: Daemon) -> None:
    mid = await edited(daemon)
    for method, path in (("GET", f"/v1/agent/memory/items/{mid}/versions"),
                         ("POST", f"/v1/agent/memory/items/{mid}/versions/1/restore")):
        status, _, _ = await daemon.call(method, path, headers={"Authorization": "Bearer no"})
        assert status == 401


async def test_history_from_the_command_line(tmp_path: Path) -> None:
    """``syncd history ID [--json]``, ``--restore N``, and a bad N, against a real daemon
    process."""
    data = str(tmp_path / "data")
    async with daemon(tmp_path, data):

        async def syncd(*args: str) -> tuple[int, str, str]:
            return await cli(tmp_path, "--data-dir", data, *args)

        for text in ("deploys go out with make ship", "deploys go out with just ship"):
            code, out, err = await syncd("save", text, "--topic-key", "deploy")
            assert code == 0, err
        mid = out.split()[-1]
        code, out, err = await syncd("history", mid, "--json")
        assert code == 0, err
        versions = json.loads(out)["versions"]
        assert [(v["reason"], v["content"]) for v in versions] == [
            ("current", "deploys go out with just ship"),
            ("replaced", "deploys go out with make ship")]
        code, out, err = await syncd("history", mid)
        assert code == 0, err
        lines = out.splitlines()
        assert lines[0].endswith("2 versions") and "current" in lines[1]
        assert lines[2].strip() == "deploys go out with just ship"
        assert f"#{versions[1]['n']}" in lines[3] and "replaced" in lines[3]
        code, out, err = await syncd("history", mid, "--restore", str(versions[1]["n"]))
        assert code == 0 and out.startswith(f"restored version {versions[1]['n']}"), err
        code, out, err = await syncd("get", mid, "--json")
        assert json.loads(out)["content"] == "deploys go out with make ship"
        code, _, err = await syncd("history", mid, "--restore", "999999")
        assert code == 1 and "n: version 999999" in err, err
        code, _, err = await syncd("history", "memory:nope")
        assert code == 1 and "memory:nope not found" in err, err

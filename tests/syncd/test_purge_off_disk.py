"""A hard delete through the daemon's HTTP API leaves its text on no page of any file in the
data directory (issue 32, point 3): not in ``memory.db`` (``secure_delete``), not in
``memory.db-wal`` (scrubbed by a ``TRUNCATE`` checkpoint before the delete answers), nor in any
other file there. A reader whose snapshot began before the delete holds the text until it
ends; then the owed scrub runs (``local_store/checkpoint.py``), waited on as state.

The scan reads every file under the data directory, as bytes. A marker counts as found when
its last 12 characters appear in any case: FTS5 stores index terms lower-cased and
prefix-compressed against the previous term (``tests/local_store/test_canary.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from local_store import Store
from tests.store_probe import dump_tables
from tests.syncd.conftest import Daemon


def new_marker() -> str:
    return "purgemark" + secrets.token_hex(8)


def holders(root: Path, marker: str) -> list[str]:
    """The files under ``root`` whose bytes hold ``marker`` (its tail, in any case)."""
    tail = marker[-12:].lower().encode()
    found = []
    for folder, _, names in os.walk(root):
        for name in names:
            path = Path(folder, name)
            if tail in path.read_bytes().lower():
                found.append(str(path.relative_to(root)))
    return sorted(found)


async def on_disk(root: Path, marker: str) -> list[str]:
    return await asyncio.to_thread(holders, root, marker)


async def save_marked(daemon: Daemon, marker: str) -> str:
    """A memory holding ``marker`` in every text field, edited once (older versions of its
    pages), and a link from another memory whose reason holds it; returns its id."""
    status, saved, _ = await daemon.call(
        "POST", "/v1/agent/memory/tools/save_memory",
        json={"content": f"the deploy key is {marker}", "title": f"key {marker}",
              "tags": [marker], "topic_key": f"project/{marker}"})
    assert status == 200 and isinstance(saved, dict), saved
    status, body, _ = await daemon.call(
        "POST", "/v1/agent/memory/tools/save_memory",
        json={"content": f"the deploy key is {marker}, rotated", "title": f"key {marker}",
              "tags": [marker], "topic_key": f"project/{marker}"})
    assert status == 200 and isinstance(body, dict) and body["id"] == saved["id"], body
    for n in range(30):  # other rows on the pages, and FTS segments to merge
        await daemon.call("POST", "/v1/agent/memory/tools/save_memory",
                          json={"content": f"unrelated memory number {n} about builds"})
    other = await daemon.store.memories.save({"content": "the old deploy key"})
    await daemon.store.graph.judge(other["id"], saved["id"], "conflicts", f"because {marker}")
    return str(saved["id"])


async def hard_delete(daemon: Daemon, memory_id: str) -> None:
    status, gone, _ = await daemon.call("DELETE",
                                        f"/v1/agent/memory/items/{memory_id}?hard=true")
    assert status == 200 and isinstance(gone, dict) and gone["hard"] is True, gone


@pytest.mark.parametrize("soft_first", [False, True])
async def test_a_hard_delete_leaves_its_text_in_no_file_of_the_data_dir(
        daemon: Daemon, soft_first: bool) -> None:
    data = daemon.store.data_dir
    marker = new_marker()
    memory_id = await save_marked(daemon, marker)
    if soft_first:  # a soft delete keeps the text, on disk too
        status, _, _ = await daemon.call("DELETE", f"/v1/agent/memory/items/{memory_id}")
        assert status == 200
    held = await on_disk(data, marker)
    assert "memory.db-wal" in held, held  # non-vacuity: the scan sees it before
    await hard_delete(daemon, memory_id)
    assert await on_disk(data, marker) == []  # as the delete answers: no wait at all
    assert not daemon.store.checkpointer.scrub_owed


async def test_a_hard_delete_takes_the_memorys_versions_off_the_disk(daemon: Daemon) -> None:
    """Text only an earlier version still holds (kept in ``memory_versions``) leaves every
    file as the delete answers, like the current text."""
    data = daemon.store.data_dir
    first, second = new_marker(), new_marker()
    saved = await daemon.store.memories.save({"content": f"key {first}", "topic_key": "project/k"})
    await daemon.store.memories.save({"content": f"key {second}", "topic_key": "project/k"})
    for n in range(30):
        await daemon.store.memories.save({"content": f"unrelated memory number {n} about builds"})
    status, history, _ = await daemon.call(
        "GET", f"/v1/agent/memory/items/{saved['id']}/versions")
    assert status == 200 and isinstance(history, dict), history
    assert [v["content"] for v in history["versions"]] == [f"key {second}", f"key {first}"]
    await daemon.store.maintenance.checkpoint()  # into memory.db too, not only the WAL
    assert "memory.db" in await on_disk(data, first)  # non-vacuity: the version is on disk
    await hard_delete(daemon, str(saved["id"]))
    assert await on_disk(data, first) == []
    assert await on_disk(data, second) == []
    assert (await dump_tables(daemon.store))["memory_versions"] == []


def outside_reader(db_path: Path) -> sqlite3.Connection:
    """A read-only connection holding a read transaction (its snapshot) until closed, as a
    ``sqlite3`` shell or another tool might."""
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, isolation_level=None,
                           check_same_thread=False)
    conn.execute("BEGIN")
    conn.execute("SELECT count(*) FROM memories").fetchall()
    return conn


@pytest.mark.parametrize("reader", ["outside connection", "export snapshot"])
async def test_a_reader_holding_an_older_snapshot_delays_the_scrub_until_it_ends(
        daemon: Daemon, reader: str) -> None:
    """The reader's snapshot holds the text (no checkpoint can copy over pages it reads), so
    the delete answers with the scrub owed — never waiting on the reader — and the text goes
    once the reader ends. Writes go on meanwhile."""
    store: Store = daemon.store
    data = store.data_dir
    marker = new_marker()
    memory_id = await save_marked(daemon, marker)
    async with contextlib.AsyncExitStack() as stack:
        if reader == "outside connection":
            conn = await asyncio.to_thread(outside_reader, store.db_path)
            stack.push_async_callback(asyncio.to_thread, conn.close)
        else:
            snapshot = await stack.enter_async_context(store.feed.snapshot())
            pages = snapshot.node_pages()
            stack.push_async_callback(pages.aclose)
            first: list[Any] = await anext(pages)
            assert first
        await hard_delete(daemon, memory_id)
        assert store.checkpointer.scrub_owed
        assert await on_disk(data, marker), "the reader's snapshot needs the text"
        saved = await store.memories.save({"content": "a write while the scrub is owed"})
        assert (await store.memories.get(saved["id"]))["content"].startswith("a write")
    await store.checkpointer.wait_scrubbed()
    assert await on_disk(data, marker) == []

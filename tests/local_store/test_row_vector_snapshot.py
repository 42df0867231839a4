"""Rows and their vectors are read in one transaction where they leave the store: a hub's
change feed page, and a push's staged rows. A write landing between the two reads cannot pair
a row with the vector of another version."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from local_store import HashingEmbedder, Store
from local_store.embed import to_blob
from protocol.rows import NodeRow
from protocol.timestamp import format_ns


async def test_a_write_between_rows_and_vectors_does_not_reach_the_page(tmp_path: Path) -> None:
    embedder = HashingEmbedder()
    store = await Store.open(tmp_path, embedder=embedder, feed=True)
    try:
        stamp = format_ns(1_700_000_000_000_000_000)
        old = embedder.embed(["the release checklist"])[0]
        row = NodeRow(id="memory:one", labels="Memory", content="the release checklist",
                      status="active", embedding=[float(x) for x in old], created_at=stamp,
                      updated_at=stamp)
        result = await store.replication.apply([row], [], model=embedder.model_id)
        assert result.applied_nodes == 1 and not result.problems

        # Another connection replaces the vector right after the page's rows were read.
        newer = to_blob(np.roll(old, 1))
        fetch = store._recall_reader.fetch
        wrote: list[bool] = []

        def racing_fetch(sql: str, params: Sequence[object] = ()) -> list[Any]:
            rows = fetch(sql, params)
            if "FROM memories WHERE local_seq >" in sql and not wrote:
                other = sqlite3.connect(store.db_path, isolation_level=None)
                try:
                    other.execute("UPDATE vectors SET vec = ? WHERE memory_id = 'memory:one'",
                                  (newer,))
                finally:
                    other.close()
                wrote.append(True)
            return rows

        store._recall_reader.fetch = racing_fetch  # type: ignore[method-assign]
        nodes, _, _, _ = await store.feed.page(None)
        assert wrote, "the feed's node read was not seen"
        (node,) = nodes
        assert node.embedding is not None
        assert np.allclose(node.embedding, old)  # the vector of the row it read
    finally:
        await store.close()


async def test_a_write_after_staging_does_not_reach_the_pushed_vector(tmp_path: Path) -> None:
    """A push's rows are staged in a write transaction; their vectors are read in it too. A
    write landing as soon as any read of vectors starts outside it must not change them."""
    embedder = HashingEmbedder()
    store = await Store.open(tmp_path, embedder=embedder)
    try:
        saved = await store.memories.save({"content": "the release checklist"})
        old = embedder.embed(["the release checklist"])[0]
        newer = to_blob(np.roll(old, 1))
        fetch = store._reader.fetch

        def racing_fetch(sql: str, params: Sequence[object] = ()) -> list[Any]:
            if "FROM vectors" in sql:
                other = sqlite3.connect(store.db_path, isolation_level=None)
                try:
                    other.execute("UPDATE vectors SET vec = ? WHERE memory_id = ?",
                                  (newer, saved["node_id"]))
                finally:
                    other.close()
            return fetch(sql, params)

        store._reader.fetch = racing_fetch  # type: ignore[method-assign]
        _, nodes, _ = await store.replication.stage_push(10, model=embedder.model_id, dim=embedder.dim)
        (node,) = nodes
        assert node.id == saved["node_id"] and node.embedding is not None
        assert np.allclose(node.embedding, old)
    finally:
        await store.close()

"""A hub's change feed reads a page's rows and their vectors in one read transaction: a write
landing between the two reads cannot pair a row with a vector of another version."""

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
        result = await store.apply([row], [], model=embedder.model_id)
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
        nodes, _, _, _ = await store.feed(None)
        assert wrote, "the feed's node read was not seen"
        (node,) = nodes
        assert node.embedding is not None
        assert np.allclose(node.embedding, old)  # the vector of the row it read
    finally:
        await store.close()

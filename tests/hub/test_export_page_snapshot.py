"""A paged export (``GET /export?limit=&cursor=``) on the SQLite hub reads each page from one
snapshot (found by a hub review).

``export_page`` read the page's nodes and its edges in two queries, and whether more follows in
a third. An import committed between them — a new version of a node already read, a new node
and an edge — moved the page's cursor past the edge, beyond the new node versions the node
query had not seen: paging on from that cursor never served them. The import here lands right
after the node query, wherever that query runs, as a laptop's push would."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from local_store import HashingEmbedder, Store
from local_store.columns import NODE_SELECT
from protocol.rows import EdgeRow, NodeRow
from syncd.hub.store import SqliteHubStore

MODEL = HashingEmbedder().model_id


def nid(i: int) -> str:
    return f"memory:00000000-0000-4000-8000-{i:012d}"


def node(i: int, ts: str, content: str) -> NodeRow:
    return NodeRow(id=nid(i), content=content, updated_at=ts, embedding=[0.0] * 384)


async def test_paging_on_from_a_page_raced_by_an_import_serves_every_version(
        tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "hub", embedder=HashingEmbedder(), feed=True)
    hub = SqliteHubStore(store)
    loop = asyncio.get_running_loop()
    reader = store._recall_reader
    real_fetch, real_async_fetch = reader.fetch, store._fetch
    raced = False

    def push() -> Any:
        return hub.apply([node(1, "2026-01-02T00:00:00Z", "new"),
                          node(2, "2026-01-02T00:00:00Z", "fresh")],
                         [EdgeRow(src=nid(1), dst=nid(2), type="RELATES_TO",
                                  created_at="2026-01-02T00:00:00Z")], model=MODEL)

    def racing_fetch(sql: str, params: Any = ()) -> list[Any]:  # the reader's thread
        nonlocal raced
        rows = real_fetch(sql, params)
        if sql.startswith(NODE_SELECT) and not raced:  # between the node and the edge query
            raced = True
            asyncio.run_coroutine_threadsafe(push(), loop).result(30)
        return rows

    async def racing_async_fetch(sql: str, params: Any = ()) -> Any:  # reads on the loop
        nonlocal raced
        rows = await real_async_fetch(sql, params)
        if sql.startswith(NODE_SELECT) and not raced:
            raced = True
            await push()
        return rows

    try:
        await hub.apply([node(1, "2026-01-01T00:00:00Z", "old")], [], model=MODEL)
        reader.fetch = racing_fetch  # type: ignore[method-assign]
        store._fetch = racing_async_fetch  # type: ignore[method-assign]
        nodes, _, cursor, _ = await hub.export_page("0", limit=10)
        assert raced
        seen = {n.id: n.content for n in nodes}
        more = True
        while more:  # paging on from the raced page's cursor
            nodes, _, cursor, more = await hub.export_page(cursor, limit=10)
            seen.update({n.id: n.content for n in nodes})
        assert seen == {nid(1): "new", nid(2): "fresh"}
    finally:
        reader.fetch = real_fetch  # type: ignore[method-assign]
        store._fetch = real_async_fetch  # type: ignore[method-assign]
        await hub.close()

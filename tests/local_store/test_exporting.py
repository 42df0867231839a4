"""Exports a page at a time from one snapshot (``local_store/exporting.py``): the pages hold
exactly the store's rows, writes made while an export runs do not show in it, and its memory is
bounded by a page."""

from __future__ import annotations

import itertools
import tracemalloc
from typing import Any

from local_store import Store
from protocol.rows import EdgeRow, NodeRow


async def fill(store: Store, n: int, *, realm: str = "p", tag: str = "") -> list[str]:
    ids = []
    for start in range(0, n, 100):
        saved = await store.memories.save_many([
            {"content": f"note {tag}{i} about deploys and rollbacks", "realm": realm}
            for i in range(start, min(n, start + 100))])
        ids += saved["ids"]
    return ids


async def drain(store: Store, **options: Any) -> tuple[int, int, list[NodeRow], list[EdgeRow]]:
    async with store.feed.snapshot(**options) as snapshot:
        nodes = [n async for page in snapshot.node_pages() for n in page]
        edges = [e async for page in snapshot.edge_pages() for e in page]
        return snapshot.memories, snapshot.edges, nodes, edges


async def test_pages_hold_exactly_the_stores_rows_in_commit_order(store: Store) -> None:
    ids = await fill(store, 23)
    await fill(store, 4, realm="q")
    for a, b in itertools.pairwise(ids[5:11]):
        await store.graph.link({"memory_id": a, "target_node_id": b,
                          "relationship_type": "RELATES_TO"})
    await store.memories.delete(ids[3])
    memories, edges, nodes, links = await drain(store, page_rows=5)
    live = [r[0] for r in await store._fetch(
        "SELECT id FROM memories WHERE deleted = 0 ORDER BY local_seq")]
    assert [n.id for n in nodes] == live and memories == len(live) == 26
    assert edges == len(links) == 5
    assert all(n.embedding is not None and len(n.embedding) == 384 for n in nodes)
    assert (nodes, links) == await store.feed.read()  # one code path: export is these pages
    # filters: a realm, and tombstones on request
    memories, _, nodes, _ = await drain(store, realm="q", page_rows=3)
    assert memories == 4 and {n.realm for n in nodes} == {"q"}
    memories, _, nodes, _ = await drain(store, include_deleted=True, page_rows=4)
    tombstones = [n.id for n in nodes if n.deleted]
    assert memories == 27 and len(tombstones) == 1 and tombstones[0].endswith(ids[3])


async def test_writes_while_an_export_runs_do_not_show_in_it(store: Store) -> None:
    ids = await fill(store, 30)
    before = await store.feed.read()
    async with store.feed.snapshot(page_rows=10) as snapshot:
        pages = snapshot.node_pages()
        nodes = list(await anext(pages))
        # a row already exported and one still to come change; new rows arrive
        await store.memories.update_importance(ids[0], 0.9)
        await store.memories.delete(ids[25])
        await fill(store, 12, tag="new ")
        nodes += [n async for page in pages for n in page]
        edges = [e async for page in snapshot.edge_pages() for e in page]
        assert snapshot.memories == 30
    assert (nodes, edges) == before  # no row missed, repeated or changed
    assert len((await store.feed.read())[0]) == 41


async def test_an_exports_memory_is_bounded_by_a_page(store: Store) -> None:
    """Python's allocations while streaming 4,000 memories (384 floats each) in pages of
    400, against building the whole answer (ten pages): under a quarter, i.e. a page or two
    and their conversion. The same for ``changes`` since the start."""
    await fill(store, 4000)

    async def peak(whole: bool, changes: bool) -> int:
        tracemalloc.start()
        try:
            if whole:
                await (store.feed.read(since="", include_deleted=True) if changes else store.feed.read())
            else:
                async with (store.feed.snapshot(since="", include_deleted=True, page_rows=400) if changes
                            else store.feed.snapshot(page_rows=400)) as snapshot:
                    async for page in snapshot.node_pages():
                        del page
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    for changes in (False, True):
        streamed, whole = await peak(False, changes), await peak(True, changes)
        assert streamed < whole / 4, (changes, streamed, whole)


async def test_changes_pages_hold_the_versions_after_a_stamp(store: Store) -> None:
    """``changes_snapshot``: versions strictly after ``since`` (tombstones included), nodes of
    one realm on request (edges never filtered by realm), from one snapshot, and
    ``changes_since`` is these pages in one piece."""
    ids = await fill(store, 12)
    cut = (await store.memories.get(ids[5]))["updated_at"]
    ids = ["memory:" + i for i in ids]  # as the wire names them
    await store.graph.link({"memory_id": ids[1], "target_node_id": ids[2],
                      "relationship_type": "RELATES_TO"})
    await store.memories.delete(ids[0])
    await fill(store, 3, realm="q")
    async with store.feed.snapshot(since=cut, include_deleted=True, page_rows=4) as snapshot:
        pages = snapshot.node_pages()
        nodes = list(await anext(pages))
        await store.memories.update_importance(ids[11], 0.9)  # after the snapshot began
        await fill(store, 2, tag="late ")
        nodes += [n async for page in pages for n in page]
        edges = [e async for page in snapshot.edge_pages() for e in page]
        assert (snapshot.memories, snapshot.edges) == (len(nodes), len(edges)) == (10, 1)
    assert [n.id for n in nodes] == [*ids[6:], ids[0], *[n.id for n in nodes[7:]]]
    assert [n.id for n in nodes if n.deleted] == [ids[0]]
    assert {n.realm for n in nodes[7:]} == {"q"} and all(n.importance != 0.9 for n in nodes)
    assert (nodes, edges) != await store.feed.read(since=cut, include_deleted=True)  # the later writes show there
    realm_q, links = await store.feed.read("q", since=cut, include_deleted=True)
    assert len(realm_q) == 3 and len(links) == 1
    assert await store.feed.read(since=nodes[-1].updated_at, include_deleted=True) == (
        (await store.feed.read(since=cut, include_deleted=True))[0][-3:], [])

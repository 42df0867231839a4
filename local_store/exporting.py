"""Exports read a page at a time from one snapshot, so memory is bounded by a page, not the store.

Built in one piece, an export of 20,000 memories held ~380 MB of Python objects (384 floats a
row) for a 100 MB body, and 100,000 memories ~1.9 GB: enough to push a laptop into swap or its
OOM killer. ``ExportSnapshot`` reads on a read-only connection of its own, on a thread of its
own, inside one read transaction: every page comes from the same instant whatever commits
meanwhile (WAL keeps that snapshot for it), so no row is missed or repeated, and the counts
taken first are the counts of the rows that follow.

Rows come in ``local_seq`` order (the order exports always had); the node query joins
each row's vector of the export's model. The plane's ``changes?since=`` is the same read with
one more filter (``since``: versions after a stamp, tombstones included), so it streams too: a
laptop asking a store of 100,000 memories for everything no longer builds it whole. Given the
model's width (``dim``), a row without a vector of the model carries zeros of that width, as the
plane's rows always carry one (``views.wire_nodes``).
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, NamedTuple, Protocol, TypeVar

from local_store import db
from local_store.columns import EDGE_ALL, NODE_COLUMNS
from local_store.views import wire_edge, wire_embeddings, wire_nodes
from protocol.rows import EdgeRow, NodeRow

T = TypeVar("T")

PAGE_ROWS = 500
_NODE_PAGE = ("SELECT " + ", ".join(f"m.{c}" for c in NODE_COLUMNS) + ", v.vec FROM memories m "
              "LEFT JOIN vectors v ON v.memory_id = m.id AND v.model = ? "
              "WHERE m.local_seq > ?{filters} ORDER BY m.local_seq LIMIT ?")
_EDGE_PAGE = ("SELECT " + ", ".join(EDGE_ALL) + " FROM edges WHERE local_seq > ?{filters} "
              "ORDER BY local_seq LIMIT ?")


class ExportPages(Protocol):
    """What an export streams from: its counts, then its rows a page at a time (this store's
    ``ExportSnapshot``; the PostgreSQL hub has its own)."""

    memories: int
    edges: int

    def node_pages(self) -> AsyncIterator[list[NodeRow]]: ...

    def edge_pages(self) -> AsyncIterator[list[EdgeRow]]: ...


class ExportSnapshot:
    """One export: ``memories`` and ``edges`` (how many rows the pages will hold), then
    ``node_pages()`` and ``edge_pages()``. Use it through ``export_snapshot``."""

    def __init__(self, conn: sqlite3.Connection, pool: ThreadPoolExecutor, realm: str | None,
                 model: str, include_deleted: bool, page_rows: int,
                 changed: Changed | None = None, dim: int | None = None) -> None:
        self._conn, self._pool = conn, pool
        self._model, self._dim, self._page_rows = model, dim, page_rows
        node_filters, edge_filters = [], []
        self._node_params: list[object] = []
        self._edge_params: list[object] = []
        if realm is not None:
            node_filters.append("m.realm = ?")
            self._node_params.append(realm)
        if not include_deleted:
            node_filters.append("m.deleted = 0")
            edge_filters.append("deleted = 0")
        if changed is not None:
            node_filters.append("m.updated_at > ?")
            self._node_params.append(changed.since)
            edge_filters.append(f"{changed.edge_version} > ?")
            self._edge_params.append(changed.since)
        self._node_filters = "".join(" AND " + f for f in node_filters)
        self._edge_filters = "".join(" AND " + f for f in edge_filters)
        self.memories = self.edges = 0

    def _count(self) -> None:
        """The snapshot's counts (its first read, which fixes the snapshot)."""
        self.memories = self._conn.execute(
            "SELECT count(*) FROM memories m WHERE 1 = 1" + self._node_filters,
            self._node_params).fetchone()[0]
        self.edges = self._conn.execute(
            "SELECT count(*) FROM edges WHERE 1 = 1" + self._edge_filters, self._edge_params
            ).fetchone()[0]

    def node_pages(self) -> AsyncIterator[list[NodeRow]]:
        return self._pages(self._node_page)

    def edge_pages(self) -> AsyncIterator[list[EdgeRow]]:
        return self._pages(self._edge_page)

    async def _pages(self, read: Callable[[int], tuple[list[T], int]]) -> AsyncIterator[list[T]]:
        after = -1
        while True:
            rows, after = await self._run(read, after)
            if not rows:
                return
            yield rows
            del rows  # not kept alive while the next page is read

    def _node_page(self, after: int) -> tuple[list[NodeRow], int]:
        """The page after ``local_seq`` ``after``, and its last ``local_seq``."""
        rows = self._conn.execute(
            _NODE_PAGE.format(filters=self._node_filters),
            [self._model, after, *self._node_params, self._page_rows]).fetchall()
        dicts = [dict(zip(NODE_COLUMNS, r, strict=False)) for r in rows]
        vectors = wire_embeddings([(d["id"], r[-1]) for d, r in zip(dicts, rows, strict=True)
                                   if r[-1] is not None])
        del rows
        last = dicts[-1]["local_seq"] if dicts else after
        return wire_nodes(dicts, vectors, self._dim), last

    def _edge_page(self, after: int) -> tuple[list[EdgeRow], int]:
        rows = self._conn.execute(_EDGE_PAGE.format(filters=self._edge_filters),
                                  [after, *self._edge_params, self._page_rows]).fetchall()
        dicts = [dict(zip(EDGE_ALL, r, strict=True)) for r in rows]
        return [wire_edge(d) for d in dicts], dicts[-1]["local_seq"] if dicts else after

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)


class Changed(NamedTuple):
    """The plane's ``changes`` filter: nodes whose ``updated_at`` is after ``since`` (a
    canonical stamp; ``""`` for everything), edges whose ``edge_version`` is."""

    since: str
    edge_version: str = "updated_at"


EDGE_VERSIONS = ("updated_at", "created_at")


async def collect(snapshot: ExportPages) -> tuple[list[NodeRow], list[EdgeRow]]:
    """Every row of ``snapshot``, in one piece (for callers that want them all at once)."""
    nodes = [node async for page in snapshot.node_pages() for node in page]
    edges = [edge async for page in snapshot.edge_pages() for edge in page]
    return nodes, edges


@asynccontextmanager
async def export_snapshot(path: Path, realm: str | None, *, model: str,
                          include_deleted: bool = False, page_rows: int = PAGE_ROWS,
                          changed: Changed | None = None,
                          dim: int | None = None) -> AsyncIterator[ExportSnapshot]:
    """An ``ExportSnapshot`` of the store file at ``path``, closed (its transaction ended, its
    thread gone) on leaving; ``changed`` narrows it to the plane's ``changes``; ``dim``, the
    width of ``model``'s vectors, gives a row without one zeros (``views.wire_nodes``)."""
    if changed is not None and changed.edge_version not in EDGE_VERSIONS:
        raise ValueError(f"edge_version: {changed.edge_version!r}")
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="syncd-export")
    loop = asyncio.get_running_loop()
    try:
        conn = await loop.run_in_executor(pool, _begin, path)
        try:
            snapshot = ExportSnapshot(conn, pool, realm, model, include_deleted, page_rows,
                                      changed, dim)
            await loop.run_in_executor(pool, snapshot._count)
            yield snapshot
        finally:
            await loop.run_in_executor(pool, conn.close)
    finally:
        pool.shutdown(wait=False)


def _begin(path: Path) -> sqlite3.Connection:
    conn = db.connect(path, readonly=True)  # autocommit: the transaction is this BEGIN's
    conn.execute("BEGIN")
    return conn

"""``store.feed``: the one read of rows for replication and export — a page, or a snapshot.

Every read the sync engine, the hub and the export routes make of the store's rows is one of:
  * ``page(after, …)``: a bounded page after a cursor, read in one read transaction. An ``int``
    cursor is a ``local_seq`` of the store's own change log (any store; ``cursor`` is the last
    ``local_seq`` served, ``limit`` rows at most, ``LOG_PAGE`` unless given). A ``str`` or
    ``None`` cursor is a hub feed's ``until`` (a feed store: ``local_store/feed.py``'s rules;
    the page ends on a transaction boundary, whole when ``limit`` is None).
  * ``snapshot(realm, …)``: every latest version, streamed a page at a time from one snapshot
    (``local_store/exporting.py``): an export's memory stays bounded by a page. ``since`` (any
    RFC 3339 form) keeps the versions after it (the plane's ``changes?since=``; nodes by
    ``updated_at``, edges by ``edge_version``); ``include_deleted`` keeps tombstones. A bad
    ``since`` or ``edge_version`` raises here, before any read. ``read`` is the same, whole.
Nodes are optionally of one realm; edges are never filtered by it (as the plane). Rows are wire
rows with their ``model`` vectors (the embedder's by default); a row of this store's own model
without one carries zeros of its width (``views.wire_nodes``).
"""

from __future__ import annotations

import asyncio
import functools
from contextlib import AbstractAsyncContextManager
from typing import Any, Generic, NamedTuple, TypeVar, overload

from local_store.columns import EDGE_ALL, NODE_COLUMNS
from local_store.errors import StoreClosedError, ValidationError
from local_store.exporting import (
    EDGE_VERSIONS,
    PAGE_ROWS,
    Changed,
    ExportSnapshot,
    collect,
    export_snapshot,
)
from local_store.feed import feed_page, log_page
from local_store.records import parse_timestamp
from local_store.shell import Shell
from local_store.views import wire_edge, wire_embeddings, wire_nodes
from protocol.rows import EdgeRow, NodeRow

C = TypeVar("C", int, str)
LOG_PAGE = 1000  # rows of the change log a page holds when the caller names no limit


class Page(NamedTuple, Generic[C]):
    nodes: list[NodeRow]
    edges: list[EdgeRow]
    cursor: C  # where the next page starts: the last local_seq, or the feed's ``until``
    more: bool


class Feed:
    """Reads of the store's rows (``store.feed``): ``page``, ``snapshot``, ``read``."""

    def __init__(self, shell: Shell) -> None:
        self._shell = shell

    @overload
    async def page(self, after: int, *, limit: int | None = None, realm: str | None = None,
                   model: str | None = None) -> Page[int]: ...

    @overload
    async def page(self, after: str | None, *, limit: int | None = None,
                   realm: str | None = None, model: str | None = None,
                   exclude_origin: str | None = None) -> Page[str]: ...

    async def page(self, after: int | str | None, *, limit: int | None = None,
                   realm: str | None = None, model: str | None = None,
                   exclude_origin: str | None = None) -> Page[int] | Page[str]:
        """The page after ``after`` (the module's rules); ``exclude_origin`` (a feed's only)
        leaves out the versions that replica minted (it holds them already)."""
        shell = self._shell
        if isinstance(after, int):
            if shell._closed:
                raise StoreClosedError("the store is closed")
            model = model or shell.embedder.model_id
            read = functools.partial(log_page, shell._recall_reader.fetch, after,
                                     LOG_PAGE if limit is None else limit, realm, model)
            rows, edge_rows, found, cursor, more = await asyncio.get_running_loop(
                ).run_in_executor(shell._recall_reader.pool, read)
            return Page(self._nodes(rows, found, model), _edges(edge_rows), cursor, more)
        stamp = parse_timestamp(after, "since") if after and after.strip() else None
        if limit is not None and limit < 1:
            raise ValidationError("limit", f"must be >= 1, got {limit}")
        model = model or shell.embedder.model_id
        page = await asyncio.get_running_loop().run_in_executor(
            shell._recall_reader.pool, functools.partial(
                feed_page, shell._recall_reader.fetch, stamp, limit, realm, exclude_origin,
                model))
        return Page(self._nodes(page.node_rows, page.vectors, model), _edges(page.edge_rows),
                    page.until, page.has_more)

    def snapshot(self, realm: str | None = None, *, since: str | None = None,
                 model: str | None = None, include_deleted: bool = False,
                 edge_version: str = "updated_at", page_rows: int = PAGE_ROWS,
                 ) -> AbstractAsyncContextManager[ExportSnapshot]:
        """The latest versions (archived and invalidated included), a page at a time from one
        snapshot (the module's rules)."""
        if edge_version not in EDGE_VERSIONS:
            raise ValueError(f"edge_version: {edge_version!r}")
        stamp = parse_timestamp(since, "since") if since and since.strip() else None
        shell = self._shell
        if shell._closed:
            raise StoreClosedError("the store is closed")
        model = model or shell.embedder.model_id
        return export_snapshot(shell.db_path, realm, model=model,
                               include_deleted=include_deleted, page_rows=page_rows,
                               changed=None if stamp is None else Changed(stamp, edge_version),
                               dim=shell._width(model))

    async def read(self, realm: str | None = None, *, since: str | None = None,
                   model: str | None = None, include_deleted: bool = False,
                   edge_version: str = "updated_at") -> tuple[list[NodeRow], list[EdgeRow]]:
        """``snapshot``'s rows in one piece."""
        async with self.snapshot(realm, since=since, model=model,
                                 include_deleted=include_deleted,
                                 edge_version=edge_version) as snapshot:
            return await collect(snapshot)

    def _nodes(self, rows: list[Any], vectors: list[tuple[str, bytes]],
               model: str) -> list[NodeRow]:
        dicts = [dict(zip(NODE_COLUMNS, r, strict=True)) for r in rows]
        return wire_nodes(dicts, wire_embeddings(vectors), self._shell._width(model))


def _edges(rows: list[Any]) -> list[EdgeRow]:
    return [wire_edge(dict(zip(EDGE_ALL, r, strict=True))) for r in rows]

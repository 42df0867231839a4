"""Reader-thread reads of the change feed: a hub's ``changes`` by ingest, a log by ``local_seq``.

A hub's ``changes`` are ordered by ingest (commit order), not by writers' clocks.

Rules:
  * Every committed write transaction of a feed store leaves a mark ``(seq, stamp)``
    (``0003_feed.sql``). A client's ``since`` maps to the last mark at or before it; rows with
    a larger ``local_seq`` are new to that client, whatever their own ``updated_at`` says — so
    a version pushed late, or stamped by a slow clock, is never skipped.
  * A page ends on a transaction boundary (one import is never split), so ``until`` is always
    the stamp of a mark. A page may exceed ``limit`` by the rest of one transaction.
  * When nothing is new, ``until`` is ``since`` itself. A ``since`` that is no mark's stamp
    was served by a feed that is gone (a hub restored from an older backup): the answer is
    the mark before it and no rows, so ``until`` goes backwards and the client resyncs.
  * One read transaction per page, so the rows, their vectors and ``until`` come from one
    snapshot.
  * A client may ask to leave out the versions it minted itself (``exclude_origin``): after a
    push, the next pull would otherwise download every pushed row again. Its anti-entropy
    ``export`` still carries them, which repairs a client restored from an old backup.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from local_store.columns import EDGE_ALL, EDGE_SELECT, NODE_COLUMNS, NODE_ID, NODE_SELECT
from local_store.db import chunks, marks
from protocol.timestamp import format_ns

EPOCH = format_ns(0)
Fetch = Callable[[str, Sequence[object]], list[Any]]


@dataclass(slots=True)
class FeedPage:
    node_rows: list[Any]
    edge_rows: list[Any]
    until: str
    has_more: bool
    vectors: list[tuple[str, bytes]]  # (memory id, blob) of the nodes' vectors of the model


def stored_vectors(fetch: Fetch, ids: list[str], model: str) -> list[tuple[str, bytes]]:
    """(memory id, blob) of the stored ``model`` vectors of ``ids`` — read by the caller's
    transaction, so they are the vectors of the rows it read (a write in between could have
    replaced a memory's text and vector)."""
    found: list[tuple[str, bytes]] = []
    for chunk in chunks(ids):
        found += [(r[0], r[1]) for r in fetch(
            f"SELECT memory_id, vec FROM vectors WHERE model = ? AND memory_id IN "
            f"({marks(chunk)})", [model, *chunk])]
    return found


def feed_page(fetch: Fetch, since: str | None, limit: int | None,
              realm: str | None, exclude_origin: str | None, model: str) -> FeedPage:
    """Run on the reader thread. ``since`` is canonical (or None for the beginning).
    ``exclude_origin`` leaves out versions that replica minted (it holds them already).
    The page's nodes come with their ``model`` vectors, read in the same transaction."""
    fetch("BEGIN", ())
    try:
        return _page(fetch, since, limit, realm, exclude_origin, model)
    finally:
        fetch("COMMIT", ())


def _page(fetch: Fetch, since: str | None, limit: int | None, realm: str | None,
          exclude_origin: str | None, model: str) -> FeedPage:
    start = 0
    if since is not None:
        found = fetch("SELECT seq, stamp FROM feed WHERE stamp <= ? ORDER BY seq DESC LIMIT 1",
                      (since,))
        start, mark = (found[0][0], found[0][1]) if found else (0, EPOCH)
        if mark != since and since != EPOCH:
            # Every `until` this feed serves is a mark's stamp: a `since` that is none was
            # served by a feed that is gone (a hub restored from an older backup). Answer the
            # mark before it and no rows: `until` goes backwards and the client resyncs.
            return FeedPage([], [], mark, False, [])
    last_mark = fetch("SELECT max(seq) FROM feed", ())[0][0] or 0
    end = last_mark
    if limit is not None:
        found = fetch(
            "SELECT local_seq FROM (SELECT local_seq FROM memories WHERE local_seq > ? "
            "UNION ALL SELECT local_seq FROM edges WHERE local_seq > ?) "
            "ORDER BY local_seq LIMIT 1 OFFSET ?", (start, start, limit - 1))
        if found:
            boundary = fetch("SELECT min(seq) FROM feed WHERE seq >= ?", (found[0][0],))[0][0]
            end = boundary if boundary is not None else found[0][0]
    end = max(end, start)
    node_sql = NODE_SELECT + " WHERE local_seq > ? AND local_seq <= ?"
    node_params: list[object] = [start, end]
    edge_sql = EDGE_SELECT + " WHERE local_seq > ? AND local_seq <= ?"
    edge_params: list[object] = [start, end]
    if realm is not None:
        node_sql += " AND realm = ?"
        node_params.append(realm)
    if exclude_origin:
        node_sql += " AND origin <> ?"
        node_params.append(exclude_origin)
        edge_sql += " AND origin <> ?"
        edge_params.append(exclude_origin)
    nodes = fetch(node_sql + " ORDER BY local_seq", node_params)
    edges = fetch(edge_sql + " ORDER BY local_seq", edge_params)
    more = fetch("SELECT EXISTS (SELECT 1 FROM memories WHERE local_seq > ?) "
                 "OR EXISTS (SELECT 1 FROM edges WHERE local_seq > ?)", (end, end))[0][0]
    mark = fetch("SELECT stamp FROM feed WHERE seq <= ? ORDER BY seq DESC LIMIT 1", (end,))
    ids = [r[NODE_ID] for r in nodes]
    return FeedPage(nodes, edges, mark[0][0] if mark else EPOCH, bool(more),
                    stored_vectors(fetch, ids, model))


def log_page(fetch: Fetch, since_seq: int, limit: int, realm: str | None, model: str,
             ) -> tuple[list[Any], list[Any], list[tuple[str, bytes]], int, bool]:
    """A page of the store's own change log (``local_seq`` order, any store, not only a feed
    store's), read in one read transaction on the reader's thread: node rows, edge rows, the
    nodes' ``model`` vectors, the cursor (the last ``local_seq`` served), and whether more
    follows. Nodes are optionally of one realm; edges are never filtered, as the plane's."""
    realm_sql = "" if realm is None else " AND realm = ?"
    fetch("BEGIN", ())
    try:
        node_rows = fetch(
            NODE_SELECT + " WHERE local_seq > ?" + realm_sql + " ORDER BY local_seq LIMIT ?",
            (since_seq, limit) if realm is None else (since_seq, realm, limit))
        edge_rows = fetch(
            EDGE_SELECT + " WHERE local_seq > ? ORDER BY local_seq LIMIT ?", (since_seq, limit))
        seq_index = NODE_COLUMNS.index("local_seq")
        merged = sorted([(r[seq_index], "n", r) for r in node_rows]
                        + [(r[EDGE_ALL.index("local_seq")], "e", r) for r in edge_rows],
                        key=lambda item: item[0])[:limit]
        cursor = int(merged[-1][0]) if merged else since_seq
        nodes = [r for _, kind, r in merged if kind == "n"]
        found = stored_vectors(fetch, [r[NODE_ID] for r in nodes], model)
        more = len(merged) == limit and bool(fetch(
            "SELECT EXISTS (SELECT 1 FROM memories WHERE local_seq > ?" + realm_sql + ") OR "
            "EXISTS (SELECT 1 FROM edges WHERE local_seq > ?)",
            (cursor, cursor) if realm is None else (cursor, realm, cursor))[0][0])
    finally:
        fetch("COMMIT", ())
    return nodes, [r for _, kind, r in merged if kind == "e"], found, cursor, more

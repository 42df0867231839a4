"""The PostgreSQL hub's reads of its rows: the feed (``changes``, by feed seq), the keyset-paged
export (``export_page`` and its cursors), and the snapshot reads (``changes_snapshot``,
``export_snapshot``) — each in one repeatable-read transaction (rules in ``__init__.py``)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Sequence
from typing import NamedTuple

import asyncpg

from local_store import ValidationError
from local_store.embed import Embedder
from local_store.exporting import EDGE_VERSIONS, Changed, ExportPages, collect
from local_store.exporting import PAGE_ROWS as EXPORT_PAGE_ROWS
from local_store.records import parse_timestamp
from local_store.redact import quoted
from protocol.rows import EdgeRow, NodeRow
from protocol.timestamp import format_ns, parse_ns
from syncd.hub.pg.marks import batch_end
from syncd.hub.pg.migrate import Conn
from syncd.hub.pg.rows import EDGE_SQL, NODE_SQL, read_edge, read_nodes
from syncd.hub.pg.tokens import Connect
from syncd.hub.store import Page, parse_cursor

# The export's order: (transaction seq, kind, id), kind _NODE before _EDGE. $1-$3 the position
# after which a page starts, $4 how many positions, $5 the last seq to look at, $6 the realm
# (nodes only). LATERAL: the marks up to $5 are walked in seq order and each one's rows found
# by the ``tx`` index, so a page reads the imports it spans, not the tables.
_NODE, _EDGE, _AFTER_ALL = 0, 1, 2
_EXPORT_KEYS_OF = (
    "(SELECT f.seq, {kind} AS kind, r.id FROM feed_tx f CROSS JOIN LATERAL "
    "(SELECT t.id FROM {table} t WHERE t.tx = f.tx "
    "AND (f.seq, {kind}, t.id) > ($1, $2::int, $3::text COLLATE \"C\"){where} "
    "ORDER BY t.id LIMIT $4) AS r WHERE f.seq >= $1 AND f.seq <= $5 "
    "ORDER BY f.seq, r.id LIMIT $4)")
EXPORT_KEYS_SQL = (
    "SELECT seq, kind, id FROM ("
    + _EXPORT_KEYS_OF.format(kind=_NODE, table="memories", where="{realm}") + " UNION ALL "
    + _EXPORT_KEYS_OF.format(kind=_EDGE, table="edges", where="")
    + ") AS k ORDER BY seq, kind, id LIMIT $4")


class PgReads:
    """Reads the feed and the export; every read is one snapshot."""

    def __init__(self, connect: Connect, embedder: Embedder) -> None:
        self._connection, self.embedder = connect, embedder

    async def feed(self, since: str | None, *, limit: int | None = None,
                   realm: str | None = None, exclude_origin: str | None = None) -> Page:
        stamp = parse_timestamp(since, "since") if since and since.strip() else None
        if limit is not None and limit < 1:
            raise ValidationError("limit", f"must be >= 1, got {limit}")
        async with self._connection() as conn, conn.transaction(isolation="repeatable_read",
                                                                readonly=True):
            start = 0
            if stamp is not None and parse_ns(stamp) != 0:
                # a bigint: a stamp beyond its range (year 1600, 9999) is no mark either
                since_ns = min(max(parse_ns(stamp), -(2**63)), 2**63 - 1)
                found = await conn.fetchval("SELECT seq FROM feed_tx WHERE stamp_ns = $1",
                                            since_ns)
                if found is None:
                    # Not a mark of this database (a wiped or restored hub): the mark before it
                    # and no rows, so `until` goes backwards and the client resyncs.
                    before = await conn.fetchval(
                        "SELECT max(stamp_ns) FROM feed_tx WHERE stamp_ns < $1", since_ns)
                    return [], [], format_ns(before or 0), False
                start = int(found)
            return await self._page(conn, start, limit, realm, exclude_origin)

    async def export_page(self, cursor: str, *, limit: int, realm: str | None = None) -> Page:
        """At most ``limit`` rows, in (transaction seq, nodes before edges, id) order, keyset
        on that order: a page may end inside an import however large (``_ExportCursor``)."""
        after = _ExportCursor.parse(cursor)
        if limit < 1:
            raise ValidationError("limit", f"must be >= 1, got {limit}")
        async with self._connection() as conn, conn.transaction(isolation="repeatable_read",
                                                                readonly=True):
            return await self._export_rows(conn, after, limit, realm)

    async def _export_rows(self, conn: Conn, after: _ExportCursor, limit: int,
                           realm: str | None) -> Page:
        """The positions of the next ``limit`` rows and one more (whether there are more, and
        whether the page ends on an import's boundary), then those rows from one snapshot.
        Nodes are filtered by realm, edges never (as SQLite's ``changes``)."""
        keys = await _export_keys(conn, after, limit + 1, realm)
        page, more = keys[:limit], len(keys) > limit
        if not page:
            return [], [], after.encode(), False
        last = page[-1]
        if not (more and keys[limit].seq == last.seq):
            last = _ExportCursor(last.seq)  # the page ends on an import's boundary
        node_ids = [k.id for k in page if k.kind == _NODE]
        edge_ids = [k.id for k in page if k.kind == _EDGE]
        node_rows = await conn.fetch(NODE_SQL + " WHERE m.id = ANY($1::text[])", node_ids)
        edge_rows = await conn.fetch(EDGE_SQL + " WHERE e.id = ANY($1::text[])", edge_ids)
        nodes = {n.id: n for n in await read_nodes(conn, self.embedder, node_rows)}
        edges = {r[0]: read_edge(r) for r in edge_rows}
        return ([nodes[mid] for mid in node_ids], [edges[eid] for eid in edge_ids],
                last.encode(), more)

    async def _page(self, conn: Conn, start: int, limit: int | None,
                    realm: str | None, exclude_origin: str | None) -> Page:
        """The feed: rows of the transactions with ``start < seq <= end``, a page ending on a
        transaction boundary; ``end`` is where the running count of written rows reaches
        ``limit``."""
        if limit is None:
            end = await conn.fetchval("SELECT coalesce(max(seq), 0) FROM feed_tx")
        else:  # at most `limit` marks, fewer once they hold `limit` rows (marks.py)
            end = await batch_end(conn, start, limit, limit) or 0
        end = max(int(end), start)
        node_where, edge_where = ["f.seq > $1", "f.seq <= $2"], ["f.seq > $1", "f.seq <= $2"]
        node_params: list[object] = [start, end]
        edge_params: list[object] = [start, end]
        if realm is not None:
            node_params.append(realm)
            node_where.append(f"m.realm = ${len(node_params)}")
        if exclude_origin:
            node_params.append(exclude_origin)
            node_where.append(f"m.origin <> ${len(node_params)}")
            edge_params.append(exclude_origin)
            edge_where.append(f"e.origin <> ${len(edge_params)}")
        node_rows = await conn.fetch(
            NODE_SQL + " JOIN feed_tx f ON f.tx = m.tx WHERE " + " AND ".join(node_where)
            + " ORDER BY f.seq, m.id", *node_params)
        edge_rows = await conn.fetch(
            EDGE_SQL + " JOIN feed_tx f ON f.tx = e.tx WHERE " + " AND ".join(edge_where)
            + " ORDER BY f.seq, e.id", *edge_params)
        more = await conn.fetchval("SELECT EXISTS (SELECT 1 FROM feed_tx WHERE seq > $1)", end)
        mark = await conn.fetchval("SELECT stamp_ns FROM feed_tx WHERE seq = $1", end)
        nodes = await read_nodes(conn, self.embedder, node_rows)
        return nodes, [read_edge(r) for r in edge_rows], format_ns(mark or 0), bool(more)

    async def changes_since(self, since: str | None, realm: str | None = None, *,
                            edge_version: str = "updated_at",
                            ) -> tuple[list[NodeRow], list[EdgeRow]]:
        async with self.changes_snapshot(since, realm, edge_version=edge_version) as snapshot:
            return await collect(snapshot)

    def changes_snapshot(self, since: str | None, realm: str | None = None, *,
                         edge_version: str = "updated_at", page_rows: int = EXPORT_PAGE_ROWS,
                         ) -> contextlib.AbstractAsyncContextManager[ExportPages]:
        if edge_version not in EDGE_VERSIONS:
            raise ValueError(f"edge_version: {edge_version!r}")
        stamp = parse_timestamp(since, "since") if since and since.strip() else ""
        return self._snapshot(realm, page_rows, Changed(stamp or "", edge_version))

    async def export(self, realm: str | None = None) -> tuple[list[NodeRow], list[EdgeRow]]:
        async with self._connection() as conn, conn.transaction(isolation="repeatable_read",
                                                                readonly=True):
            if realm is None:
                node_rows = await conn.fetch(NODE_SQL + " ORDER BY m.id")
            else:
                node_rows = await conn.fetch(NODE_SQL + " WHERE m.realm = $1 ORDER BY m.id",
                                             realm)
            edge_rows = await conn.fetch(EDGE_SQL + " ORDER BY e.id")
            nodes = await read_nodes(conn, self.embedder, node_rows)
        return nodes, [read_edge(r) for r in edge_rows]

    def export_snapshot(self, realm: str | None = None, *, page_rows: int = EXPORT_PAGE_ROWS,
                        ) -> contextlib.AbstractAsyncContextManager[ExportPages]:
        return self._snapshot(realm, page_rows, None)

    @contextlib.asynccontextmanager
    async def _snapshot(self, realm: str | None, page_rows: int,
                        changed: Changed | None) -> AsyncIterator[ExportPages]:
        async with self._connection() as conn, conn.transaction(isolation="repeatable_read",
                                                                readonly=True):
            snapshot = _PgExport(self.embedder, conn, realm, page_rows, changed)
            await snapshot.count()
            yield snapshot


async def _export_keys(conn: Conn, after: _ExportCursor, count: int,
                       realm: str | None) -> list[_ExportCursor]:
    """The positions of the next ``count`` rows after ``after``, read a window of marks at a
    time (``marks.batch_end``: marks whose rows, as written, add up to what is still wanted;
    rows rewritten since have left their mark, so a window may hold fewer and the next one is
    read)."""
    keys: list[_ExportCursor] = []
    realm_sql, extra = ("", []) if realm is None else (" AND t.realm = $6", [realm])
    sql = EXPORT_KEYS_SQL.format(realm=realm_sql)
    while len(keys) < count:
        wanted = count - len(keys)
        # the cursor's own import may hold rows after it
        end = await batch_end(conn, after.seq - (after.kind != _AFTER_ALL), wanted, wanted)
        if end is None:
            break
        keys += [_ExportCursor(int(r[0]), int(r[1]), str(r[2])) for r in await conn.fetch(
            sql, after.seq, after.kind, after.id, wanted, end, *extra)]
        after = _ExportCursor(end)
    return keys


class _ExportCursor(NamedTuple):
    """A position in the export's order. Written as the seq alone (``"17"``: after every row
    of that import — the only form before pages could end inside one, so a cursor a client
    got then still reads the same) or, for a page that ends inside an import, as
    ``"17.n<hex>"``/``"17.e<hex>"``: after that import's node/edge whose id is the hex of
    its UTF-8. A cursor never holds a row's offset: rows leave an import (a later one
    rewrites them) and offsets would then skip rows."""

    seq: int
    kind: int = _AFTER_ALL
    id: str = ""

    @classmethod
    def parse(cls, raw: str) -> _ExportCursor:
        found = _ROW_CURSOR.fullmatch(raw)
        if found is None:
            return cls(parse_cursor(raw))
        try:
            return cls(parse_cursor(found[1]), _KINDS.index(found[2]),
                       bytes.fromhex(found[3]).decode())
        except ValueError:  # odd hex digits, not UTF-8, a seq out of range
            raise ValidationError("cursor", f"must be a next_cursor from a previous page, "
                                  f"got {quoted(raw)}") from None

    def encode(self) -> str:
        if self.kind == _AFTER_ALL:
            return str(self.seq)
        return f"{self.seq}.{_KINDS[self.kind]}{self.id.encode().hex()}"


_KINDS = "ne"  # the cursor's letter for _NODE, _EDGE
_ROW_CURSOR = re.compile(r"([0-9]{1,19})\.([ne])((?:[0-9a-f]{2})*)")


class _PgExport:
    """``export``'s rows a page at a time (keyset on the id, ``export``'s order), inside the
    caller's repeatable-read transaction: one snapshot for every page. With ``changed``, the
    plane's ``changes``: versions after ``since``, keyset on (version, id), which the
    ``memories_updated_at`` and ``edges_created_at`` indexes serve."""

    def __init__(self, embedder: Embedder, conn: Conn, realm: str | None, page_rows: int,
                 changed: Changed | None = None) -> None:
        self._embedder, self._conn, self._page_rows = embedder, conn, page_rows
        self._nodes, self._edges = _Keyset("m", ("id",)), _Keyset("e", ("id",))
        if realm is not None:
            self._nodes.where("realm", "=", realm)
        if changed is not None:
            self._nodes = self._nodes.since("updated_at", changed.since)
            self._edges = self._edges.since(changed.edge_version, changed.since)
        self.memories = self.edges = 0

    async def count(self) -> None:
        self.memories = await self._nodes.count(self._conn, "memories m")
        self.edges = await self._edges.count(self._conn, "edges e")

    async def node_pages(self) -> AsyncIterator[list[NodeRow]]:
        async for rows in self._nodes.pages(self._conn, NODE_SQL, self._page_rows):
            nodes = await read_nodes(self._conn, self._embedder, rows)
            del rows
            yield nodes
            del nodes

    async def edge_pages(self) -> AsyncIterator[list[EdgeRow]]:
        async for rows in self._edges.pages(self._conn, EDGE_SQL, self._page_rows):
            yield [read_edge(r) for r in rows]


class _Keyset:
    """Filters (column, operator, value) on one table, read in pages ordered by ``key``."""

    def __init__(self, alias: str, key: tuple[str, ...]) -> None:
        self.alias, self.key = alias, key
        self.filters: list[tuple[str, str, object]] = []

    def where(self, column: str, op: str, value: object) -> None:
        self.filters.append((column, op, value))

    def since(self, column: str, stamp: str) -> _Keyset:
        """These filters plus ``column > stamp``, keyed on (column, id)."""
        narrowed = _Keyset(self.alias, (column, "id"))
        narrowed.filters = [*self.filters, (column, ">", stamp)]
        return narrowed

    def _sql(self, after: Sequence[object] | None) -> tuple[str, list[object]]:
        a, args, terms = self.alias, [], []
        for column, op, value in self.filters:
            args.append(value)
            terms.append(f"{a}.{column} {op} ${len(args)}")
        if after is not None:
            columns = ", ".join(f"{a}.{c}" for c in self.key)
            args += after
            marks = ", ".join(f"${i}" for i in range(len(args) - len(after) + 1, len(args) + 1))
            terms.append(f"({columns}) > ({marks})")
        return (" WHERE " + " AND ".join(terms)) if terms else "", args

    async def count(self, conn: Conn, table: str) -> int:
        where, args = self._sql(None)
        return int(await conn.fetchval(f"SELECT count(*) FROM {table}" + where, *args))

    async def pages(self, conn: Conn, select: str,
                    page_rows: int) -> AsyncIterator[list[asyncpg.Record]]:
        order = ", ".join(f"{self.alias}.{c}" for c in self.key)
        after: list[object] | None = None
        while True:
            where, args = self._sql(after)
            rows = await conn.fetch(select + where + f" ORDER BY {order} LIMIT {page_rows:d}",
                                    *args)
            if not rows:
                return
            after = [rows[-1][c] for c in self.key]
            yield rows
            del rows

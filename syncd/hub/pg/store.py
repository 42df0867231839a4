"""``PgHubStore``: the hub-store interface on PostgreSQL via asyncpg (rules in ``__init__.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

import asyncpg
import msgspec
import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from local_store import ValidationError
from local_store.apply import (
    ApplyResult,
    RowProblem,
    check_width,
    edge_from_wire,
    node_from_wire,
    redacted_text,
    safe_id,
    vector_from_wire,
    vectors_from_wires,
)
from local_store.arguments import msgspec_field
from local_store.columns import NODE_WIRE
from local_store.embed import Embedder, HashingEmbedder, to_blob
from local_store.exporting import EDGE_VERSIONS, Changed, ExportPages, collect
from local_store.exporting import PAGE_ROWS as EXPORT_PAGE_ROWS
from local_store.merge import EDGE_HASHED, VersionKey, content_hash, version_key, wins
from local_store.records import parse_timestamp
from local_store.redact import quoted, strip_json_object
from local_store.views import wire_edge, wire_embeddings, wire_nodes
from protocol.query import QueryRequest, QueryResponse
from protocol.rows import EdgeRow, NodeRow
from protocol.settings import DEFAULT_SETTINGS, MemorySettings, load_settings, merge_patch
from protocol.timestamp import format_ns, parse_ns
from syncd.hub.keys import key_from_pem, new_key_pem
from syncd.hub.longpoll import Commits
from syncd.hub.pg.invites import PgInvites
from syncd.hub.pg.marks import batch_end
from syncd.hub.pg.migrate import Conn, migrate
from syncd.hub.pg.recall import VectorTail, keyword_text, run_recall
from syncd.hub.pg.tokens import PgTokens
from syncd.hub.pg.usage import PgUsage
from syncd.hub.store import Page, PageSession, StoreUnavailableError, parse_cursor

log = logging.getLogger("syncd.hub.pg")

NODE_COLS = (*NODE_WIRE, "origin", "content_hash", "deleted", "dedupe_key")
EDGE_COLS = ("id", "src", "dst", "type", "realm", "target_namespace", "props", "created_at",
             "updated_at", "origin", "content_hash", "deleted")
_FLOATS, _SMALLINTS = {"importance"}, {"deleted"}
FOLLOW_SECS = 0.5
FOLLOW_BACKOFF_CAP_SECS = 30.0  # the follower's retries while the database is away
APPLICATION_NAME = "syncd-hub"  # how the hub's sessions show in pg_stat_activity
# PostgreSQL aborts one of two write transactions that wait on each other (a deadlock, a
# serialization failure): it is run again, whole, up to this many times in all.
TX_ATTEMPTS = 4
RETRY_PAUSE_SECS = 0.05  # times the attempt number, at most, with jitter
_RETRYABLE = (asyncpg.DeadlockDetectedError, asyncpg.SerializationError)
# What is a database outage (503 + Retry-After), not a bug (500): no connection, no free
# connection slot, a statement cancelled or timed out, a retried conflict that kept failing.
_UNAVAILABLE = (OSError, asyncpg.InterfaceError, asyncpg.CannotConnectNowError,
                asyncpg.PostgresConnectionError, asyncpg.TooManyConnectionsError,
                asyncpg.QueryCanceledError, asyncio.TimeoutError, *_RETRYABLE)
FEED_CHANNEL = "syncd_hub_feed"  # NOTIFY'd by every import that wrote rows, at its commit
LISTEN_CHECK_SECS = 30.0  # the listening connection is checked this often (a cut link)
T = TypeVar("T")


def _array_type(column: str) -> str:
    return "float8[]" if column in _FLOATS else "int2[]" if column in _SMALLINTS else "text[]"


def _upsert_sql(table: str, columns: tuple[str, ...], extra: str = "", extra_sql: str = "") -> str:
    """``INSERT … SELECT FROM unnest(arrays)`` with the last-writer-wins rule in ``WHERE``:
    one statement per batch, and the database decides the winner under the row lock."""
    n = len(columns)
    arrays = ", ".join(f"${i + 1}::{_array_type(c)}" for i, c in enumerate(columns))
    names = ", ".join(columns)
    select = ", ".join(f"u.{c}" for c in columns)
    if extra:
        names += f", {extra}"
        select += f", {extra_sql.format(n=n)}"
    updates = ", ".join(f"{c} = excluded.{c}" for c in (*columns, "tx") if c != "id")
    if extra:
        updates += f", {extra} = excluded.{extra}"
    extra_array = f", ${n + 2}::text[]" if extra else ""
    extra_alias = ", fts_text" if extra else ""
    return (f"INSERT INTO {table} ({names}, tx) SELECT {select}, ${n + 1}::bigint "
            f"FROM unnest({arrays}{extra_array}) AS u({', '.join(columns)}{extra_alias}) "
            f"ON CONFLICT (id) DO UPDATE SET {updates} "
            f"WHERE ({table}.updated_at, {table}.origin, {table}.content_hash) "
            f"< (excluded.updated_at, excluded.origin, excluded.content_hash) RETURNING id")


NODE_UPSERT = _upsert_sql("memories", NODE_COLS, "fts", "to_tsvector('simple', u.fts_text)")
EDGE_UPSERT = _upsert_sql("edges", EDGE_COLS)
NODE_SQL = "SELECT " + ", ".join(f"m.{c}" for c in NODE_COLS) + " FROM memories m"
EDGE_SQL = "SELECT " + ", ".join(f"e.{c}" for c in EDGE_COLS) + " FROM edges e"
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
VECTOR_UPSERT = ("INSERT INTO vectors (memory_id, model, vec, tx) "
                 "SELECT u.id, $2, u.vec, $4 FROM unnest($1::text[], $3::bytea[]) AS u(id, vec) "
                 "ON CONFLICT (memory_id, model) DO UPDATE SET vec = excluded.vec, tx = excluded.tx")


class PgHubStore:
    kind = "postgresql"

    def __init__(self, pool: asyncpg.Pool, embedder: Embedder, store_id: str) -> None:
        self._pool, self.embedder, self.store_id = pool, embedder, store_id
        self.tokens = PgTokens(self._connection)
        self.invites = PgInvites(self._connection)
        self.usage = PgUsage(self._connection)
        self.vectors = VectorTail(embedder.model_id, embedder.dim)
        self._follower: asyncio.Task[None] | None = None
        self._listener: asyncio.Task[None] | None = None
        self.commits = Commits()
        self._catch_up_lock = asyncio.Lock()
        self._closed = False

    @classmethod
    async def open(cls, dsn: str, *, embedder: Embedder, pool_size: int = 8,
                   follow: bool = True, load_index: bool = True) -> PgHubStore:
        """Connect, migrate (several processes may do this at once), load the vector index.
        ``follow`` keeps the index current from the feed in the background."""
        try:
            pool = await asyncpg.create_pool(
                dsn, min_size=1, max_size=pool_size, command_timeout=120,
                server_settings={"application_name": APPLICATION_NAME})
        except _UNAVAILABLE as exc:
            raise StoreUnavailableError(f"cannot connect to PostgreSQL: {exc}") from exc
        try:
            async with pool.acquire() as conn:
                await migrate(conn)
                store_id = await conn.fetchval("SELECT value FROM hub_meta WHERE key = 'store_id'")
            store = cls(pool, embedder, str(store_id))
            if load_index:
                await store.catch_up()
        except BaseException:
            await pool.close()
            raise
        if follow:
            store._follower = asyncio.create_task(store._follow(), name="pg-vector-follower")
            store._listener = asyncio.create_task(store._listen(dsn), name="pg-feed-listener")
        return store

    @classmethod
    async def admin(cls, dsn: str) -> PgHubStore:
        """For ``syncd hub token``/``key``: migrated, one connection, no vector index."""
        return await cls.open(dsn, embedder=HashingEmbedder(), pool_size=1, follow=False,
                              load_index=False)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.commits.close()
        for task in (self._follower, self._listener):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self._pool.close()

    def now_ns(self) -> int:
        return time.time_ns()

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[Conn]:
        try:
            async with self._pool.acquire() as conn:
                yield conn
        except _UNAVAILABLE as exc:
            raise StoreUnavailableError(f"PostgreSQL unavailable: {exc}") from exc

    # ------------------------------------------------------------------ writes

    async def apply(self, nodes: Sequence[NodeRow], edges: Sequence[EdgeRow], *,
                    model: str) -> ApplyResult:
        """Validate and redact in this process (as the SQLite hub does), then one transaction
        (``_apply_in``): conditional upserts decide the winners, vectors follow them, the feed
        mark closes it. Counted as ``local_store/apply.py`` counts."""
        result = ApplyResult()
        wires = list(nodes)
        node_rows = self._prepare_nodes(wires, result)
        edge_rows = self._prepare_edges(list(edges), result)
        accept = self._vector_of(wires, model)
        applied = await self._transaction(
            lambda conn: self._apply_in(conn, node_rows, edge_rows, accept, model))
        bad_edges = [p for p in result.problems if p.kind == "edge"]
        bad_nodes = sorted([p for p in result.problems if p.kind == "node"] + applied.problems,
                           key=lambda p: p.index)
        result.problems = bad_nodes + bad_edges
        result.applied_nodes, result.applied_edges = applied.nodes, applied.edges
        result.skipped_nodes = len(wires) - len(bad_nodes) - applied.nodes
        result.skipped_edges = len(edges) - len(bad_edges) - applied.edges
        if applied.nodes or applied.edges:
            self.commits.notify()  # this process's polls at once; the others by NOTIFY
        if applied.nodes:
            await self.catch_up()
        return result

    async def _transaction(self, work: Callable[[Conn], Awaitable[T]]) -> T:
        """``work`` in a transaction of its own; when PostgreSQL aborts it for a deadlock or a
        serialization failure, again in a fresh one (``TX_ATTEMPTS`` in all). The last failure
        is an outage to the caller (``StoreUnavailableError``: 503 + Retry-After), not a 500."""
        async with self._connection() as conn:
            for attempt in range(1, TX_ATTEMPTS):
                try:
                    async with conn.transaction():
                        return await work(conn)
                except _RETRYABLE as exc:
                    log.info("write transaction aborted (%s); running it again",
                             type(exc).__name__)
                await asyncio.sleep(random.uniform(0, RETRY_PAUSE_SECS * attempt))
            async with conn.transaction():
                return await work(conn)

    async def _apply_in(self, conn: Conn, nodes: Sequence[_Incoming],
                        edges: Sequence[_Incoming], accept: Callable[[_Incoming], Any],
                        model: str) -> _Applied:
        """One attempt, inside its transaction. Locks are taken in one order in every process
        — the batch's stored memories by id, the memories' upsert by id (new ids are inserted
        in that order too), then the same for edges — so two imports of the same ids wait for
        each other instead of deadlocking. What a row replaces is read under its lock: which
        rows win, and which vectors go stale, are decided against the row as this transaction
        replaces it, never as it was before another import committed."""
        tx = await conn.fetchval("SELECT nextval('hub_tx')")
        stored = await _lock_stored(conn, "memories", {n.row["id"] for n in nodes},
                                    "md5(content)")
        winners, counts, problems = _winners(
            "node", nodes, {mid: (r[1], r[2], r[3]) for mid, r in stored.items()}, accept)
        rows = {mid: row for mid, (row, _) in winners.items()}
        written = await self._write_nodes(conn, rows, tx)
        await self._write_vectors(conn, written, rows, {
            mid: vec for mid, (_, vec) in winners.items() if vec is not None},
            {mid: r[4] for mid, r in stored.items()}, model, tx)
        stored_edges = await _lock_stored(conn, "edges", {e.row["id"] for e in edges})
        edge_winners, edge_counts, _ = _winners(
            "edge", edges, {eid: (r[1], r[2], r[3]) for eid, r in stored_edges.items()},
            _no_check)
        written_edges = await self._write_edges(
            conn, {eid: row for eid, (row, _) in edge_winners.items()}, tx)
        if written or written_edges:
            await conn.execute("SELECT hub_feed_mark($1, $2, $3)", tx,
                               len(written) + len(written_edges), time.time_ns())
            await conn.execute("SELECT pg_notify($1, '')", FEED_CHANNEL)  # sent at commit
        return _Applied(sum(counts[mid] for mid in written),
                        sum(edge_counts[eid] for eid in written_edges), problems)

    def _prepare_nodes(self, wires: list[NodeRow], result: ApplyResult) -> list[_Incoming]:
        """The batch's valid rows, redacted, in batch order; a bad row is reported here (a
        vector's width only once its row wins: ``_vector_of``)."""
        incoming: list[_Incoming] = []
        for index, wire in enumerate(wires):
            try:
                row = node_from_wire(wire)
                _refuse_nul(row)
            except ValidationError as exc:
                result.problems.append(RowProblem("node", index, safe_id(wire.id), exc.field,
                                                  exc.message))
                continue
            incoming.append(_Incoming(index, safe_id(wire.id), row))
        return incoming

    def _vector_of(self, wires: list[NodeRow], model: str,
                   ) -> Callable[[_Incoming], np.ndarray[Any, Any] | None]:
        """A winning row's vector: one of the hub's own model must be of its width
        (``apply.check_width``), another model's keeps its own; none if redaction changed
        the text (embedded from the private span: the hub re-embeds it)."""
        batch = vectors_from_wires(wires)
        dim = self.embedder.dim if model == self.embedder.model_id else None

        def accept(item: _Incoming) -> np.ndarray[Any, Any] | None:
            wire = wires[item.at]
            check_width(wire, dim)
            values = batch[item.at] if batch is not None else vector_from_wire(wire)
            return None if values is not None and redacted_text(wire, item.row) else values
        return accept

    def _prepare_edges(self, wires: list[EdgeRow], result: ApplyResult) -> list[_Incoming]:
        incoming: list[_Incoming] = []
        for index, wire in enumerate(wires):
            try:
                row = edge_from_wire(wire)
                _refuse_nul(row)
            except ValidationError as exc:
                result.problems.append(RowProblem("edge", index, safe_id(wire.id), exc.field,
                                                  exc.message))
                continue
            row["content_hash"] = content_hash(row, EDGE_HASHED)
            incoming.append(_Incoming(index, safe_id(wire.id), row))
        return incoming

    async def _write_nodes(self, conn: Conn, rows: Mapping[str, dict[str, Any]],
                           tx: int) -> set[str]:
        ordered = [rows[mid] for mid in sorted(rows)]
        texts = [keyword_text(row["title"], row["content"], row["tags"]) for row in ordered]
        return await _upsert(conn, NODE_UPSERT, NODE_COLS, ordered, tx, texts)

    async def _write_edges(self, conn: Conn, rows: Mapping[str, dict[str, Any]],
                           tx: int) -> set[str]:
        return await _upsert(conn, EDGE_UPSERT, EDGE_COLS, [rows[eid] for eid in sorted(rows)],
                             tx)

    async def _write_vectors(self, conn: Conn, written: set[str],
                             rows: Mapping[str, dict[str, Any]],
                             vectors: Mapping[str, np.ndarray[Any, Any]],
                             replaced: Mapping[str, str], model: str, tx: int) -> None:
        """A written row's vector replaces the stored one; a row whose content changed from
        what it replaced (``replaced``: md5 of the locked row's content), or that was deleted,
        loses the vectors it had, so no stale vector answers for new text. A row that was not
        there when locked may have been inserted since by another import: its vectors go too.
        (Every vector row written here belongs to a memory row this transaction holds.)"""
        stale = sorted(mid for mid in written if rows[mid]["deleted"] or mid not in replaced
                       or replaced[mid] != _md5(rows[mid]["content"]))
        if stale:
            await conn.execute("UPDATE vectors SET vec = NULL, tx = $2 "
                               "WHERE memory_id = ANY($1::text[]) AND vec IS NOT NULL", stale, tx)
        carry = sorted(mid for mid in written if mid in vectors and not rows[mid]["deleted"])
        if carry:
            await conn.execute(VECTOR_UPSERT, carry, model,
                               [to_blob(vectors[mid]) for mid in carry], tx)

    async def reembed_missing(self, batch: int = 64) -> int:
        """Embed live memories that have no vector of the hub's model. Rows are claimed with
        ``FOR UPDATE SKIP LOCKED``, so several hub processes share the work, never repeat it."""
        model, done = self.embedder.model_id, 0
        while True:
            async with self._connection() as conn, conn.transaction():
                rows = await conn.fetch(
                    "SELECT m.id, m.content FROM memories m WHERE m.deleted = 0 "
                    "AND m.content <> '' AND NOT EXISTS (SELECT 1 FROM vectors v WHERE "
                    "v.memory_id = m.id AND v.model = $1 AND v.vec IS NOT NULL) "
                    "ORDER BY m.id LIMIT $2 FOR UPDATE OF m SKIP LOCKED", model, batch)
                if not rows:
                    break
                embedded = await asyncio.to_thread(self.embedder.embed, [r[1] for r in rows])
                tx = await conn.fetchval("SELECT nextval('hub_tx')")
                await conn.execute(VECTOR_UPSERT, [r[0] for r in rows], model,
                                   [to_blob(np.asarray(v, dtype=np.float32)) for v in embedded],
                                   tx)
                await conn.execute("SELECT hub_feed_mark($1, 0, $2)", tx, time.time_ns())
            done += len(rows)
        if done:
            await self.catch_up()
        return done

    async def next_counter(self, name: str) -> int:
        async with self._connection() as conn:
            value = await conn.fetchval(
                "INSERT INTO counters (name, value) VALUES ($1, 1) ON CONFLICT (name) "
                "DO UPDATE SET value = counters.value + 1 RETURNING value", name)
        return int(value)

    async def settings(self) -> MemorySettings:
        async with self._connection() as conn:
            raw = await conn.fetchval("SELECT value FROM settings WHERE id = 1")
        return DEFAULT_SETTINGS if raw is None else load_settings(raw)[0]

    async def put_settings(self, patch: Mapping[str, object]) -> MemorySettings:
        """Read-merge-write under the row lock, so two processes' patches both land."""
        async with self._connection() as conn, conn.transaction():
            await conn.execute("INSERT INTO settings (id, value) VALUES (1, $1) "
                               "ON CONFLICT (id) DO NOTHING",
                               msgspec.json.encode(DEFAULT_SETTINGS).decode())
            raw = await conn.fetchval("SELECT value FROM settings WHERE id = 1 FOR UPDATE")
            try:
                merged = merge_patch(load_settings(raw)[0], strip_json_object(patch))
            except msgspec.ValidationError as exc:
                raise ValidationError(msgspec_field(str(exc)), str(exc)) from None
            await conn.execute("UPDATE settings SET value = $1 WHERE id = 1",
                               msgspec.json.encode(merged).decode())
        return merged

    async def signing_key(self) -> Ed25519PrivateKey:
        """The hub's entitlement key: the first process to ask creates it, all share it."""
        async with self._connection() as conn:
            await conn.execute("INSERT INTO signing_keys (name, pem) VALUES ('entitlement', $1) "
                               "ON CONFLICT (name) DO NOTHING", new_key_pem().decode())
            stored = await conn.fetchval("SELECT pem FROM signing_keys WHERE name = 'entitlement'")
        return key_from_pem(stored.encode(), "signing_keys.entitlement")

    # ------------------------------------------------------------------ page sessions

    async def add_page_session(self, sid_sha256: str, session: PageSession, *, now_ns: int,
                               keep: int) -> None:
        """The sweep first, on its own: it skips rows another process holds (that process is
        deleting them), so it never waits and never deadlocks. Then one transaction holding the
        token's row: sign-ins with one token through several processes take turns, so none
        leaves the token over ``keep``."""
        token = session.token_sha256
        async with self._connection() as conn:
            await conn.execute("DELETE FROM page_sessions WHERE sid_sha256 IN (SELECT sid_sha256 "
                               "FROM page_sessions WHERE expires_ns <= $1 FOR UPDATE SKIP LOCKED)",
                               now_ns)
            async with conn.transaction():
                await conn.execute("SELECT 1 FROM tokens WHERE sha256 = $1 FOR UPDATE", token)
                await conn.execute("INSERT INTO page_sessions (sid_sha256, token_sha256, csrf, "
                                   "expires_ns) VALUES ($1, $2, $3, $4)", sid_sha256, token,
                                   session.csrf, session.expires_ns)
                await conn.execute("DELETE FROM page_sessions WHERE token_sha256 = $1 AND seq < "
                                   "(SELECT min(seq) FROM (SELECT seq FROM page_sessions WHERE "
                                   "token_sha256 = $1 ORDER BY seq DESC LIMIT $2) AS newest)",
                                   token, keep)

    async def page_session(self, sid_sha256: str, *, now_ns: int) -> PageSession | None:
        async with self._connection() as conn:
            row = await conn.fetchrow("SELECT token_sha256, csrf, expires_ns FROM page_sessions "
                                      "WHERE sid_sha256 = $1 AND expires_ns > $2",
                                      sid_sha256, now_ns)
        return None if row is None else PageSession(token_sha256=row[0], csrf=row[1],
                                                    expires_ns=int(row[2]))

    async def end_page_session(self, sid_sha256: str) -> None:
        async with self._connection() as conn:
            await conn.execute("DELETE FROM page_sessions WHERE sid_sha256 = $1", sid_sha256)

    # ------------------------------------------------------------------ reads

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
        nodes = {n.id: n for n in await self._wire_nodes(conn, node_rows)}
        edges = {r[0]: _wire_edge(r) for r in edge_rows}
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
        nodes = await self._wire_nodes(conn, node_rows)
        return nodes, [_wire_edge(r) for r in edge_rows], format_ns(mark or 0), bool(more)

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
            nodes = await self._wire_nodes(conn, node_rows)
        return nodes, [_wire_edge(r) for r in edge_rows]

    def export_snapshot(self, realm: str | None = None, *, page_rows: int = EXPORT_PAGE_ROWS,
                        ) -> contextlib.AbstractAsyncContextManager[ExportPages]:
        return self._snapshot(realm, page_rows, None)

    @contextlib.asynccontextmanager
    async def _snapshot(self, realm: str | None, page_rows: int,
                        changed: Changed | None) -> AsyncIterator[ExportPages]:
        async with self._connection() as conn, conn.transaction(isolation="repeatable_read",
                                                                readonly=True):
            snapshot = _PgExport(self, conn, realm, page_rows, changed)
            await snapshot.count()
            yield snapshot

    async def _wire_nodes(self, conn: Conn,
                          rows: Sequence[asyncpg.Record]) -> list[NodeRow]:
        """The rows as the plane's, each with its vector of the hub's model or zeros of its
        width (``views.wire_nodes``)."""
        if not rows:
            return []
        found = await conn.fetch(
            "SELECT memory_id, vec FROM vectors WHERE model = $1 AND vec IS NOT NULL "
            "AND memory_id = ANY($2::text[])", self.embedder.model_id, [r[0] for r in rows])
        vectors = wire_embeddings([(r[0], r[1]) for r in found])
        return wire_nodes((dict(zip(NODE_COLS, r, strict=True)) for r in rows), vectors,
                          self.embedder.dim)

    async def recall(self, request: QueryRequest) -> QueryResponse:
        settings = await self.settings()
        async with self._connection() as conn:
            return await run_recall(conn, request, settings, self.embedder, self.vectors)

    async def stats(self) -> dict[str, int]:
        async with self._connection() as conn:
            row = await conn.fetchrow(
                "SELECT (SELECT count(*) FROM memories WHERE deleted = 0), "
                "(SELECT count(*) FROM memories WHERE deleted = 1), "
                "(SELECT count(*) FROM edges WHERE deleted = 0)")
        assert row is not None
        return {"memories": int(row[0]), "tombstones": int(row[1]), "edges": int(row[2]),
                "indexed_vectors": len(self.vectors.index)}

    # ------------------------------------------------------------------ the vector index

    async def catch_up(self) -> int:
        """Bring this process's vector index up to the feed; returns vectors applied."""
        async with self._catch_up_lock, self._connection() as conn:
            return await self.vectors.catch_up(conn)

    async def _follow(self) -> None:
        """Other processes' writes reach this process's index within ``FOLLOW_SECS``. While
        the database is away, retries back off to ``FOLLOW_BACKOFF_CAP_SECS`` and the outage
        is logged once, at its first failure; every retry is logged at debug with its
        traceback, and the return at info. Once per outage, not once per distinct error: a
        database going away fails several ways in turn (shutting down, reset, refused, a
        connection cut mid-statement), and errors that alternate would be logged every retry."""
        wait, failures = FOLLOW_SECS, 0
        while True:
            await asyncio.sleep(wait)
            try:
                await self.catch_up()
            except Exception as exc:  # a database hiccup must not stop the follower for good
                if not failures:
                    log.warning("vector index catch-up failed (%s: %s); retrying, logged again "
                                "when it works", type(exc).__name__, exc)
                log.debug("vector index catch-up failed", exc_info=True)
                failures, wait = failures + 1, min(wait * 2, FOLLOW_BACKOFF_CAP_SECS)
                continue
            if failures:
                log.info("vector index catch-up works again after %d failed attempts", failures)
            failures, wait = 0, FOLLOW_SECS


    async def _listen(self, dsn: str) -> None:
        """``LISTEN`` on a connection of its own: another process's commit bumps ``commits``.
        After (re)connecting it bumps once, for what committed while nobody listened; a lost
        connection is retried as the follower retries, and logged once per outage. While it is
        down, held polls answer at their timeout, and the laptops' next polls read the feed."""
        wait, failures = FOLLOW_SECS, 0
        while True:
            try:
                conn = await asyncpg.connect(dsn, server_settings={
                    "application_name": APPLICATION_NAME})
            except Exception as exc:  # a database away: retried, never fatal
                if not failures:
                    log.warning("cannot LISTEN for other hub processes' commits (%s: %s); "
                                "retrying", type(exc).__name__, exc)
                failures += 1
                await asyncio.sleep(wait)
                wait = min(wait * 2, FOLLOW_BACKOFF_CAP_SECS)
                continue
            try:
                await self._listen_on(conn)
                if failures:
                    log.info("listening for commits again after %d failed attempts", failures)
                failures, wait = 0, FOLLOW_SECS
                await self._while_alive(conn)
            except Exception as exc:
                if not failures:
                    log.warning("lost the LISTEN connection (%s: %s); reconnecting",
                                type(exc).__name__, exc)
                failures += 1
            finally:
                with contextlib.suppress(Exception):
                    await conn.close(timeout=5)

    async def _listen_on(self, conn: asyncpg.Connection) -> None:
        await conn.add_listener(FEED_CHANNEL, lambda *_: self.commits.notify())
        self.commits.notify()

    @staticmethod
    async def _while_alive(conn: asyncpg.Connection) -> None:
        """Raises once ``conn`` is found dead: closed under it, or failing a check."""
        lost = asyncio.Event()
        conn.add_termination_listener(lambda _: lost.set())
        while not lost.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(LISTEN_CHECK_SECS):
                    await lost.wait()
            if not lost.is_set():
                await conn.fetchval("SELECT 1", timeout=10)
        raise ConnectionError("the connection was closed")


async def _upsert(conn: Conn, sql: str, columns: tuple[str, ...],
                  rows: Sequence[dict[str, Any]], tx: int, *extra: object) -> set[str]:
    """One column array per column, one statement; returns the ids that won (were written).
    The rows come sorted by id: they are locked (or inserted) in that order."""
    if not rows:
        return set()
    arrays = [[row[c] for row in rows] for c in columns]
    return {r[0] for r in await conn.fetch(sql, *arrays, tx, *extra)}


async def _lock_stored(conn: Conn, table: str, ids: set[str],
                       *extra: str) -> dict[str, asyncpg.Record]:
    """The stored rows of ``ids`` — id, version key, ``extra`` — locked in id order."""
    if not ids:
        return {}
    columns = ", ".join(("id", "updated_at", "origin", "content_hash", *extra))
    return {r[0]: r for r in await conn.fetch(
        f"SELECT {columns} FROM {table} WHERE id = ANY($1::text[]) ORDER BY id FOR UPDATE",
        sorted(ids))}


class _Incoming(NamedTuple):
    at: int  # the row's index in the batch as it came
    wire_id: str | None  # the id as a problem report names it (``safe_id``)
    row: dict[str, Any]  # validated and redacted


class _Applied(NamedTuple):
    nodes: int
    edges: int
    problems: list[RowProblem]  # winning nodes refused for their vector (``_vector_of``)


def _no_check(item: _Incoming) -> None:
    return None


def _winners(kind: str, incoming: Sequence[_Incoming], stored: Mapping[str, VersionKey],
             accept: Callable[[_Incoming], Any],
             ) -> tuple[dict[str, tuple[dict[str, Any], Any]], Counter[str], list[RowProblem]]:
    """In batch order, as ``local_store/apply.py``: a row wins when it beats what the store
    holds at its turn (the stored row, then this batch's earlier winners); only a winner is
    ``accept``ed (its vector's width checked: a losing row is skipped, never reported). Every
    winner counts once, so two versions of one id in one batch count two; the later is kept.
    Returns the rows to write (with what ``accept`` gave), winners per id, and problems."""
    known: dict[str, VersionKey] = dict(stored)
    winners: dict[str, tuple[dict[str, Any], Any]] = {}
    counts: Counter[str] = Counter()
    problems: list[RowProblem] = []
    for item in incoming:
        key, rid = version_key(item.row), item.row["id"]
        if not wins(key, known.get(rid)):
            continue
        try:
            extra = accept(item)
        except ValidationError as exc:
            problems.append(RowProblem(kind, item.at, item.wire_id, exc.field, exc.message))
            continue
        known[rid] = key
        winners[rid] = (item.row, extra)
        counts[rid] += 1
    return winners, counts, problems


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


def _refuse_nul(row: Mapping[str, Any]) -> None:
    """PostgreSQL text cannot hold U+0000: such a row is refused on its own (a ``row_errors``
    entry naming the field), not the whole import with a 500."""
    for name, value in row.items():
        if isinstance(value, str) and "\x00" in value:
            raise ValidationError(name, "must not contain the NUL character (U+0000)")


def _md5(text: str) -> str:
    return hashlib.md5(text.encode(), usedforsecurity=False).hexdigest()



def _wire_edge(record: asyncpg.Record) -> EdgeRow:
    return wire_edge(dict(zip(EDGE_COLS, record, strict=True)))


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

    def __init__(self, store: PgHubStore, conn: Conn, realm: str | None, page_rows: int,
                 changed: Changed | None = None) -> None:
        self._store, self._conn, self._page_rows = store, conn, page_rows
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
            nodes = await self._store._wire_nodes(self._conn, rows)
            del rows
            yield nodes
            del nodes

    async def edge_pages(self) -> AsyncIterator[list[EdgeRow]]:
        async for rows in self._edges.pages(self._conn, EDGE_SQL, self._page_rows):
            yield [_wire_edge(r) for r in rows]


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

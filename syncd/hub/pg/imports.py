"""The import path of the PostgreSQL hub: one transaction per import — rows validated and
redacted here, locked in one order, upserted under the database's last-writer-wins rule,
vectors following the winners, then the feed mark and the NOTIFY (rules in ``__init__.py``) —
and the re-embedding of memories that have no vector of the hub's model."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

import asyncpg
import numpy as np

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
from local_store.embed import Embedder, to_blob
from local_store.merge import EDGE_HASHED, VersionKey, content_hash, version_key, wins
from protocol.rows import EdgeRow, NodeRow
from syncd.hub.longpoll import Commits
from syncd.hub.pg.migrate import Conn
from syncd.hub.pg.recall import keyword_text
from syncd.hub.pg.rows import EDGE_COLS, NODE_COLS
from syncd.hub.pg.tokens import Connect

log = logging.getLogger("syncd.hub.pg")
_FLOATS, _SMALLINTS = {"importance"}, {"deleted"}
# PostgreSQL aborts one of two write transactions that wait on each other (a deadlock, a
# serialization failure): it is run again, whole, up to this many times in all.
TX_ATTEMPTS = 4
RETRY_PAUSE_SECS = 0.05  # times the attempt number, at most, with jitter
RETRYABLE = (asyncpg.DeadlockDetectedError, asyncpg.SerializationError)
FEED_CHANNEL = "syncd_hub_feed"  # NOTIFY'd by every import that wrote rows, at its commit
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
VECTOR_UPSERT = ("INSERT INTO vectors (memory_id, model, vec, tx) "
                 "SELECT u.id, $2, u.vec, $4 FROM unnest($1::text[], $3::bytea[]) AS u(id, vec) "
                 "ON CONFLICT (memory_id, model) DO UPDATE SET vec = excluded.vec, tx = excluded.tx")


class PgImports:
    """Writes imports (and re-embedded vectors) to the database."""

    def __init__(self, connect: Connect, embedder: Embedder, commits: Commits,
                 catch_up: Callable[[], Awaitable[int]]) -> None:
        """``commits`` wakes this process's held polls; ``catch_up`` brings its vector index
        up to the feed after a write."""
        self._connection, self.embedder = connect, embedder
        self._commits, self._catch_up = commits, catch_up

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
            self._commits.notify()  # this process's polls at once; the others by NOTIFY
        if applied.nodes:
            await self._catch_up()
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
                except RETRYABLE as exc:
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
            await self._catch_up()
        return done


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


def _refuse_nul(row: Mapping[str, Any]) -> None:
    """PostgreSQL text cannot hold U+0000: such a row is refused on its own (a ``row_errors``
    entry naming the field), not the whole import with a 500."""
    for name, value in row.items():
        if isinstance(value, str) and "\x00" in value:
            raise ValidationError(name, "must not contain the NUL character (U+0000)")


def _md5(text: str) -> str:
    return hashlib.md5(text.encode(), usedforsecurity=False).hexdigest()

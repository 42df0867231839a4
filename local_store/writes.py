"""The write path: every mutation of the store is one of these functions, run by the single
writer thread inside one ``BEGIN IMMEDIATE`` transaction (see ``store.Store._write``).

Rules:
  * Input arrives already validated and redacted (``records``) — except remote rows, which
    ``apply`` redacts itself; nothing here embeds or does network I/O.
  * Every version written takes a fresh HLC stamp (``updated_at``) and the next ``local_seq``.
  * A local write queues an outbox entry for the item; an applied remote version never does
    (no echo), and when it replaces the local version it clears that item's entry.
  * Writes are upserts keyed by id, so the FTS triggers see an UPDATE, never a REPLACE.
  * An edge tombstone's props are Kyma's own tombstone form, ``{"deleted":true,"deleted_at":…}``
    (contract §2.3; ``tombstone_props``), stored so: a plane that drops the ``deleted``
    extension (Kyma) still carries the deletion, and every replica holds — and hashes — the
    same props.
  * A version replaced — by a local write or an applied remote one — is kept in the same
    transaction (``versions``: why, for how long), and a hard delete, local or remote, deletes
    every kept version of the memory.
  * A transaction that purges text sets ``purged`` (the store then scrubs the WAL): a hard
    delete, a pulled or imported tombstone without content over a row holding text (also a
    soft tombstone's: its terms stay in FTS5's segments, so the index is merged too), and an
    edge tombstone without reasons over an edge holding them.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from local_store import versions
from local_store.columns import (
    EDGE_ALL,
    EDGE_SELECT,
    EDGE_UPSERT,
    NODE_COLUMNS,
    NODE_SELECT,
    NODE_UPSERT,
    edge_params,
    node_batches,
    node_params,
)
from local_store.db import chunks, marks
from local_store.embed import blob_view, to_blob
from local_store.errors import NotFoundError
from local_store.merge import EDGE_HASHED, content_hash, node_hash, version_key, wins
from local_store.records import Draft, is_placeholder, new_memory_id, preview
from protocol.hlc import TICK_NS, HybridClock
from protocol.rows import edge_id
from protocol.timestamp import format_ns, parse_ns

Row = dict[str, Any]


@dataclass(slots=True)
class Vector:
    model: str
    values: npt.NDArray[np.float32]


def _holds_text(row: Row) -> bool:
    """A soft delete's tombstone still holds the memory's text; a hard delete's does not."""
    return bool(row["content"] or row["title"] or row["topic_key"] or row["provenance"])


class Writer:
    """Owns the writer connection. Only ever called from the writer thread."""

    def __init__(self, conn: sqlite3.Connection, clock: HybridClock, replica_id: str) -> None:
        self.conn = conn
        self.clock = clock
        self.replica_id = replica_id
        self._seq = 0
        self._start_seq = 0
        self.feed = False  # a hub: mark each transaction in the change feed (0003_feed.sql)
        self.purge_index = False  # a hard delete in this transaction: rewrite the FTS index
        # This transaction purged text (a hard delete, or a remote tombstone that purges what
        # a row or an edge held): the store scrubs the WAL after it commits (checkpoint.py).
        self.purged = False
        # (memory_id, model or None for "every model", values or None for removal), collected
        # per transaction so the store can update its in-RAM index after the commit.
        self.vector_events: list[tuple[str, str | None, npt.NDArray[np.float32] | None]] = []
        self.version_policy = versions.VersionPolicy()  # the history kept (``Store.open``)
        self.json_ids = _has_json_each(conn)  # current_keys' fast lookup (SQLite's JSON functions)

    # ------------------------------------------------------------------ transaction frame

    def begin(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")
        self._seq = self._start_seq = int(self.meta("local_seq") or 0)
        self.vector_events = []
        self.purge_index = self.purged = False

    def commit(self) -> None:
        if self.purge_index:
            # FTS5 keeps a removed row's terms in its segments until they are merged: merge
            # them all now, so a hard-deleted text leaves no trace in the index (R13).
            self.conn.execute("INSERT INTO memories_fts (memories_fts) VALUES ('optimize')")
        self.set_meta("local_seq", str(self._seq))
        if self.feed and self._seq > self._start_seq:
            self.conn.execute("INSERT INTO feed (seq, stamp) VALUES (?, ?)",
                              (self._seq, self.clock.now()))
        self.set_meta("hlc_last", str(self.clock.last_ns))
        self.conn.execute("COMMIT")

    def rollback(self) -> None:
        if self.conn.in_transaction:
            self.conn.execute("ROLLBACK")

    def fetch(self, sql: str, params: Sequence[object] = ()) -> list[Any]:
        """Rows of a read inside the writer's transaction (on the writer's thread)."""
        return self.conn.execute(sql, params).fetchall()

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def meta(self, key: str) -> str | None:
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        self.conn.execute(
            "INSERT INTO meta (key, value) VALUES (?, ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (key, value))

    # ------------------------------------------------------------------ reads inside the tx

    def node(self, memory_id: str) -> Row | None:
        cur = self.conn.execute(NODE_SELECT + " WHERE id = ?", (memory_id,))
        found = cur.fetchone()
        return None if found is None else dict(zip(NODE_COLUMNS, found, strict=True))

    def live_node(self, memory_id: str, field: str = "memory_id") -> Row:
        row = self.node(memory_id)
        if row is None or row["deleted"]:
            raise NotFoundError(f"{field}: memory {memory_id} not found")
        return row

    def edge(self, eid: str) -> Row | None:
        found = self.conn.execute(EDGE_SELECT + " WHERE id = ?", (eid,)).fetchone()
        return None if found is None else dict(zip(EDGE_ALL, found, strict=True))

    def find_topic(self, realm: str, topic_key: str) -> Row | None:
        found = self.conn.execute(
            "SELECT id FROM memories WHERE realm = ? AND topic_key = ? AND deleted = 0 "
            "ORDER BY updated_at DESC LIMIT 1", (realm, topic_key)).fetchone()
        return None if found is None else self.node(found[0])

    def find_duplicate(self, realm: str, key: str) -> str | None:
        found = self.conn.execute(
            "SELECT id FROM memories WHERE realm = ? AND dedupe_key = ? AND deleted = 0 "
            "AND invalid_at IS NULL AND status <> 'archived' LIMIT 1", (realm, key)).fetchone()
        return None if found is None else str(found[0])

    # ------------------------------------------------------------------ local versions

    def put_node(self, row: Row, vector: Vector | None = None, *, local: bool = True) -> Row:
        """Stamp and write a new version of a node (a local write unless ``local`` is False)."""
        base = self.version("memories", row["id"]) if local else None
        if local:
            row["updated_at"] = self.stamp_after(base)
            row["origin"] = self.replica_id
            row["base_version"] = base or ""
            if row["created_at"] is None:  # a new memory: created = valid = this stamp
                row["created_at"] = row["updated_at"]
                row["valid_at"] = row["valid_at"] or row["updated_at"]
            if row["deleted"] and row["invalid_at"] is None:
                row["invalid_at"] = row["updated_at"]  # Kyma's soft delete (see ``delete``)
        row["content_hash"] = node_hash(row)
        row["local_seq"] = self.next_seq()
        if local:
            self.keep_version(row, base)
        if local and not row["deleted"]:  # with no new vector, every model's is stale
            self.drop_stale_vectors(row, "" if vector is None else vector.model)
        self.fts_remove([row["id"]])
        self.conn.execute(NODE_UPSERT, node_params(row))
        self.fts_add([row["id"]])
        if row["deleted"]:
            self.conn.execute("DELETE FROM vectors WHERE memory_id = ?", (row["id"],))
            self.vector_events.append((row["id"], None, None))
        if vector is not None:
            self.put_vector(row["id"], vector)
        if local:
            self.enqueue("node", row["id"], row["local_seq"], base)
        return row

    def keep_version(self, row: Row, base: str | None) -> None:
        """Before a local version overwrites the memory: keep the one it replaces
        (``versions``), or purge them all when it is a hard delete's tombstone."""
        if row["deleted"] and not _holds_text(row):
            versions.purge(self, row["id"])
        elif base is not None:
            versions.keep_current(self, row["id"], "deleted" if row["deleted"] else "replaced",
                                  row["content_hash"])

    def drop_stale_vectors(self, row: Row, model: str) -> None:
        """A local content change makes every other model's vector of this memory stale (the
        plane-model vector is pushed only while the content it was made from is unchanged);
        ``model`` ``""``: every model's (the change came without a vector: the embedder
        failed, and re-embedding takes the memory up once it has none)."""
        stale = self.conn.execute(
            "DELETE FROM vectors WHERE memory_id = ? AND model <> ? AND NOT EXISTS "
            "(SELECT 1 FROM memories WHERE id = ? AND content = ?)",
            (row["id"], model, row["id"], row["content"])).rowcount
        if stale:
            self.vector_events.append((row["id"], None, None))

    def put_vector(self, memory_id: str, vector: Vector) -> None:
        self.conn.execute(
            "INSERT INTO vectors (memory_id, model, dim, vec) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (memory_id, model) DO UPDATE SET dim = excluded.dim, vec = excluded.vec",
            (memory_id, vector.model, int(vector.values.shape[0]), to_blob(vector.values)))
        self.vector_events.append((memory_id, vector.model, vector.values))

    def put_edge(self, src: str, dst: str, type_: str, *, realm: str | None,
                 target_namespace: str | None = None, props: str | None = None,
                 deleted: bool = False) -> Row:
        """Stamp and write a new version of an edge; ``deleted``: a tombstone, whose props
        become ``tombstone_props(stamp, props)``."""
        eid = edge_id(src, dst, type_)
        old = self.edge(eid)
        stamp = self.stamp_after(old["updated_at"] if old else None)
        if deleted:
            props = tombstone_props(stamp, props)
        row: Row = {
            "id": eid, "src": src, "dst": dst, "type": type_, "realm": realm,
            "target_namespace": target_namespace, "props": props,
            "created_at": old["created_at"] if old and not old["deleted"] else stamp,
            "updated_at": stamp, "origin": self.replica_id, "deleted": int(deleted),
        }
        row["content_hash"] = content_hash(row, EDGE_HASHED)
        row["local_seq"] = self.next_seq()
        self.conn.execute(EDGE_UPSERT, edge_params(row))
        self.enqueue("edge", eid, row["local_seq"], old["updated_at"] if old else None)
        return row

    def version(self, table: str, item_id: str) -> str | None:
        found = self.conn.execute(f"SELECT updated_at FROM {table} WHERE id = ?",
                                  (item_id,)).fetchone()
        return None if found is None else str(found[0])

    def stamp_after(self, current: str | None) -> str:
        """A fresh HLC stamp, and never one at or before ``current`` (the version it replaces):
        after the clock was pulled back from running ahead, a new version still beats the old."""
        stamp = self.clock.now()
        if current is None or stamp > current:
            return stamp
        return format_ns((parse_ns(current) // TICK_NS + 1) * TICK_NS + self.clock.node)

    def enqueue(self, kind: str, item_id: str, seq: int, base: str | None) -> None:
        """Queue a local edit of an item, which replaced version ``base`` (None: it created
        the item). An entry already queued keeps the base it has: the version the first
        unpushed edit replaced (``replica.stage`` stamps after it, when it stamps again)."""
        self.conn.execute(
            "INSERT INTO outbox (kind, item_id, local_seq, base_version) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (kind, item_id) DO UPDATE SET local_seq = excluded.local_seq, "
            "base_version = coalesce(outbox.base_version, excluded.base_version)",
            (kind, item_id, seq, base or ""))

    def node_from_draft(self, draft: Draft, memory_id: str) -> Row:
        """A node row from a draft; ``put_node`` stamps it (created_at = valid_at = the stamp)."""
        return {
            "id": memory_id, "labels": "Memory", "realm": draft.realm,
            "memory_type": draft.memory_type, "title": draft.title, "content": draft.content,
            "content_preview": preview(draft.content), "tags": draft.tags,
            "importance": draft.importance, "status": draft.status,
            "source_session_id": draft.source_session_id, "source_run_id": draft.source_run_id,
            "created_at": None, "updated_at": None, "valid_at": draft.valid_at,
            "invalid_at": None, "superseded_by": None, "provenance": draft.provenance,
            "topic_key": draft.topic_key, "memory_class": draft.memory_class,
            "space": draft.space, "writer_agent_id": draft.writer_agent_id,
            "origin": self.replica_id, "content_hash": "", "local_seq": 0, "deleted": 0,
            "dedupe_key": draft.dedupe_key, "source_uris": draft.source_uris,
            "mentions": draft.mentions, "last_seen": None, "base_version": None,
        }

    def save(self, draft: Draft, vector: Vector | None) -> dict[str, Any]:
        """Save one memory: topic-key upsert, else exact-duplicate reuse, else a new id."""
        if draft.topic_key:
            existing = self.find_topic(draft.realm, draft.topic_key)
            if existing is not None:
                row = self.node_from_draft(draft, existing["id"])
                self.put_node(row, vector)
                return {"saved": True, "upserted": True, "id": _uuid(row["id"]),
                        "node_id": row["id"], "topic_key": draft.topic_key}
        elif draft.dedupe_key:
            duplicate = self.find_duplicate(draft.realm, draft.dedupe_key)
            if duplicate is not None:
                return {"saved": True, "deduped": True, "id": _uuid(duplicate),
                        "node_id": duplicate}
        row = self.node_from_draft(draft, new_memory_id())
        self.put_node(row, vector)
        for ref in draft.references:
            self.put_edge(row["id"], ref, "REFERENCES", realm=draft.realm)
        return {"saved": True, "id": _uuid(row["id"]), "node_id": row["id"]}

    def mutate(self, memory_id: str, changes: Mapping[str, object],
               field: str = "memory_id") -> Row:
        """A new version of an existing live node with some fields changed."""
        row = self.live_node(memory_id, field)
        row.update(changes)
        return self.put_node(row)

    def delete(self, memory_id: str, *, hard: bool) -> Row:
        """Soft delete keeps the text locally; hard delete purges it — the memory's text,
        identity keys and the reasons on its edges — also after a soft delete. Both leave a
        tombstone; deleting a tombstone again (or purging a purged one) is ``not_found``."""
        # A tombstone is also the plane's own soft delete — archived and invalidated — so a
        # plane that drops the ``deleted`` extension (Kyma does) still hides it everywhere; its
        # edges' tombstones are the plane's own edge tombstone (``tombstone_props``) likewise.
        row = self.node(memory_id)
        if row is None or (row["deleted"] and not (hard and _holds_text(row))):
            raise NotFoundError(f"memory_id: memory {memory_id} not found")
        row.update(deleted=1, status="archived")
        if hard:
            self.purge_index = self.purged = True
            row.update(title=None, content="", content_preview="", tags="", provenance=None,
                       source_uris=None, mentions=None, dedupe_key=None, topic_key=None)
        row = self.put_node(row)
        for edge in self.edges_of(memory_id, tombstones=hard):
            if edge["deleted"] and (edge["props"] is None or bare_tombstone(edge["props"])):
                continue  # a tombstone already, with nothing left to purge (None: an older
                # syncd's tombstone, which kept no props)
            self.put_edge(edge["src"], edge["dst"], edge["type"], realm=edge["realm"],
                          target_namespace=edge["target_namespace"],
                          props=None if hard else edge["props"], deleted=True)
        return row

    def edges_of(self, node_id: str, *, tombstones: bool = False) -> list[Row]:
        live = "" if tombstones else " AND deleted = 0"
        cur = self.conn.execute(EDGE_SELECT + " WHERE (src = ? OR dst = ?)" + live,
                                (node_id, node_id))
        return [dict(zip(EDGE_ALL, found, strict=True)) for found in cur]

    # ------------------------------------------------------------------ remote versions

    def apply_nodes(self, winners: list[tuple[Row, Vector | None]], model: str,
                    new_ids: set[str] | frozenset[str] = frozenset()) -> None:
        """Write remote versions that already won LWW, in bulk. Each replaces any pending local
        edit of its id; a winner without a vector drops the stale vector of that model.

        ``new_ids`` are ids this transaction found absent from the store: they have no row, FTS
        entry, vector or outbox entry to replace, so they take plain INSERTs and skip the
        clean-up statements (a fresh bootstrap is all new ids)."""
        for row, _ in winners:
            row["local_seq"] = self.next_seq()
        old = [(row, vector) for row, vector in winners if row["id"] not in new_ids]
        old_ids = [row["id"] for row, _ in old]
        purged = [row["id"] for row, _ in old if row["deleted"] and not row["content"]]
        if purged and self.any_text(purged):
            # A hard delete's tombstone replaces text: a live row's, indexed, or a soft
            # tombstone's, whose terms FTS5 keeps in its segments until they are merged.
            self.purge_index = self.purged = True
        versions.keep_replaced(self, [row for row, _ in old])
        self.fts_remove(old_ids)
        self.drop_changed_vectors([row for row, _ in old if not row["deleted"]], model)
        for sql, params in node_batches((row for row, _ in winners if row["id"] in new_ids),
                                        upsert=False):
            self.conn.executemany(sql, params)
        for sql, params in node_batches((row for row, _ in old), upsert=True):
            self.conn.executemany(sql, params)
        if winners:
            self.fts_add_seqs(winners[0][0]["local_seq"], winners[-1][0]["local_seq"])
        versions.review_settled(self, old_ids)
        self.conn.executemany(
            "DELETE FROM vectors WHERE memory_id = ? AND (model = ? OR ?)",
            [(row["id"], model, row["deleted"]) for row, vector in old
             if vector is None or row["deleted"]])
        # A pulled vector is a row of ``float32_rows``' little-endian float32 matrix, or
        # ``vector_from_wire``'s array over packed "<f" bytes: contiguous "<f4" either way, so
        # its buffer is bound as is (``blob_view``), with no copy.
        self.conn.executemany(
            "INSERT INTO vectors (memory_id, model, dim, vec) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (memory_id, model) DO UPDATE SET dim = excluded.dim, vec = excluded.vec",
            [(row["id"], vector.model, len(vector.values), blob_view(vector.values))
             for row, vector in winners if vector is not None and not row["deleted"]])
        self.conn.executemany("DELETE FROM outbox WHERE kind = 'node' AND item_id = ?",
                              [(item_id,) for item_id in old_ids])
        events = self.vector_events
        for row, vector in winners:
            if row["deleted"]:
                events.append((row["id"], None, None))
            elif vector is None:
                events.append((row["id"], model, None))
            else:
                events.append((row["id"], vector.model, vector.values))

    def drop_changed_vectors(self, rows: list[Row], model: str) -> None:
        """Before remote versions replace these rows: where the text changed, the vectors of
        models other than ``model`` (the sender's, handled by the caller) describe the old
        text — the local model's among them. They go; re-embedding makes the local one anew."""
        content = {row["id"]: row["content"] for row in rows}
        changed = [mid for chunk in chunks(list(content)) for mid, stored in self.conn.execute(
            f"SELECT id, content FROM memories WHERE id IN ({marks(chunk)})", chunk)
            if stored != content[mid]]
        if not changed:
            return
        self.conn.executemany("DELETE FROM vectors WHERE memory_id = ? AND model <> ?",
                              [(mid, model) for mid in changed])
        self.vector_events.extend((mid, None, None) for mid in changed)

    def apply_edge(self, row: Row) -> bool:
        row["content_hash"] = content_hash(row, EDGE_HASHED)
        current = self.conn.execute(
            "SELECT updated_at, origin, content_hash, props FROM edges WHERE id = ?",
            (row["id"],)).fetchone()
        if not wins(version_key(row), None if current is None else tuple(current[:3])):
            return False
        if (current is not None and row["deleted"] and bare_tombstone(row["props"])
                and _props_hold_text(current[3])):
            self.purged = True  # a hard delete's edge tombstone replaces the edge's reasons
        row["local_seq"] = self.next_seq()
        self.conn.execute(EDGE_UPSERT, edge_params(row))
        self.conn.execute("DELETE FROM outbox WHERE kind = 'edge' AND item_id = ?", (row["id"],))
        return True

    def any_text(self, ids: list[str]) -> bool:
        """Does any of these rows hold text a hard delete purges (``_holds_text``)?"""
        return any(self.conn.execute(
            "SELECT 1 FROM memories WHERE (content <> '' OR coalesce(title, '') <> '' OR "
            "coalesce(topic_key, '') <> '' OR coalesce(provenance, '') <> '') "
            f"AND id IN ({marks(chunk)}) LIMIT 1", chunk).fetchone() for chunk in chunks(ids))

    # FTS5 buffers index changes in RAM while rowids arrive in increasing order and flushes a
    # new segment whenever one arrives out of order: these statements feed it rows sorted by
    # rowid, which makes an apply index much faster than in id order.

    def fts_remove(self, ids: list[str]) -> None:
        """Drop the FTS entries of these ids' current live rows (call before overwriting)."""
        for chunk in chunks(ids):
            self.conn.execute(
                "INSERT INTO memories_fts (memories_fts, rowid, title, content, tags) "
                "SELECT 'delete', rowid, title, content, tags FROM memories "
                f"WHERE deleted = 0 AND id IN ({marks(chunk)}) ORDER BY rowid", chunk)

    def fts_add(self, ids: list[str]) -> None:
        """Index these ids' current live rows (call after writing them)."""
        for chunk in chunks(ids):
            self.conn.execute(
                "INSERT INTO memories_fts (rowid, title, content, tags) "
                "SELECT rowid, title, content, tags FROM memories "
                f"WHERE deleted = 0 AND id IN ({marks(chunk)}) ORDER BY rowid", chunk)

    def fts_add_seqs(self, first: int, last: int) -> None:
        """Index the live rows written with local_seq first..last (one apply's winners)."""
        self.conn.execute(
            "INSERT INTO memories_fts (rowid, title, content, tags) "
            "SELECT rowid, title, content, tags FROM memories "
            "WHERE local_seq BETWEEN ? AND ? AND deleted = 0 ORDER BY rowid", (first, last))

    def current_keys(self, table: str, ids: Iterable[str]) -> dict[str, tuple[str, str, str]]:
        """Version keys of the given ids (for fast re-apply skipping).

        One join of the table with the ids sent as a JSON array, answered as one JSON array:
        faster than ``IN`` lists of 500, which SQLite sorts into a temporary index each, and
        than the same join fetched row by row. One
        value also means one SQLite step, which runs without the GIL while another thread
        works (``apply_batch``'s hasher). A NUL does not survive ``json_each``, so ids holding
        one are looked up in ``IN`` lists, as all are by an SQLite built without its JSON
        functions (before 3.38 they were optional)."""
        wanted = list(ids)
        out: dict[str, tuple[str, str, str]] = {}
        if self.json_ids and "\x00" not in "".join(wanted):
            for chunk in chunks(wanted, JSON_IDS_CHUNK):
                (found,) = self.conn.execute(KEYS_OF_JSON_IDS.format(table=table), (
                    json.dumps(chunk),)).fetchone()
                out.update((r[0], (r[1], r[2], r[3])) for r in _KEYS_DECODER.decode(found))
            return out
        for chunk in chunks(wanted):
            sql = (f"SELECT id, updated_at, origin, content_hash FROM {table} "
                   f"WHERE id IN ({marks(chunk)})")
            for r in self.conn.execute(sql, chunk):
                out[r[0]] = (r[1], r[2], r[3])
        return out


JSON_IDS_CHUNK = 20_000  # ids per lookup: the answer is one string of ~120 bytes an id
KEYS_OF_JSON_IDS = (
    "SELECT json_group_array(json_array(t.id, t.updated_at, t.origin, t.content_hash)) "
    "FROM json_each(?) AS j JOIN {table} AS t ON t.id = j.value")
_KEYS_DECODER = msgspec.json.Decoder(list[tuple[str, str, str, str]])


def _has_json_each(conn: sqlite3.Connection) -> bool:
    try:
        conn.execute("SELECT count(*) FROM json_each('[1]')").fetchone()
    except sqlite3.OperationalError:
        return False
    return True


def _uuid(memory_id: str) -> str:
    return memory_id.removeprefix("memory:")


def props_json(value: Mapping[str, object]) -> str:
    return json.dumps(dict(value), separators=(",", ":"), ensure_ascii=False)


TOMBSTONE_KEYS = frozenset({"deleted", "deleted_at"})


def tombstone_props(stamp: str, props: str | None = None) -> str:
    """Kyma's edge tombstone (contract §2.3): ``{"deleted":true,"deleted_at":"<stamp>"}``,
    after the keys of ``props`` when it is a JSON object (a soft delete keeps the reasons on
    the edge; a hard delete passes None). Other props are dropped: the form must parse as an
    object saying ``"deleted": true`` (``apply.edge_from_wire`` reads it so)."""
    kept = _json_object(props) or {}
    kept.update(deleted=True, deleted_at=stamp)
    return props_json(kept)


def bare_tombstone(props: str | None) -> bool:
    """Are these the props of a tombstone that holds nothing else (nothing left to purge)?"""
    found = _json_object(props)
    return found is not None and found.get("deleted") is True and found.keys() <= TOMBSTONE_KEYS


def _props_hold_text(props: str | None) -> bool:
    """Do an edge's stored props hold more than a bare tombstone (reasons a purge removes)?"""
    if not props:
        return False
    found = _json_object(props)
    return found is None or not found.keys() <= TOMBSTONE_KEYS


def _json_object(text: str | None) -> dict[str, object] | None:
    if not text:
        return None
    try:
        found = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return found if isinstance(found, dict) else None


def write_note(w: Writer, draft: Draft, vector: Vector | None,
               adopt: str | None) -> dict[str, Any]:
    """A ``memory_note`` save on the writer thread (``services/graph.py``): ``Writer.save`` on
    the note's topic key, with two rules of its own. A placeholder (``PLACEHOLDER_TAG``) only
    ever creates: a node that holds its key already is returned unwritten, so no note is ever
    turned into one. A note whose key no node holds (else that node is the note, noted again)
    takes ``adopt``'s id — keeping every edge to it — only if ``adopt`` is, in this
    transaction, still a live placeholder of the realm: another note may have adopted it since
    it was found."""
    assert draft.topic_key is not None  # the note and its placeholders all have one
    existing = w.find_topic(draft.realm, draft.topic_key)
    if is_placeholder(draft.tags):
        if existing is not None:
            return {"saved": False, "id": _uuid(existing["id"]), "node_id": existing["id"],
                    "topic_key": draft.topic_key}
    elif existing is None and adopt is not None:
        stub = w.node(adopt)
        if (stub is not None and not stub["deleted"] and stub["realm"] == draft.realm
                and is_placeholder(stub["tags"])):
            w.put_node(w.node_from_draft(draft, adopt), vector)
            return {"saved": True, "upserted": True, "adopted": True, "id": _uuid(adopt),
                    "node_id": adopt, "topic_key": draft.topic_key}
    return w.save(draft, vector)

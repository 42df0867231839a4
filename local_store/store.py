"""``Store``: the async shell around the memory store. The only class that awaits SQLite.

Rules:
  * Writes run on one dedicated writer thread, each as one ``BEGIN IMMEDIATE`` transaction that
    commits or rolls back whole (``_write``). The thread is the one-writer rule: no other
    connection ever writes, so clients never see "database is locked".
  * Embedding happens before the transaction, never under the write lock.
  * Reads use their own connection on its own thread (WAL snapshot reads, ``query_only``).
  * The HLC's last stamp and ``local_seq`` are persisted in the same transaction as the rows.
  * A transaction that purged text (``Writer.purged``: a hard delete, a remote tombstone that
    purges) returns only after the WAL is scrubbed, or once that is owed to a reader that
    still needs the text (``checkpoint.Checkpointer.scrub``).
  * After each committed write transaction, on the event loop, every callable in
    ``commit_listeners`` is called (a hub wakes its held long-polls, a laptop's sync runner
    pushes a fresh save): cheap, never raising, never writing.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import numpy as np

from local_store import db, replica
from local_store import versions as version_store
from local_store.apply import ApplyResult, apply_batch
from local_store.arguments import (
    int_arg,
    joined_strings,
    lenient_type,
    like_escape,
    msgspec_field,
    parse_links,
    query_request,
)
from local_store.checkpoint import Checkpointer
from local_store.columns import EDGE_ALL, EDGE_SELECT, NODE_COLUMNS, NODE_ID, NODE_SELECT
from local_store.db import chunks, marks
from local_store.embed import Embedder, HashingEmbedder
from local_store.errors import (
    NotFoundError,
    StoreClosedError,
    StoreFullError,
    StoreUnusableError,
    ValidationError,
)
from local_store.exporting import (
    EDGE_VERSIONS,
    Changed,
    ExportSnapshot,
    collect,
    export_snapshot,
)
from local_store.exporting import PAGE_ROWS as EXPORT_PAGE_ROWS
from local_store.feed import feed_page, stored_vectors
from local_store.reader import SyncReader
from local_store.recall import Mode, Recall, Semantic
from local_store.records import (
    EDIT_FIELDS,
    MAX_CONTENT_CHARS,
    MAX_TAG_CHARS,
    Draft,
    build_edit,
    build_save,
    dedupe_key,
    entity_content,
    normalise_memory_id,
    optional_str,
    parse_importance,
    parse_realm,
    parse_status,
    parse_tags,
    parse_timestamp,
    refuse_private_id,
    refuse_private_identity,
    required_str,
    slug,
    stamp_provenance,
)
from local_store.records import preview as content_preview
from local_store.redact import strip_json_object, strip_json_strings
from local_store.reference import Reference, load_reference
from local_store.vectors import VectorIndex
from local_store.versions import VersionPolicy
from local_store.views import (
    edge_view,
    list_view,
    memory_view,
    wire_edge,
    wire_embeddings,
    wire_nodes,
)
from local_store.writes import Vector, Writer, props_json, write_note
from protocol.hlc import HybridClock
from protocol.query import QueryRequest, QueryResponse
from protocol.rows import EdgeRow, NodeRow
from protocol.settings import DEFAULT_SETTINGS, MemorySettings, load_settings, merge_patch

T = TypeVar("T")
log = logging.getLogger("local_store")

MAX_BATCH = 1000
# The store reader's page cache (SQLite's default; the recall reader's is db.CACHE_KIB).
READER_CACHE_KIB = 2000
LIST_LIMIT_DEFAULT = 50
LIST_LIMIT_MAX = 500
FILL_AFTER_VECTORS = 256  # a write of this many vectors starts ``_fill_derived``


class Store:
    """Open with ``await Store.open(data_dir)``; close with ``await store.close()``."""

    def __init__(self, data_dir: Path, embedder: Embedder, writer: Writer,
                 reader: SyncReader, lock: db.DataDirLock,
                 pool: ThreadPoolExecutor, store_id: str) -> None:
        self.data_dir = data_dir
        self.embedder = embedder
        self.store_id = store_id
        self.replica_id = writer.replica_id
        self._writer = writer
        self._reader = reader
        self._lock = lock
        self._pool = pool
        self._closed = False
        self.index = VectorIndex(embedder.model_id, embedder.dim)
        # The embedder's last failure ("Type: message"), None once it works: while it fails,
        # memories are saved without a vector and recall is keyword-only.
        self.embedder_error: str | None = None
        # Some live memory may lack a vector of the embedder's model because the embedder
        # failed (a save while it was down, a re-embedding pass it stopped): the daemon runs
        # ``reembed_missing`` while this holds. True at open: the first pass finds out.
        self.vectors_owed = True
        self._owed_marks = 0  # how often something set it: a pass clears only what it saw
        self._reembedding = asyncio.Lock()  # one re-embedding pass at a time
        self._settings_lock = asyncio.Lock()
        self._recall_reader = SyncReader(data_dir / db.DB_FILENAME)
        # Recall embeds the query and compares it with the index here, while its keyword leg
        # runs on the recall reader's thread.
        self._query_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="syncd-query")
        self._reference: Reference | None = None  # set on the query thread only
        self._filler: threading.Thread | None = None  # ``_fill_derived``'s thread
        self._filling = threading.Lock()
        # Hashes an applied batch's wire rows while the writer looks up their stored keys.
        self._hash_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="syncd-hash")
        self.checkpointer = Checkpointer(data_dir / db.DB_FILENAME, pool, lambda: writer.conn)
        self._settings = DEFAULT_SETTINGS
        # Set by the daemon: None when graph expansion may run, else the reason it may not
        # (recall then runs with expand_hops = 0 and says so in ``gated``/``gate_reason``).
        self.graph_gate: Callable[[], str | None] | None = None
        self.commit_listeners: list[Callable[[], None]] = []  # see the rules above
        self.writer_info: dict[str, object] = {
            "host": socket.gethostname(), "source": "syncd", "client": None,
            "client_version": None,
        }

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    async def open(cls, data_dir: Path | str, *, embedder: Embedder | None = None,
                   wall: Callable[[], int] = time.time_ns, feed: bool = False,
                   versions: VersionPolicy | None = None) -> Store:
        """``feed=True`` (a hub) marks every write transaction in the change feed.
        ``versions``: how much history to keep (``versions.VersionPolicy``'s defaults)."""
        data_dir = Path(data_dir)
        lock = db.DataDirLock(data_dir)
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="syncd-writer")
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(pool, _claim_data_dir, data_dir, lock)
        except BaseException:
            pool.shutdown(wait=False)
            raise
        reader: SyncReader | None = None
        writer: Writer | None = None
        try:
            writer, store_id = await loop.run_in_executor(
                pool, _open_writer, data_dir / db.DB_FILENAME, wall)
            # A pool thread, not aiosqlite's: its thread runs until the connection is closed,
            # so a program that raised before ``close`` never exited; a pool's idle thread
            # ends at interpreter exit (``tests/local_store/test_store_exit.py``).
            reader = SyncReader(data_dir / db.DB_FILENAME, "syncd-reader",
                                cache_kib=READER_CACHE_KIB)
            await reader.run("PRAGMA query_only")  # opens it now: a failure fails the open
        except BaseException:
            if reader is not None:
                await reader.close()
            if writer is not None:
                await loop.run_in_executor(pool, writer.conn.close)
            await loop.run_in_executor(pool, lock.release)
            pool.shutdown(wait=False)
            raise
        assert writer is not None and reader is not None
        store = cls(data_dir, embedder or HashingEmbedder(), writer, reader, lock, pool, store_id)
        writer.version_policy = versions or VersionPolicy()
        try:
            await store._load()
            if feed:
                writer.feed = True
                await store._write(_mark_unfed)
        except BaseException:
            await store.close()
            raise
        return store

    async def _load(self) -> None:
        """Rebuild the in-RAM vector index and load settings (start-up)."""
        model, dim = self.embedder.model_id, self.embedder.dim
        rows = await self._fetch("SELECT memory_id, vec FROM vectors WHERE model = ? AND dim = ?",
                                 (model, dim))
        self.index = VectorIndex.from_rows(model, dim, [r[0] for r in rows],
                                           [r[1] for r in rows])
        # The confident tier's generic texts under this model (``reference.py``; embedded once,
        # then read from the data directory), started here and not awaited: opening stays as
        # fast, and the first recall's query job queues behind it on the one query thread.
        self._query_pool.submit(self._reference_now)
        found = await self._fetch("SELECT value FROM meta WHERE key = 'settings'")
        if found:
            self._settings, problem = load_settings(found[0][0])
            if problem:
                log.warning("stored settings partly unreadable (%s): those fields take "
                            "their defaults until the next PUT of the settings", problem)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._reader.close()
        await self.checkpointer.close()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, self._writer.conn.close)
        await self._recall_reader.close()
        self._query_pool.shutdown(wait=False)
        self._hash_pool.shutdown(wait=False)
        await loop.run_in_executor(self._pool, self._lock.release)
        self._pool.shutdown(wait=False)

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def db_path(self) -> Path:
        return self.data_dir / db.DB_FILENAME

    @property
    def clock(self) -> HybridClock:
        return self._writer.clock

    # ------------------------------------------------------------------ plumbing

    async def _write(self, fn: Callable[[Writer], T], *, foreign_keys: bool = True) -> T:
        """Run ``fn`` on the writer thread inside one BEGIN IMMEDIATE transaction.
        ``foreign_keys=False``: see ``_transaction``."""
        if self._closed:
            raise StoreClosedError("the store is closed")
        loop = asyncio.get_running_loop()
        try:
            result, events, purged = await loop.run_in_executor(
                self._pool, _transaction, self._writer, fn, foreign_keys)
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode & 0xFF != sqlite3.SQLITE_FULL:
                raise
            message = (f"the disk holding {self.data_dir} is full: nothing was written (the "
                       "transaction rolled back); writes work again once there is room")
            log.warning("%s", message)
            raise StoreFullError(message) from None
        self.checkpointer.poke()
        for listener in self.commit_listeners:
            listener()
        if events:
            self.index.apply([(memory_id, values) for memory_id, model, values in events
                              if model is None or model == self.index.model])
            if len(events) >= FILL_AFTER_VECTORS:  # a pulled page, an import
                self._fill_derived()
        if purged:  # the purged text leaves the WAL before the write returns (or is owed)
            await self.checkpointer.scrub()
        return result

    async def _embed(self, texts: list[str]) -> list[Vector]:
        if not texts:
            return []
        loop = asyncio.get_running_loop()
        matrix = await loop.run_in_executor(None, self._run_embedder, texts)
        return [Vector(self.embedder.model_id, np.asarray(row, dtype=np.float32))
                for row in matrix]

    async def _write_embedded(self, texts: list[str],
                              fn: Callable[[Writer, list[Vector | None]], T]) -> T:
        """Embed ``texts`` and write ``fn(writer, vectors)`` — while the embedder fails, with
        None for each vector: a save is never lost to the model. Such a memory is found by
        keyword recall, and is owed a vector (``reembed_missing``) once it is written: owed
        before, a pass could look, find no row and clear the debt."""
        try:
            vectors: list[Vector | None] = list(await self._embed(texts))
        except Exception:
            vectors = [None] * len(texts)
        result = await self._write(lambda w: fn(w, vectors))
        if any(v is None for v in vectors):
            self._owe_vectors()
        return result

    def _run_embedder(self, texts: list[str]) -> Any:
        """``embedder.embed``, keeping ``embedder_error`` (logged when it changes). An answer
        that is not ``len(texts)`` finite vectors of the model's width is a failure like any
        other: stored, it would stand for the memory's meaning forever (re-embedding looks only
        for memories without a vector)."""
        try:
            matrix = _checked(self.embedder.embed(texts), len(texts), self.embedder.dim)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            if error != self.embedder_error:
                log.warning("the embedder %s fails (%s): memories are saved without a vector "
                            "and recall is keyword-only until it works", self.embedder.model_id,
                            error)
            self.embedder_error = error
            raise
        if self.embedder_error is not None:
            log.info("the embedder %s works again", self.embedder.model_id)
            self.embedder_error = None
        return matrix

    async def _fetch(self, sql: str, params: Sequence[object] = ()) -> list[sqlite3.Row]:
        if self._closed:
            raise StoreClosedError("the store is closed")
        return await self._reader.run(sql, params)

    # ------------------------------------------------------------------ saves

    async def save(self, args: Mapping[str, object]) -> dict[str, Any]:
        """``save_memory``: validate + redact + fold, embed, then one transaction."""
        draft = build_save(args, self.writer_info)
        result = await self._write_embedded([draft.content],
                                            lambda w, vectors: w.save(draft, vectors[0]))
        if draft.coerced:
            result["coerced"] = dict(draft.coerced)
        return result

    async def save_many(self, items: Sequence[object]) -> dict[str, Any]:
        """``save_memories``: invalid items are reported by index; the valid ones save together."""
        if not isinstance(items, list | tuple):
            raise ValidationError("memories", "must be a list of memory objects")
        if not items:
            raise ValidationError("memories", "is empty")
        if len(items) > MAX_BATCH:
            raise ValidationError("memories", f"must have at most {MAX_BATCH} items")
        drafts: list[tuple[int, Draft]] = []
        errors: list[str] = []
        for index, item in enumerate(items):
            try:
                if not isinstance(item, Mapping):
                    raise ValidationError(f"memories[{index}]", "must be an object")
                drafts.append((index, build_save(item, self.writer_info,
                                                 label=f"memories[{index}]")))
            except ValidationError as exc:
                errors.append(f"#{index}: {exc}")
        def run(w: Writer, vectors: list[Vector | None]) -> list[dict[str, Any]]:
            return [w.save(d, v) for (_, d), v in zip(drafts, vectors, strict=True)]

        results = (await self._write_embedded([d.content for _, d in drafts], run)
                   if drafts else [])
        ids: list[str | None] = [None] * len(items)
        for (index, _), res in zip(drafts, results, strict=True):
            ids[index] = res["id"]
        out: dict[str, Any] = {"saved": bool(results), "count": len(results), "ids": ids}
        if errors:
            out["errors"] = errors
        return out

    # ------------------------------------------------------------------ mutations

    async def update_status(self, memory_id: object, status: object) -> dict[str, Any]:
        mid = normalise_memory_id(memory_id)
        value = parse_status(status)
        await self._write(lambda w: w.mutate(mid, {"status": value}))
        return {"ok": True, "memory_id": mid, "status": value}

    async def update_importance(self, memory_id: object, importance: object) -> dict[str, Any]:
        mid = normalise_memory_id(memory_id)
        if importance is None:
            raise ValidationError("importance", "is required")
        coerced: dict[str, str] = {}  # a clamp is said, as ``save`` says it
        value = parse_importance(importance, coerced=coerced)
        await self._write(lambda w: w.mutate(mid, {"importance": value}))
        result: dict[str, Any] = {"ok": True, "memory_id": mid, "importance": value}
        if coerced:
            result["coerced"] = coerced
        return result

    async def edit(self, memory_id: object, args: object) -> dict[str, Any]:
        """An edit of a memory's content, title, tags or importance (``records.build_edit``):
        a new version that syncs, with the same id, realm and type. New content is embedded
        again, as a save's is."""
        mid = normalise_memory_id(memory_id)
        changes, coerced = build_edit(args)

        def run(w: Writer, vectors: list[Vector | None]) -> dict[str, Any]:
            row = w.live_node(mid, "memory_id")
            row.update(changes)
            if "content" in changes:
                row["dedupe_key"] = dedupe_key(row["realm"], row["memory_type"], row["content"])
            written = w.put_node(row, vectors[0] if vectors else None)
            result: dict[str, Any] = {"ok": True, "memory_id": mid,
                                      "updated_at": written["updated_at"],
                                      "changed": [f for f in EDIT_FIELDS if f in changes]}
            if coerced:
                result["coerced"] = coerced
            return result

        content = changes.get("content")
        if isinstance(content, str):
            return await self._write_embedded([content], run)
        return await self._write(lambda w: run(w, []))

    async def delete(self, memory_id: object, *, hard: bool = False) -> dict[str, Any]:
        mid = normalise_memory_id(memory_id)
        await self._write(lambda w: w.delete(mid, hard=hard))
        return {"ok": True, "memory_id": mid, "deleted": True, "hard": hard}

    async def judge(self, memory_id: object, target_id: object, verdict: object,
                    reason: object = None) -> dict[str, Any]:
        """``memory_judge``: supersedes/invalidates, merged, or any other verdict as a relation."""
        src = normalise_memory_id(memory_id, "memory_id")
        dst = normalise_memory_id(target_id, "target_id")
        if src == dst:
            raise ValidationError("target_id", "must differ from memory_id")
        raw = strip_json_strings({"verdict": verdict, "reason": reason})
        assert isinstance(raw, dict)
        word = required_str(raw, "verdict").lower()
        why = optional_str(raw, "reason", limit=4000)

        def run(w: Writer) -> dict[str, Any]:
            w.live_node(src, "memory_id")
            target = w.live_node(dst, "target_id")
            if word in ("supersedes", "invalidates"):
                stamp = w.clock.now()
                w.mutate(dst, {"invalid_at": stamp, "superseded_by": src}, "target_id")
                w.put_edge(src, dst, "INVALIDATES", realm=target["realm"],
                           props=props_json({"reason": why}) if why else None)
                return {"ok": True, "verdict": "supersedes", "src": src, "dst": dst}
            if word in ("merged", "merged_into"):
                w.mutate(dst, {"status": "archived"}, "target_id")
                w.put_edge(dst, src, "MERGED_INTO", realm=target["realm"],
                           props=props_json({"reason": why}) if why else None)
                return {"ok": True, "verdict": "merged", "into": src, "from": dst}
            w.put_edge(src, dst, "RELATES_TO", realm=target["realm"],
                       props=props_json({"verdict": word, "reason": why}))
            return {"ok": True, "verdict": word, "src": src, "dst": dst}

        return await self._write(run)

    async def link(self, args: Mapping[str, object]) -> dict[str, Any]:
        """``link_memory_to_entity``: an edge from a memory to any node id (verbatim)."""
        clean = strip_json_object(args)
        refuse_private_identity(args)
        src = normalise_memory_id(clean.get("memory_id"))
        dst = required_str(clean, "target_node_id")
        kind = optional_str(clean, "relationship_type") or "REFERENCES"
        namespace = optional_str(clean, "target_namespace")
        realm_arg = clean.get("realm")

        def run(w: Writer) -> dict[str, Any]:
            node = w.live_node(src)
            realm = node["realm"] if realm_arg is None else parse_realm(realm_arg)
            w.put_edge(src, dst, kind, realm=realm, target_namespace=namespace)
            return {"linked": True, "src": src, "dst": dst, "type": kind}

        return await self._write(run)

    async def ingest_entity(self, args: Mapping[str, object]) -> dict[str, Any]:
        """``ingest_entity``: idempotent per (realm, kind, name) through its topic key, so
        kind and name are identity too: one holding a private span is refused, as other keys
        are."""
        clean = strip_json_object(args)
        refuse_private_identity(args)
        for key in ("kind", "name"):
            if isinstance(value := args.get(key), str):
                refuse_private_id(value, key)
        name = required_str(clean, "name", limit=1000)
        kind = optional_str(clean, "kind")
        if kind is not None and ("," in kind or len(kind) > MAX_TAG_CHARS - len("kind:")):
            # stored as the tag ``kind:<kind>``, so it follows the tag rules
            raise ValidationError("kind", f"must be at most {MAX_TAG_CHARS - len('kind:')} "
                                  "characters, without commas")
        type_ = optional_str(clean, "type")
        icon = optional_str(clean, "icon")
        properties = clean.get("properties")
        if properties is None:
            properties = {}
        elif not isinstance(properties, dict):  # "" / 0 / false / [] too: not "no properties"
            raise ValidationError("properties", "must be an object")
        links = parse_links(clean.get("links"))
        realm = parse_realm(clean.get("realm"))
        topic = f"entity/{kind or 'entity'}/{slug(name)}"
        provenance = {"source": "synthetic", "via": "ingest_entity", "kind": kind,
                      "type": type_, "icon": icon}
        content = entity_content(name, kind, properties, type_, icon)
        if len(content) > MAX_CONTENT_CHARS:
            raise ValidationError("properties", f"make the entity's text {len(content)} "
                                  f"characters long, over the limit of {MAX_CONTENT_CHARS}")
        draft = Draft(
            realm=realm, memory_type="entity", title=name, content=content,
            tags=parse_tags([f"kind:{kind}"] if kind else []), importance=0.5,
            topic_key=topic, provenance=stamp_provenance(provenance, self.writer_info),
        )
        def run(w: Writer, vectors: list[Vector | None]) -> dict[str, Any]:
            saved = w.save(draft, vectors[0])
            for target, relation, namespace in links:
                dst = target if namespace else normalise_memory_id(target, "links")
                w.put_edge(saved["node_id"], dst, relation, realm=realm,
                           target_namespace=namespace)
            return saved

        saved = await self._write_embedded([draft.content], run)
        return {"created": True, "upserted": bool(saved.get("upserted")), "id": saved["id"],
                "node_id": saved["node_id"], "kind": kind, "type": type_, "icon": icon,
                "topic_key": topic, "links": len(links)}

    async def session_summary(self, args: Mapping[str, object]) -> dict[str, Any]:
        """``memory_session_summary``: one summary memory from the non-empty fields."""
        clean = strip_json_object(args)
        parts, sizes = [], dict[str, int]()
        for key, label in (("goal", "Goal"), ("instructions", "Instructions"),
                           ("discoveries", "Discoveries"), ("accomplished", "Accomplished"),
                           ("next_steps", "Next steps"), ("files", "Files")):
            value = clean.get(key)
            if isinstance(value, list):
                value = joined_strings(value, key)
            text = optional_str({key: value}, key, limit=64 * 1024)
            if text:
                parts.append(f"\n{label}: {text}")
                sizes[key] = len(text)
        if not parts:
            raise ValidationError("goal", "nothing to summarize — provide at least one field")
        if len("Session summary.") + sum(len(part) for part in parts) > MAX_CONTENT_CHARS:
            longest = max(sizes, key=lambda key: sizes[key])
            raise ValidationError(longest, f"the fields together must be at most "
                                  f"{MAX_CONTENT_CHARS} characters (this one is the longest)")
        return await self.save({
            "content": "Session summary." + "".join(parts), "title": "Session summary",
            "memory_type": "summary", "importance": 0.6, "tags": ["session-summary"],
            "realm": clean.get("realm"),
        })

    # ------------------------------------------------------------------ replication

    async def apply(self, nodes: Sequence[NodeRow], edges: Sequence[EdgeRow], *,
                    model: str, kept: tuple[str, ...] = ()) -> ApplyResult:
        """Apply remote rows (LWW, idempotent); ``model`` names the embedder of their vectors.
        Vectors of this store's own model must be of its width (a row with another is refused,
        naming ``embedding``); another model's keep theirs. ``kept``: node columns the sender
        never returns, whose held values a row without them keeps (``apply.held_columns``)."""
        node_list, edge_list = list(nodes), list(edges)
        dim = _width(self.embedder, model)
        result = await self._write(lambda w: apply_batch(w, node_list, edge_list, model,
                                                            self._hash_pool, dim=dim, kept=kept),
                                   foreign_keys=False)
        if result.applied_nodes:  # rows of another model, or without a vector, need one
            self._owe_vectors()
        return result

    async def export(self, realm: str | None = None, *, model: str | None = None,
                     include_deleted: bool = False) -> tuple[list[NodeRow], list[EdgeRow]]:
        """Latest versions (archived and invalidated included), as wire rows, in one piece
        (``export_snapshot`` gives them a page at a time)."""
        async with self.export_snapshot(realm, model=model,
                                        include_deleted=include_deleted) as snapshot:
            return await collect(snapshot)

    def export_snapshot(self, realm: str | None = None, *, model: str | None = None,
                        include_deleted: bool = False,
                        page_rows: int = EXPORT_PAGE_ROWS) -> AbstractAsyncContextManager[
                            ExportSnapshot]:
        """What ``export`` returns, read a page at a time from one snapshot (see
        ``local_store/exporting.py``): an export's memory stays bounded by a page."""
        if self._closed:
            raise StoreClosedError("the store is closed")
        model = model or self.embedder.model_id
        return export_snapshot(self.db_path, realm, model=model,
                               include_deleted=include_deleted, page_rows=page_rows,
                               dim=_width(self.embedder, model))

    async def changes(self, since_seq: int, *, limit: int = 1000, realm: str | None = None,
                      model: str | None = None) -> tuple[list[NodeRow], list[EdgeRow], int]:
        """Local versions (tombstones included) with ``local_seq > since_seq``, in commit order;
        nodes optionally of one realm (edges never filtered, as the plane).

        Returns the rows and the cursor to pass next time (the last seq returned).
        """
        nodes, edges, cursor, _ = await self.changes_page(since_seq, limit=limit, realm=realm,
                                                          model=model)
        return nodes, edges, cursor

    async def changes_page(self, since_seq: int, *, limit: int = 1000, realm: str | None = None,
                           model: str | None = None,
                           ) -> tuple[list[NodeRow], list[EdgeRow], int, bool]:
        """``changes`` and whether anything follows the page, all read from one snapshot (one
        read transaction on the recall reader's connection): read apart, an import committed
        between the node and the edge query moved the cursor past nodes never served."""
        if self._closed:
            raise StoreClosedError("the store is closed")
        model = model or self.embedder.model_id
        read = functools.partial(_changes_page, self._recall_reader.fetch, since_seq, limit,
                                 realm, model)
        rows, edge_rows, found, cursor, more = await asyncio.get_running_loop().run_in_executor(
            self._recall_reader.pool, read)
        dicts = [dict(zip(NODE_COLUMNS, r, strict=True)) for r in rows]
        nodes = wire_nodes(dicts, wire_embeddings(found), _width(self.embedder, model))
        edges = [wire_edge(dict(zip(EDGE_ALL, r, strict=True))) for r in edge_rows]
        return nodes, edges, cursor, more

    async def changes_since(self, since: str | None, realm: str | None = None, *,
                            model: str | None = None, edge_version: str = "updated_at",
                            ) -> tuple[list[NodeRow], list[EdgeRow]]:
        """The plane's ``changes?since=`` in one piece (``changes_snapshot`` gives it a page
        at a time)."""
        async with self.changes_snapshot(since, realm, model=model,
                                         edge_version=edge_version) as snapshot:
            return await collect(snapshot)

    def changes_snapshot(self, since: str | None, realm: str | None = None, *,
                         model: str | None = None, edge_version: str = "updated_at",
                         page_rows: int = EXPORT_PAGE_ROWS,
                         ) -> AbstractAsyncContextManager[ExportSnapshot]:
        """The plane's ``changes?since=``, read a page at a time from one snapshot: versions
        strictly after ``since`` (any RFC 3339 form; empty = everything), tombstones included,
        nodes filtered by realm, edges never (as the plane). ``edge_version="created_at"``
        filters edges the plane's way. A bad ``since`` raises here, before any read."""
        if edge_version not in EDGE_VERSIONS:
            raise ValueError(f"edge_version: {edge_version!r}")
        stamp = parse_timestamp(since, "since") if since and since.strip() else None
        if self._closed:
            raise StoreClosedError("the store is closed")
        model = model or self.embedder.model_id
        return export_snapshot(self.db_path, realm, model=model,
                               include_deleted=True, page_rows=page_rows,
                               changed=Changed(stamp or "", edge_version),
                               dim=_width(self.embedder, model))

    async def feed(self, since: str | None, *, limit: int | None = None,
                   realm: str | None = None, model: str | None = None,
                   exclude_origin: str | None = None,
                   ) -> tuple[list[NodeRow], list[EdgeRow], str, bool]:
        """A hub's ``changes``: versions ingested after ``since`` (a previous ``until``), in
        commit order; returns rows, ``until`` and ``has_more`` (see ``feed.py``)."""
        stamp = parse_timestamp(since, "since") if since and since.strip() else None
        if limit is not None and limit < 1:
            raise ValidationError("limit", f"must be >= 1, got {limit}")
        loop = asyncio.get_running_loop()
        model = model or self.embedder.model_id
        page = await loop.run_in_executor(self._recall_reader.pool, functools.partial(
            feed_page, self._recall_reader.fetch, stamp, limit, realm, exclude_origin, model))
        nodes = wire_nodes([dict(zip(NODE_COLUMNS, r, strict=True)) for r in page.node_rows],
                           wire_embeddings(page.vectors), _width(self.embedder, model))
        edges = [wire_edge(dict(zip(EDGE_ALL, r, strict=True))) for r in page.edge_rows]
        return nodes, edges, page.until, page.has_more

    async def sync_state(self) -> dict[str, str]:
        """The sync engine's persisted state (``meta`` keys ``sync.*``, prefix removed)."""
        rows = await self._fetch("SELECT key, value FROM meta WHERE key LIKE 'sync.%'")
        return {r[0].removeprefix(replica.SYNC_PREFIX): r[1] for r in rows}

    async def set_sync_state(self, state: Mapping[str, str | None]) -> None:
        await self._write(lambda w: replica.set_state(w, state))

    async def next_counter(self, name: str) -> int:
        """A durable counter (``meta`` key ``counter.<name>``): 1, 2, 3, … across restarts."""
        def run(w: Writer) -> int:
            value = int(w.meta(f"counter.{name}") or 0) + 1
            w.set_meta(f"counter.{name}", str(value))
            return value
        return await self._write(run)

    async def pull(self, nodes: Sequence[NodeRow], edges: Sequence[EdgeRow], *, model: str,
                   state: Mapping[str, str | None], until: str | None = None,
                   kept: tuple[str, ...] = ()) -> ApplyResult:
        """Apply a pulled batch, let the HLC receive ``until``, and store ``state`` (the new
        cursor) — all in one transaction. ``kept`` as for ``apply``."""
        node_list, edge_list = list(nodes), list(edges)
        dim = _width(self.embedder, model)
        return await self._write(
            lambda w: replica.pull(w, node_list, edge_list, model, state, until, dim=dim,
                                   kept=kept),
            foreign_keys=False)

    def expect_vectors(self, count: int, model: str) -> None:
        """A pull is about to apply up to ``count`` rows with ``model`` vectors: when those go to
        the in-RAM index, it grows once, now, to hold them (``VectorIndex.reserve``)."""
        if count > 0 and model == self.index.model:
            self.index.reserve(count)

    async def correct_clock(self, offset_ns: int) -> bool:
        """Use ``offset_ns`` (to the plane's clock) from now on; when the HLC had run ahead of
        the corrected time by more than the drift bound, pull it back. True if it was. (Queued
        edits it stamped meanwhile are stamped again when staged: ``replica.stage``.)"""
        def run(w: Writer) -> bool:
            w.clock.offset_ns = offset_ns
            now = w.clock.physical_ns()
            ahead = w.clock.last_ns > now + w.clock.max_drift_ns
            if ahead:
                w.clock.rewind(now)
            replica.set_state(w, {"clock_offset_ns": str(offset_ns)})
            return ahead
        return await self._write(run)

    async def stage_push(self, limit: int, *, model: str, dim: int, realm: str | None = None,
                         keep_within_ns: int = 0,
                         ) -> tuple[list[replica.Entry], list[NodeRow], list[EdgeRow]]:
        """Stage up to ``limit`` queued items (re-stamping those older than ``keep_within_ns``)
        and return them as wire rows. Each node carries
        its ``model`` vector, or zeros when there is none or it is not ``dim`` wide (the plane
        requires a vector of its width; a syncd hub reads zeros as none, and the sync engine
        sends a Kyma plane no zeros it could rank: ``SyncEngine._plane_vectors``)."""
        def run(w: Writer) -> tuple[replica.Staged, list[tuple[str, bytes]]]:
            # The vectors are read in the staging transaction: read after it, a save landing
            # in between could pair a staged row with its next version's vector.
            staged = replica.stage(w, limit, realm, keep_within_ns)
            ids = [row["id"] for row in staged.nodes]
            return staged, stored_vectors(w.fetch, ids, model)
        staged, found = await self._write(run)
        nodes = wire_nodes(staged.nodes, wire_embeddings(found), dim)
        return staged.entries, nodes, [wire_edge(row) for row in staged.edges]

    async def outbox_depth(self) -> int:
        (row,) = await self._fetch("SELECT count(*) FROM outbox")
        return int(row[0])

    async def mark_sent(self, entries: Sequence[replica.Entry]) -> list[replica.Sent]:
        """Before a push goes out: the plane may hold these versions from now on."""
        items = list(entries)
        return await self._write(lambda w: replica.mark_sent(w, items))

    async def unmark_sent(self, before: Sequence[replica.Sent]) -> None:
        """The push never reached the plane: back to what ``mark_sent`` found."""
        items = list(before)
        await self._write(lambda w: replica.unmark_sent(w, items))

    async def ack_push(self, entries: Sequence[replica.Entry]) -> int:
        items = list(entries)
        return await self._write(lambda w: replica.ack(w, items))

    async def reconcile(self, nodes: Sequence[NodeRow], edges: Sequence[EdgeRow], *,
                        model: str, realm: str | None = None,
                        state: Mapping[str, str | None] | None = None) -> replica.Reconciled:
        """Anti-entropy: apply a full export, re-queue what the plane lacks or holds older."""
        node_list, edge_list = list(nodes), list(edges)
        dim = _width(self.embedder, model)
        return await self._write(lambda w: replica.reconcile(
            w, node_list, edge_list, model, realm, state or {}, dim=dim), foreign_keys=False)

    async def requeue_unseen(self, remote_nodes: Mapping[str, str],
                             remote_edges: Mapping[str, str], *, realm: str | None = None,
                             state: Mapping[str, str | None] | None = None) -> tuple[int, int]:
        """The second half of a paged anti-entropy (after each page went through ``apply``):
        queue what the plane lacks or holds older; maps from ``replica.remote_versions``."""
        return await self._write(lambda w: replica.requeue_unseen(
            w, remote_nodes, remote_edges, realm, state or {}))

    async def _wire_nodes(self, rows: list[sqlite3.Row], model: str) -> list[NodeRow]:
        """The rows as the plane's, with their ``model`` vectors (zeros for none when the model
        is this store's own, whose width is known: ``views.wire_nodes``)."""
        dicts = [dict(zip(NODE_COLUMNS, r, strict=True)) for r in rows]
        vectors = await self._vectors([d["id"] for d in dicts], model)
        return wire_nodes(dicts, vectors, _width(self.embedder, model))

    async def _vectors(self, ids: list[str], model: str) -> dict[str, list[float]]:
        """Stored vectors of ``model`` as wire lists (same-width ones converted in one batch)."""
        if self._closed:
            raise StoreClosedError("the store is closed")
        loop = asyncio.get_running_loop()
        found = await loop.run_in_executor(self._reader.pool, stored_vectors,
                                           self._reader.fetch, ids, model)
        return wire_embeddings(found)

    # ------------------------------------------------------------------ recall and settings

    async def recall(self, request: QueryRequest | Mapping[str, object], *,
                     mode: Mode = "syncd", graph: bool = True) -> QueryResponse:
        """Hybrid recall (``POST /v1/agent/memory/query``); ``graph=False`` when gated."""
        if self._closed:  # its thread pools are shut down: say so, as writes and reads do
            raise StoreClosedError("the store is closed")
        request = query_request(request)
        if request.as_of is not None:
            parse_timestamp(request.as_of, "as_of")
        started = time.perf_counter()
        gated = self.graph_gate() if graph and self.graph_gate is not None else None
        semantic: Future[Semantic | None] | None = None
        if mode != "keyword" and len(self.index) and request.query.strip():
            semantic = Future()
        loop = asyncio.get_running_loop()
        engine = Recall(self._recall_reader.fetch, semantic, self._settings,
                        memo=self._recall_reader.memo)
        # The keyword leg's thread gets its work first: started second, it waited for a core
        # until the product was done.
        running = loop.run_in_executor(self._recall_reader.pool, functools.partial(
            engine.run, request, mode, graph and gated is None, started))
        if semantic is not None:
            self._start_semantic(semantic, request.query)
        response = await running
        if gated is not None:
            response.gated, response.gate_reason = ["graph"], gated
        return response

    def _start_semantic(self, into: Future[Semantic | None], query: str) -> None:
        """Compute ``_semantic_for(query)`` on the query thread into ``into`` — which always
        settles, so the recall waiting on it never hangs (a refused or cancelled job fails it)."""
        try:
            job = self._query_pool.submit(self._semantic_for, query)
        except BaseException as exc:  # the recall's own thread raises it
            into.set_exception(exc)
            return
        job.add_done_callback(functools.partial(_settle, into))

    def _semantic_for(self, query: str) -> Semantic | None:
        """On the query thread: embed the query and compare it with the index (a locked
        snapshot). Recall's keyword leg runs meanwhile on the recall reader's thread. OpenBLAS
        runs a large product on both cores, so the overlap is partial."""
        try:
            vector = np.asarray(self._run_embedder([query])[0], dtype=np.float32)
        except Exception:  # logged; the keyword leg answers alone
            return None
        if not vector.any():
            return None
        return Semantic(*self.index.snapshot(vector), vector=vector,
                        reference=self._reference_now(), index=self.index)

    def _reference_now(self) -> Reference | None:
        """On the query thread: the generic texts' vectors (``reference.py``), loaded on first
        use; None while the embedder cannot give them (the confident tier then rests on
        keyword evidence alone, and the next recall tries again)."""
        if self._reference is None:
            try:
                self._reference = load_reference(self.embedder, self.data_dir)
            except Exception as exc:
                log.debug("the recall reference is not ready (%s: %s)", type(exc).__name__, exc)
                return None
            self._fill_derived()
        return self._reference

    def _fill_derived(self) -> None:
        """Each memory's best cosine with the generic texts, computed on a thread of its own
        before recall asks for it — at open, and after a write of many vectors (recall
        computes the few others itself: a product per query, which OpenBLAS spreads over both
        cores, and slows while other work keeps them busy)."""
        reference = self._reference
        with self._filling:  # called from the event loop and the query thread
            if reference is None or (self._filler is not None and self._filler.is_alive()):
                return  # a running fill reaches rows added since it started
            self._filler = threading.Thread(
                target=self.index.fill_derived, name="syncd-reference",
                args=(reference.best, lambda: self._closed), daemon=True)
            self._filler.start()

    @property
    def settings(self) -> MemorySettings:
        return self._settings

    async def put_settings(self, patch: Mapping[str, object]) -> MemorySettings:
        """Patch the given keys (nested objects merge) and persist; returns the full settings.
        Strings are redacted like any other text (settings are served to every client)."""
        async with self._settings_lock:  # two patches at once: the second merges the first
            try:
                merged = merge_patch(self._settings, strip_json_object(patch))
            except msgspec.ValidationError as exc:
                raise ValidationError(msgspec_field(str(exc)), str(exc)) from None
            encoded = msgspec.json.encode(merged).decode()
            await self._write(lambda w: w.set_meta("settings", encoded))
            self._settings = merged
            return merged

    async def reembed_missing(self, batch: int = 64,
                              progress: Callable[[int, int], None] | None = None) -> int:
        """Give every live memory a vector of the current embedder's model (those pulled with
        another model's vector stay keyword-searchable until then). Returns how many.
        ``progress(done, total)`` is called after each batch (``total`` is counted at the
        start: memories saved meanwhile embed themselves).

        A batch the embedder fails on is embedded a text at a time: a text it cannot take is
        left without a vector (keyword recall still finds it) and the pass goes on past it,
        rather than failing on it first in every pass. When every text of a batch fails, the
        embedder is what fails: the error is raised, and ``vectors_owed`` stays set.
        A pass that ends without that clears it, unless something owed a vector meanwhile (a
        save the embedder failed, an apply): it never reads False while a pass is under way.
        Passes run one at a time (the daemon's and the one after a pull)."""
        async with self._reembedding:
            marks = self._owed_marks
            count = await self._reembed_pass(batch, progress)
            if self._owed_marks == marks:
                self.vectors_owed = False
            return count

    def _owe_vectors(self) -> None:
        self.vectors_owed = True
        self._owed_marks += 1

    async def _reembed_pass(self, batch: int,
                            progress: Callable[[int, int], None] | None) -> int:
        model, done, after = self.embedder.model_id, 0, -1
        total = int((await self._fetch("SELECT count(*) " + _MISSING_VECTOR, (model,)))[0][0])
        while True:
            rows = await self._fetch("SELECT id, content, local_seq " + _MISSING_VECTOR
                                     + " AND local_seq > ? ORDER BY local_seq LIMIT ?",
                                     (model, after, batch))
            if not rows:
                return done
            after = rows[-1][2]
            try:
                embedded = list(zip(rows, await self._embed([r[1] for r in rows]), strict=True))
            except Exception:
                embedded = await self._embed_one_by_one(rows)
            items = [(r[0], r[1], v) for r, v in embedded]
            await self._write(functools.partial(_put_embedded, items))
            done += len(items)
            if progress is not None:
                progress(done, max(total, done))

    async def _embed_one_by_one(self, rows: list[sqlite3.Row]) -> list[tuple[Any, Vector]]:
        embedded, failure = [], None
        for row in rows:
            try:
                (vector,) = await self._embed([row[1]])
            except Exception as exc:
                failure = exc
                continue
            embedded.append((row, vector))
        if not embedded and failure is not None:
            raise failure
        if failure is not None:
            log.warning("re-embedding skipped %d memories the embedder %s fails on (%s); "
                        "keyword recall still finds them", len(rows) - len(embedded),
                        self.embedder.model_id, failure)
        return embedded

    # ------------------------------------------------------------------ reads

    async def get(self, memory_id: object) -> dict[str, Any]:
        mid = normalise_memory_id(memory_id)
        rows = await self._fetch(NODE_SELECT + " WHERE id = ? AND deleted = 0", (mid,))
        if not rows:
            raise NotFoundError(f"memory_id: memory {mid} not found")
        node = memory_view(dict(zip(NODE_COLUMNS, rows[0], strict=True)))
        edges = await self._fetch(EDGE_SELECT + " WHERE (src = ? OR dst = ?) AND deleted = 0 "
                                  "ORDER BY id", (mid, mid))
        node["edges"] = [edge_view(dict(zip(EDGE_ALL, e, strict=True))) for e in edges]
        return node

    async def active_briefs(self, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Title, type and preview of each of ``ids`` that recall's default filters would still
        find (live, not archived, not invalidated), in one query; others are left out."""
        found: dict[str, dict[str, Any]] = {}
        for chunk in chunks(list(ids)):
            for mid, title, kind, preview in await self._fetch(
                    "SELECT id, title, memory_type, content_preview FROM memories WHERE "
                    "deleted = 0 AND status <> 'archived' AND invalid_at IS NULL AND id IN "
                    f"({marks(chunk)})", chunk):
                found[mid] = {"id": mid, "title": title, "memory_type": kind,
                              "content_preview": preview}
        return found

    async def list_memories(self, args: Mapping[str, object] | None = None) -> dict[str, Any]:
        """``list_memories``: newest first; invalidated and deleted excluded; archived unless asked."""
        clean = strip_json_object({} if args is None else args)
        limit = int_arg(clean, "limit", LIST_LIMIT_DEFAULT, 1, LIST_LIMIT_MAX)
        offset = int_arg(clean, "offset", 0, 0, 10**9)
        where, params = ["deleted = 0", "invalid_at IS NULL"], []
        if clean.get("status") is not None:
            where.append("status = ?")
            params.append(parse_status(clean["status"]))
        else:
            where.append("status <> 'archived'")
        if clean.get("realm") is not None:
            where.append("realm = ?")
            params.append(parse_realm(clean["realm"]))
        if clean.get("memory_type") is not None:
            where.append("memory_type = ?")
            params.append(lenient_type(clean["memory_type"]))
        tags = parse_tags(clean.get("tags"))  # a wrong type is refused, even a falsy one
        for tag in tags.split(",") if tags else []:
            where.append("(',' || tags || ',') LIKE ? ESCAPE '\\'")
            params.append("%," + like_escape(tag) + ",%")
        sql = (NODE_SELECT + " WHERE " + " AND ".join(where)
               + " ORDER BY created_at DESC, id LIMIT ? OFFSET ?")
        rows = await self._fetch(sql, [*params, limit, offset])
        items = [list_view(dict(zip(NODE_COLUMNS, r, strict=True))) for r in rows]
        return {"rows": items, "row_count": len(items), "truncated": len(items) == limit}

    async def stats(self) -> dict[str, int]:
        (counts,) = await self._fetch(
            "SELECT (SELECT count(*) FROM memories WHERE deleted = 0), "
            "(SELECT count(*) FROM memories WHERE deleted = 1), "
            "(SELECT count(*) FROM edges WHERE deleted = 0), (SELECT count(*) FROM outbox)")
        return {"memories": counts[0], "tombstones": counts[1], "edges": counts[2],
                "outbox": counts[3]}

    async def checkpoint(self) -> tuple[int, int, int]:
        """``wal_checkpoint(TRUNCATE)`` on the writer thread: copy the WAL into the database and
        truncate it when no reader still needs it. Returns SQLite's (busy, log, checkpointed)."""
        if self._closed:
            raise StoreClosedError("the store is closed")
        return await self.checkpointer.truncate()

    async def disk_bytes(self) -> int:
        """Bytes on disk of the database and its WAL/shared-memory files."""
        def size() -> int:
            return sum(p.stat().st_size for p in self.data_dir.glob(db.DB_FILENAME + "*")
                       if p.is_file())
        return await asyncio.get_running_loop().run_in_executor(None, size)

    async def outbox(self, limit: int = 1000) -> list[tuple[str, str, int]]:
        rows = await self._fetch(
            "SELECT kind, item_id, local_seq FROM outbox ORDER BY local_seq LIMIT ?", (limit,))
        return [(r[0], r[1], r[2]) for r in rows]

    async def dump(self) -> dict[str, list[tuple[Any, ...]]]:
        """Every table's rows, ordered — for "the store is unchanged" assertions."""
        out: dict[str, list[tuple[Any, ...]]] = {}
        for table, order in (("meta", "key"), ("memories", "id"), ("vectors", "memory_id, model"),
                             ("edges", "id"), ("outbox", "kind, item_id"),
                             ("memory_versions", "n")):
            out[table] = [tuple(r) for r in await self._fetch(
                f"SELECT * FROM {table} ORDER BY {order}")]
        return out

    # ------------------------------------------------------------------ versions

    async def versions(self, memory_id: object) -> dict[str, Any]:
        """The memory's versions, newest first, the current one first (``reason`` current)."""
        mid = normalise_memory_id(memory_id)
        rows = await self._fetch(NODE_SELECT + " WHERE id = ?", (mid,))
        current = dict(zip(NODE_COLUMNS, rows[0], strict=True)) if rows else None
        if current is None or (current["deleted"] and not current["content"]):
            raise NotFoundError(f"memory_id: memory {mid} not found")
        kept = await self._fetch(version_store.LIST_SQL, (mid,))
        return {"memory_id": mid, "versions": [version_store.current_view(current)]
                + [version_store.version_view(r) for r in kept]}

    async def restore_version(self, memory_id: object, n: object) -> dict[str, Any]:
        """Make version ``n`` current: a new local edit (it syncs), embedded like a save.
        A conflict restored is reviewed."""
        mid, number = normalise_memory_id(memory_id), version_store.parse_n(n)
        found = await self._fetch("SELECT content FROM memory_versions WHERE n = ? AND "
                                  "memory_id = ?", (number, mid))
        if not found:
            await self.versions(mid)  # an unknown memory is named as such
            raise NotFoundError(f"n: version {number} of memory {mid} not found")

        def run(w: Writer, vectors: list[Vector | None]) -> dict[str, Any]:
            version = version_store.version_row(w, mid, number)
            current = w.node(mid)
            if current is None or (current["deleted"] and not current["content"]):
                raise NotFoundError(f"memory_id: memory {mid} not found")
            row = version_store.restored_row(current, version)
            same = vectors[0] is not None and row["content"] == found[0][0]
            w.put_node(row, vectors[0] if same else None)
            version_store.mark_reviewed(w, mid, number)
            return {"ok": True, "memory_id": mid, "restored": number,
                    "updated_at": row["updated_at"]}

        return await self._write_embedded([found[0][0]], run)

    async def dismiss_version(self, memory_id: object, n: object) -> dict[str, Any]:
        """Mark conflict ``n`` reviewed; the memory is unchanged."""
        mid, number = normalise_memory_id(memory_id), version_store.parse_n(n)
        await self.versions(mid)
        return await self._write(lambda w: version_store.dismiss(w, mid, number))

    async def conflicts(self, limit: int = version_store.CONFLICT_LIST) -> dict[str, Any]:
        """Conflict versions not yet reviewed: their count and the newest ``limit``."""
        (count,) = await self._fetch("SELECT count(*) FROM memory_versions WHERE "
                                     "reason = 'conflict' AND reviewed = 0")
        rows = await self._fetch(version_store.OPEN_CONFLICTS_SQL, (limit,))
        return {"count": int(count[0]), "items": [
            {"memory_id": r[0], "n": r[1], "title": r[2], "content_preview": content_preview(r[3]),
             "updated_at": r[4], "origin": r[5]} for r in rows]}

    async def prune_versions(self) -> int:
        """Forget versions older than the policy's age bound (the daemon runs it now and
        then; writes prune as they keep). Returns how many went."""
        return await self._write(version_store.prune_old)

    async def integrity_check(self) -> str:
        rows = await self._fetch("PRAGMA integrity_check")
        return "; ".join(str(r[0]) for r in rows)

    async def save_note(self, args: Mapping[str, object], *,
                        adopt: str | None = None) -> dict[str, Any]:
        """``memory_note``'s save: ``save`` by topic key, except that a placeholder never
        overwrites a node holding its key, and a note new to its key takes the id of ``adopt``
        while that is a placeholder of its realm (``writes.write_note``): one node, whose
        edges stay, instead of the placeholder beside the note."""
        draft = build_save(args, self.writer_info)
        if draft.topic_key is None:
            raise ValidationError("topic_key", "is required: a note is saved by its topic key")
        return await self._write_embedded(
            [draft.content], lambda w, vectors: write_note(w, draft, vectors[0], adopt))


def _width(embedder: Embedder, model: str) -> int | None:
    """The width vectors of ``model`` have here: the embedder's for its own model, else not
    known (a plane's model as pulled: its rows keep whatever width they came with)."""
    return embedder.dim if model == embedder.model_id else None


# ---------------------------------------------------------------------- writer-thread helpers

_MISSING_VECTOR = ("FROM memories WHERE deleted = 0 AND content <> '' AND id NOT IN "
                   "(SELECT memory_id FROM vectors WHERE model = ?)")


def _checked(matrix: Any, rows: int, dim: int) -> Any:
    """``matrix`` if it holds ``rows`` finite vectors of ``dim`` values; else ValueError."""
    shape = np.shape(matrix)
    if shape != (rows, dim):
        raise ValueError(f"the embedder answered {shape} for {rows} texts of width {dim}")
    if not np.isfinite(np.asarray(matrix, dtype=np.float64)).all():
        raise ValueError("the embedder answered a value that is not a finite number")
    return matrix


def _put_embedded(items: list[tuple[str, str, Vector]], w: Writer) -> None:
    """Store re-embedded vectors unless the memory changed meanwhile (its new version embedded
    itself). Vectors are derived data: no new version, no outbox entry."""
    for memory_id, content, vector in items:
        row = w.node(memory_id)
        if row is not None and not row["deleted"] and row["content"] == content:
            w.put_vector(memory_id, vector)


def _mark_unfed(w: Writer) -> None:
    """A store that becomes a hub: one mark covering every version written before."""
    last = w.conn.execute("SELECT max(seq) FROM feed").fetchone()[0] or 0
    current = int(w.meta("local_seq") or 0)
    if current > last:
        w.conn.execute("INSERT INTO feed (seq, stamp) VALUES (?, ?)", (current, w.clock.now()))


def _claim_data_dir(data_dir: Path, lock: db.DataDirLock) -> None:
    """Create (0700) and lock the data directory; a path that cannot be one (a file in the
    way, no permission) is ``StoreUnusableError``, as no retry will fix it."""
    try:
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock.acquire()  # StoreLockedError (not an OSError) passes through
    except OSError as exc:
        raise StoreUnusableError(
            f"data directory {data_dir} cannot be used: {exc.strerror or exc}"
            + (" (a file is in the way)" if data_dir.is_file() else "")) from None


def _open_writer(path: Path, wall: Callable[[], int]) -> tuple[Writer, str]:
    conn = db.open_migrated(path)
    conn.execute("BEGIN IMMEDIATE")
    try:
        values = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        if "store_id" not in values:
            values["store_id"] = secrets.token_hex(16)
            values["replica_id"] = secrets.token_hex(8)
            values["hlc_node"] = str(int(values["replica_id"], 16) % 1000)
            for key in ("store_id", "replica_id", "hlc_node"):
                conn.execute("INSERT INTO meta (key, value) VALUES (?, ?)", (key, values[key]))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        conn.close()
        raise
    clock = HybridClock(int(values["hlc_node"]), wall=wall,
                        last_ns=int(values.get("hlc_last", "0")))
    return Writer(conn, clock, values["replica_id"]), values["store_id"]


def _changes_page(fetch: Callable[[str, Sequence[object]], list[Any]], since_seq: int, limit: int,
                  realm: str | None, model: str,
                  ) -> tuple[list[Any], list[Any], list[tuple[str, bytes]], int, bool]:
    """``Store.changes_page``'s reads, in one read transaction (on the reader's thread): node
    rows, edge rows, the nodes' ``model`` vectors, the cursor, and whether more follows."""
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


def _settle(into: Future[T], done: Future[T]) -> None:
    """Pass ``done``'s outcome on to ``into``."""
    if done.cancelled():
        into.set_exception(StoreClosedError("the store closed during recall"))
    elif (error := done.exception()) is not None:
        into.set_exception(error)
    else:
        into.set_result(done.result())


def _transaction(writer: Writer, fn: Callable[[Writer], T],
                 foreign_keys: bool = True) -> tuple[T, list[Any], bool]:
    """``foreign_keys=False`` (batch applies) skips SQLite's check that each vector's memory
    exists — one index lookup per vector, 3–4% of a fresh 10k apply's CPU. ``apply_batch``
    writes a vector only for a memory row it writes in the same transaction, and memory rows
    are never deleted (a delete leaves a tombstone row), so the reference holds regardless;
    ``tests/local_store/test_apply.py`` checks it (``PRAGMA foreign_key_check``). The pragma is a no-op inside a
    transaction, so it is switched around one."""
    if not foreign_keys:
        writer.conn.execute("PRAGMA foreign_keys = OFF")
    try:
        writer.begin()
        try:
            result = fn(writer)
            writer.commit()
        except BaseException:
            writer.rollback()
            raise
    finally:
        if not foreign_keys:
            writer.conn.execute("PRAGMA foreign_keys = ON")
    return result, writer.vector_events, writer.purged



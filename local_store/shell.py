"""``Store``'s shell: the connections, the writer thread and the transactions every service runs in.

The services (``local_store/services/``) sit on it: each reads through ``_fetch`` and writes
through ``_write``/``_write_embedded``; the shell knows none of them (import-linter checks it).

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
  * The shell owns the in-RAM vector index: each committed vector goes into it, and a write
    of many vectors starts the derived-score fill (``_fill_derived``).
  * The index can be dropped (``drop_index``: a pull about to bring more vectors than it has
    room for) and is then rebuilt from the ``vectors`` table when recall next needs it
    (``ensure_index``), on the writer thread: no commit lands between the rebuild's read and
    its install, and every later commit is applied to the rebuilt index. While it is dropped,
    commits leave it alone.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Self, TypeVar

import numpy as np

from local_store import db
from local_store.checkpoint import Checkpointer
from local_store.embed import Embedder, HashingEmbedder
from local_store.errors import (
    StoreClosedError,
    StoreFullError,
    StoreUnusableError,
)
from local_store.reader import SyncReader
from local_store.reference import Reference, load_reference
from local_store.vectors import VectorIndex
from local_store.versions import VersionPolicy
from local_store.writes import Vector, Writer
from protocol.hlc import HybridClock

T = TypeVar("T")
log = logging.getLogger("local_store")

# The store reader's page cache (SQLite's default; the recall reader's is db.CACHE_KIB).
READER_CACHE_KIB = 2000
FILL_AFTER_VECTORS = 256  # a write of this many vectors starts ``_fill_derived``
INDEX_READ_ROWS = 256  # vectors read at a time when the index is built (~400 KB of blobs)


class Shell:
    """The store's connections and transactions; ``Store`` adds the services on top."""

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
        self._index_stale = False  # True while the index is dropped and not yet rebuilt
        self._index_rebuild: asyncio.Task[None] | None = None
        # The embedder's last failure ("Type: message"), None once it works: while it fails,
        # memories are saved without a vector and recall is keyword-only.
        self.embedder_error: str | None = None
        # Some live memory may lack a vector of the embedder's model because the embedder
        # failed (a save while it was down, a re-embedding pass it stopped): the daemon runs
        # ``store.embedding.reembed_missing`` while this holds. True at open: the first pass
        # finds out.
        self.vectors_owed = True
        self._owed_marks = 0  # how often something set it: a pass clears only what it saw
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
                   versions: VersionPolicy | None = None) -> Self:
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
        """Rebuild the in-RAM vector index (start-up); ``Store`` loads its services' state too."""
        loop = asyncio.get_running_loop()
        self.index = await loop.run_in_executor(
            self._pool, _read_index, self._writer, self.embedder.model_id, self.embedder.dim)
        # The confident tier's generic texts under this model (``reference.py``; embedded once,
        # then read from the data directory), started here and not awaited: opening stays as
        # fast, and the first recall's query job queues behind it on the one query thread.
        self._query_pool.submit(self._reference_now)

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

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def db_path(self) -> Path:
        return self.data_dir / db.DB_FILENAME

    @property
    def clock(self) -> HybridClock:
        return self._writer.clock

    # ------------------------------------------------------------------ the vector index

    @property
    def index_stale(self) -> bool:
        """Whether the index is dropped until recall next needs it (``drop_index``)."""
        return self._index_stale

    def drop_index(self) -> None:
        """Free the in-RAM index until ``ensure_index`` rebuilds it from the ``vectors`` table.
        A pull that brings more new vectors than the matrix has room for calls it: growing in
        place makes a larger matrix and copies the old one into it while the pull's batches
        are held, where a rebuild after the pull makes the same matrix with neither beside it
        (``bench/one_body_pull.py``). Commits leave a dropped index alone."""
        self._index_stale = True
        self.index = VectorIndex(self.embedder.model_id, self.embedder.dim, capacity=1)

    async def ensure_index(self) -> None:
        """Rebuild a dropped index now (one rebuild however many callers wait for it)."""
        while self._index_stale:
            if self._closed:
                raise StoreClosedError("the store is closed")
            rebuild = self._index_rebuild
            if rebuild is None or rebuild.done():
                rebuild = self._index_rebuild = asyncio.ensure_future(self._rebuild_index())
            await asyncio.shield(rebuild)

    async def _rebuild_index(self) -> None:
        """Read every stored vector on the writer thread and install the index on the loop.
        The writer runs one job at a time and the loop resumes its awaiters in the order the
        jobs finished, so every commit before the read is in it, and every commit after it
        is applied (by ``_write``) to the index installed here — a drop meanwhile included."""
        loop = asyncio.get_running_loop()
        index = await loop.run_in_executor(
            self._pool, _read_index, self._writer, self.embedder.model_id, self.embedder.dim)
        if self._closed:
            return
        self.index = index
        self._index_stale = False
        log.info("rebuilt the vector index: %d vectors", len(index))
        self._fill_derived()

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
        if events and not self._index_stale:
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

    def _owe_vectors(self) -> None:
        """Some live memory may lack a vector of the embedder's model (``vectors_owed``)."""
        self.vectors_owed = True
        self._owed_marks += 1

    def _width(self, model: str) -> int | None:
        """The width vectors of ``model`` have here: the embedder's for its own model, else not
        known (a plane's model as pulled: its rows keep whatever width they came with)."""
        return self.embedder.dim if model == self.embedder.model_id else None

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
            index = self.index
            self._filler = threading.Thread(
                target=index.fill_derived, name="syncd-reference",
                args=(reference.best, lambda: self._closed or self.index is not index),
                daemon=True)
            self._filler.start()


# ---------------------------------------------------------------------- writer-thread helpers

def _checked(matrix: Any, rows: int, dim: int) -> Any:
    """``matrix`` if it holds ``rows`` finite vectors of ``dim`` values; else ValueError."""
    shape = np.shape(matrix)
    if shape != (rows, dim):
        raise ValueError(f"the embedder answered {shape} for {rows} texts of width {dim}")
    if not np.isfinite(np.asarray(matrix, dtype=np.float64)).all():
        raise ValueError("the embedder answered a value that is not a finite number")
    return matrix


def _read_index(w: Writer, model: str, dim: int) -> VectorIndex:
    """The index of every stored vector of ``model`` and ``dim``, read in one snapshot on the
    writer's thread a block at a time: a list of every blob first was as large again as the
    index (150 MB at 100k memories)."""
    where = "FROM vectors WHERE model = ? AND dim = ?"
    w.conn.execute("BEGIN")
    try:
        (count,) = w.conn.execute(f"SELECT count(*) {where}", (model, dim)).fetchone()
        cursor = w.conn.execute(f"SELECT memory_id, vec {where}", (model, dim))
        return VectorIndex.from_blocks(model, dim, count,
                                       iter(lambda: cursor.fetchmany(INDEX_READ_ROWS), []))
    finally:
        w.conn.execute("COMMIT")  # it only read


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



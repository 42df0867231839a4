"""SQLite plumbing: the data-dir lock, connections, pragmas and numbered migrations.

Rules:
  * One process per data directory: ``DataDirLock`` holds an exclusive ``flock`` on
    ``<data-dir>/syncd.lock`` for the store's lifetime; a second opener fails at once.
  * WAL with ``synchronous=NORMAL``: a committed transaction survives a process crash (kill -9);
    only an OS crash or power loss can drop the last commits. ``busy_timeout`` covers the
    checkpointer and outside readers (CLI, backup); ``journal_size_limit`` bounds the WAL.
  * Checkpoints run on their own thread after each write (``checkpoint.Checkpointer``); the
    automatic checkpoint inside a COMMIT is only a backstop at ``BACKSTOP_BYTES`` of WAL.
  * The writer runs with ``secure_delete = ON`` (SQLite's default only where it was built so,
    as Debian's is; not macOS's): a deleted or rewritten row's bytes, and the pages freed
    under it (an FTS segment merged away), are zeroed in the page, so a purged text is off
    ``memory.db`` once the WAL is checkpointed (``checkpoint`` scrubs after a purge).
  * A new store file gets ``PAGE_SIZE`` pages (8 KiB; SQLite's default is 4 KiB). A 10,000-row
    bootstrap commits ~30 MB: with half as many pages it writes half as many WAL frames and
    splits b-tree pages half as often (bench/store.py;
    recall and save no slower). A store created with other pages keeps them: WAL mode fixes
    the page size of a file once it has any.
  * Migrations are ``schema/NNNN_name.sql`` applied in order, each in its own transaction
    together with its ``schema_migrations`` record. Applied files are never edited.
  * A statement about many ids takes them ``IN_LIST`` at a time (``chunks``, ``marks``): well
    under SQLite's bound-parameter limit, whatever else the statement binds.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import stat
from collections.abc import Iterator, Sequence, Sized
from importlib import resources
from pathlib import Path
from typing import TypeVar
from urllib.parse import quote

from local_store.errors import StoreLockedError, StoreUnusableError

DB_FILENAME = "memory.db"
LOCK_FILENAME = "syncd.lock"
BUSY_TIMEOUT_MS = 10_000
JOURNAL_SIZE_LIMIT = 64 * 1024 * 1024
CACHE_KIB = 64 * 1024  # a reader's page cache: recall reads the same FTS and row pages again
# The writer's: it writes each page once and moves on, so a big private cache only fills during
# a large apply (a pull of 100k rows) and stays resident; the kernel caches the file anyway.
WRITER_CACHE_KIB = 16 * 1024
BACKSTOP_BYTES = 40 * 1024 * 1024
PAGE_SIZE = 8192
IN_LIST = 500  # ids per ``IN (…)`` list


class DataDirLock:
    """An exclusive advisory lock on the data directory, released on close or process death."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / LOCK_FILENAME
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StoreLockedError(
                f"data directory {self.path.parent} is in use by another syncd process "
                f"(pid {holder}); stop it or choose another --data-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def connect(path: Path, *, readonly: bool = False) -> sqlite3.Connection:
    """A connection in autocommit mode; transactions are explicit (``BEGIN IMMEDIATE``)."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False,
                           cached_statements=256)
    try:
        _configure(conn, readonly=readonly)
    except BaseException:
        conn.close()
        raise
    return conn


def open_migrated(path: Path) -> sqlite3.Connection:
    """The writer's connection, with every migration applied. A file that is not a usable
    store (not SQLite, corrupt, migrated by a newer syncd, or one this process cannot open or
    write) raises ``StoreUnusableError`` naming it and the cause, and is left as it was. A new
    file is created 0600, as everything else in the data directory (SQLite gives its -wal and
    -shm files the same mode)."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    try:
        conn = connect(path)
        try:
            migrate(conn)
            _check_writable(conn)
        except BaseException:
            conn.close()
            raise
    except StoreUnusableError as exc:
        raise StoreUnusableError(f"{path} cannot be used: {exc.message}") from None
    except sqlite3.DatabaseError as exc:
        code = exc.sqlite_errorcode & 0xFF  # the primary code of an extended one
        if code in (sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_READONLY):
            raise StoreUnusableError(f"{path} cannot be used: {exc}: "
                                     f"{_access_problem(path)}") from None
        if code not in (sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT):
            raise
        raise StoreUnusableError(
            f"{path} cannot be used: {exc}. It was left as it is: move it aside and restore "
            "a backup (`syncd backup` makes them), or start with an empty data directory "
            "and let sync fill it again") from None
    return conn


def _check_writable(conn: sqlite3.Connection) -> None:
    """SQLite opens a file it may not write (another user's, mode 0444, a read-only mount)
    read-only without a word, and a store whose migrations are all applied writes nothing
    while it opens: a write that changes no row makes that ``SQLITE_READONLY`` here, at
    start-up, instead of at the first save."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("DELETE FROM schema_migrations WHERE number < 0")
    finally:
        conn.execute("ROLLBACK")


def _access_problem(path: Path) -> str:
    """What about ``path`` keeps SQLite from opening it for writing, as far as its metadata
    says (the caller gives SQLite's own message first)."""
    if path.is_dir():
        return "it is a directory, not a database file"
    try:
        st = path.stat()
    except OSError as exc:
        return exc.strerror or str(exc)
    return (f"syncd runs as uid {os.getuid()} and must be able to read and write it (owner "
            f"uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}), its -wal and -shm files "
            "and its directory")


def _configure(conn: sqlite3.Connection, *, readonly: bool) -> None:
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA foreign_keys = ON")
    if readonly:
        conn.execute("PRAGMA query_only = ON")
    else:
        conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")  # before WAL; only a new file takes it
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA secure_delete = ON")  # freed cells and pages are zeroed
        conn.execute(f"PRAGMA journal_size_limit = {JOURNAL_SIZE_LIMIT}")
    page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
    if not readonly:
        conn.execute(f"PRAGMA wal_autocheckpoint = {BACKSTOP_BYTES // page_size}")
    # Last, once the page size is the file's: SQLite turns a size in KiB into a number of pages
    # when the page size changes, by the page size before the change — set earlier, a new
    # store's 8 KiB pages got a cache of twice the KiB asked for (as many pages as 4 KiB ones).
    conn.execute(f"PRAGMA cache_size = {-(CACHE_KIB if readonly else WRITER_CACHE_KIB)}")


def migration_files() -> list[tuple[int, str, str]]:
    """(number, name, sql) for every ``schema/NNNN_*.sql``, in order."""
    out = []
    for entry in resources.files("local_store").joinpath("schema").iterdir():
        name = entry.name
        if name.endswith(".sql") and name[:4].isdigit():
            out.append((int(name[:4]), name, entry.read_text(encoding="utf-8")))
    return sorted(out)


def latest_version(files: list[tuple[int, str, str]] | None = None) -> int:
    """The newest schema version this syncd knows (of ``files``, by default its own)."""
    return max((number for number, _, _ in (migration_files() if files is None else files)),
               default=0)


def fsync(path: Path) -> None:
    """Flush a file's, or a directory's (a rename or link in it), changes to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_only(path: Path) -> sqlite3.Connection:
    """A connection to the database file at ``path`` that cannot write to it (nor create it).
    The path is quoted into the URI: a raw ``#``, ``?`` or ``%`` in it would open (and create)
    another file, without ``mode=ro``."""
    return sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True)


def replica_id_of(path: Path) -> str | None:
    """The ``replica_id`` the store file at ``path`` carries (None: it has none); read-only,
    so the daemon may have it open. ``sqlite3.Error`` for a file that cannot be read."""
    conn = read_only(path)
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'replica_id'").fetchone()
    finally:
        conn.close()
    return None if row is None else str(row[0])


def migrate(conn: sqlite3.Connection) -> list[str]:
    """Apply pending migrations; returns the names applied now."""
    conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations ("
        " number INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL) STRICT"
    )
    done = {row[0] for row in conn.execute("SELECT number FROM schema_migrations")}
    files = migration_files()
    known = latest_version(files)
    if done and max(done) > known:
        raise StoreUnusableError(
            f"its schema is version {max(done)}, newer than this syncd knows ({known}): it was "
            "written by a newer syncd; run that version (or restore a backup made by this one)")
    applied = []
    for number, name, sql in files:
        if number in done:
            continue
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in split_sql(sql):
                conn.execute(statement)
            conn.execute(
                "INSERT INTO schema_migrations VALUES (?, ?, strftime('%Y-%m-%dT%H:%M:%fZ'))",
                (number, name),
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        applied.append(name)
    return applied


def split_sql(script: str) -> list[str]:
    """Split a script into complete statements (``executescript`` would commit on its own)."""
    statements, buffer = [], ""
    for line in script.splitlines(keepends=True):
        if not buffer and line.lstrip().startswith("--"):
            continue
        buffer += line
        if sqlite3.complete_statement(buffer):
            if buffer.strip():
                statements.append(buffer.strip())
            buffer = ""
    if buffer.strip():
        raise ValueError(f"incomplete SQL statement at end of migration: {buffer[:80]!r}")
    return statements


T = TypeVar("T")


def chunks(items: Sequence[T], size: int = IN_LIST) -> Iterator[Sequence[T]]:
    """``items`` in consecutive slices of ``size`` (the last one shorter), in order."""
    for start in range(0, len(items), size):
        yield items[start:start + size]


def marks(chunk: Sized) -> str:
    """The ``?`` placeholders of an ``IN (…)`` list of ``chunk``."""
    return ",".join("?" * len(chunk))

"""Backup and restore of a store's database file, safe while the daemon runs (backup) and
after a crash (restore).

Rules:
  * A backup is SQLite's online backup API from a read connection: one consistent snapshot
    while the writer commits. It is written beside its destination and renamed to it only once
    it passes ``integrity_check``: a failed backup leaves no file that looks like one.
  * A restore holds the data directory's lock (the daemon must be stopped), checks the backup
    (``integrity_check``, a syncd schema no newer than this one) before touching anything, and
    moves the current database aside together with its ``-wal`` and ``-shm`` — never leaves
    them beside the restored file. SQLite would replay a left-over WAL (a crash leaves one)
    onto the restored file: the "restored" store would be the crashed one, or corrupt.
  * The restored file is copied in through SQLite's backup API (so a backup made by copying a
    store's files brings the transactions its own WAL holds; a byte copy of the main file
    dropped them) under a temporary name, fsynced, then renamed into place.
  * A restored store whose outbox holds entries is marked (``sync.restored_outbox``) before it
    is renamed into place: those entries may be versions this install superseded, and pushed,
    after the backup was made — and a hub leaves an install's own versions out of its
    ``changes``. The sync engine applies the plane's full export before pushing any of them.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from local_store import db
from local_store.errors import StoreError
from local_store.replica import RESTORED_OUTBOX, SYNC_PREFIX

SIDE_FILES = ("-wal", "-shm")


class BackupError(StoreError):
    status, code = 500, "backup_failed"


@dataclass(frozen=True, slots=True)
class Restored:
    memories: int
    replaced: Path | None  # where the database it replaced was moved, if there was one
    # The backup is of another install (another replica id than the store it replaced): a hub
    # leaves each of two running installs with one identity out of the other's passes.
    other_install: bool = False
    # Its outbox held entries: sync applies the plane's copy before pushing them.
    resync: bool = False


def backup(data_dir: Path, dest: Path) -> int:
    """Copy the store in ``data_dir`` to ``dest`` (which must not exist); returns its live
    memories. Raises ``BackupError`` naming the problem; ``dest`` is then not created."""
    source = data_dir / db.DB_FILENAME
    if not source.exists():
        raise BackupError(f"no store at {source}")
    if dest.exists():
        raise BackupError(f"{dest} exists; choose a new file")
    if not dest.parent.exists():
        raise BackupError(f"{dest.parent} does not exist")
    if not dest.parent.is_dir():
        raise BackupError(f"{dest.parent} is not a directory")
    partial = dest.with_name(f".{dest.name}.partial")
    try:
        _copy(source, partial)
        memories = check(partial, name=f"the copy for {dest}")
        os.replace(partial, dest)
    except (OSError, sqlite3.Error) as exc:
        raise BackupError(f"backup to {dest} failed: {exc}") from None
    finally:
        for suffix in ("", "-journal", *SIDE_FILES):
            partial.with_name(partial.name + suffix).unlink(missing_ok=True)
    return memories


def restore(data_dir: Path, source: Path, *, wall: float | None = None) -> Restored:
    """Make ``source`` (a backup) the store of ``data_dir``. Raises ``StoreLockedError`` while
    a process has the store open, ``BackupError`` for a backup that is not a usable store or a
    data directory that cannot be created or used; in each case nothing in ``data_dir`` has
    changed."""
    lock = db.DataDirLock(data_dir)
    try:  # a parent that is a file, a file in its place, no permission: nothing to restore into
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock.acquire()
    except OSError as exc:
        raise BackupError(f"cannot use the data directory {data_dir}: "
                          f"{exc.strerror or exc}") from None
    try:
        try:
            memories = check(source)
        except (OSError, sqlite3.Error) as exc:
            raise BackupError(f"{source} is not a usable backup: {exc}") from None
        target = data_dir / db.DB_FILENAME
        incoming = data_dir / f".{db.DB_FILENAME}.restoring"
        ours, theirs = _replica_of(target), _replica_of(source)
        try:
            _copy(source, incoming)  # through SQLite: a WAL beside the backup comes along
            resync = _mark_queued(incoming)
            db.fsync(incoming)
            replaced, linked = _move_aside(target, wall if wall is not None else time.time())
            try:
                os.replace(incoming, target)
            except OSError:
                if replaced is not None:  # the store stays (or is put back) where it was
                    _put_back(replaced, target, linked)
                raise
            db.fsync(data_dir)
        except (OSError, sqlite3.Error) as exc:
            raise BackupError(f"restoring {source} into {data_dir} failed: {exc}") from None
        finally:
            for suffix in ("", "-journal", *SIDE_FILES):
                incoming.with_name(incoming.name + suffix).unlink(missing_ok=True)
        return Restored(memories, replaced, other_install=None not in (ours, theirs) and (
            ours != theirs), resync=resync)
    finally:
        lock.release()


def check(path: Path, *, name: str | None = None) -> int:
    """Live memories in a backup that passes ``integrity_check`` and has a syncd schema this
    version knows; else ``BackupError`` saying why (calling the file ``name``, by default its
    path). Opened read-only: nothing is written."""
    name = name or str(path)
    if not path.is_file():
        raise BackupError(f"{name} is not a file")
    conn = db.read_only(path)
    try:
        verdict = conn.execute("PRAGMA integrity_check").fetchone()[0]
        if verdict != "ok":
            raise BackupError(f"{name} failed its integrity check: {verdict}")
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not {"schema_migrations", "memories"} <= tables:
            raise BackupError(f"{name} is an SQLite file but not a syncd store")
        newest = conn.execute("SELECT max(number) FROM schema_migrations").fetchone()[0] or 0
        known = db.latest_version()
        if newest > known:
            raise BackupError(f"{name} has schema version {newest}, newer than this syncd "
                              f"knows ({known}): restore it with that version")
        return int(conn.execute("SELECT count(*) FROM memories WHERE deleted = 0").fetchone()[0])
    finally:
        conn.close()


def _mark_queued(path: Path) -> bool:
    """Mark the store at ``path`` (a restored copy, not yet in place) for a resync before its
    outbox is pushed, when it has one to push; True if it was marked."""
    conn = sqlite3.connect(path)
    try:
        with conn:
            if conn.execute("SELECT 1 FROM outbox LIMIT 1").fetchone() is None:
                return False
            conn.execute("INSERT INTO meta (key, value) VALUES (?, '1') ON CONFLICT (key) "
                         "DO UPDATE SET value = excluded.value", (SYNC_PREFIX + RESTORED_OUTBOX,))
        return True
    finally:
        conn.close()


def _replica_of(path: Path) -> str | None:
    """The ``replica_id`` a store file carries, or None when it has none or cannot be read."""
    if not path.is_file():
        return None
    try:
        return db.replica_id_of(path)
    except sqlite3.Error:
        return None


def _copy(source: Path, dest: Path) -> None:
    """``source`` into a new file ``dest``: 0600 (it holds memories), one consistent snapshot
    through SQLite's backup API, and in rollback-journal mode, so reading it (the check) leaves
    no ``-wal``/``-shm`` beside it; a store opened on it goes back to WAL by itself. ``dest``
    is a temporary name of ours: one a crash left behind is replaced."""
    for suffix in ("", "-journal", *SIDE_FILES):
        dest.with_name(dest.name + suffix).unlink(missing_ok=True)
    os.close(os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    reader = db.read_only(source)
    try:
        reader.execute(f"PRAGMA busy_timeout = {db.BUSY_TIMEOUT_MS}")
        writer = sqlite3.connect(dest)
        try:
            reader.backup(writer, pages=1024)
            writer.execute("PRAGMA journal_mode = DELETE")
        finally:
            writer.close()
    finally:
        reader.close()


def _move_aside(target: Path, wall: float) -> tuple[Path | None, bool]:
    """Keep the database as ``memory.db.replaced-<UTC time>``: (that path, whether it is a
    hard link to ``memory.db``, which the caller's rename then replaces); None when there
    was none.

    A hard link leaves ``memory.db`` in place until the restored copy takes its name in one
    rename: a crash in between leaves the old store where the daemon looks (both names then
    stay one file), where two renames left none, and the daemon started on a new empty store.
    Where the file system has no hard links, the database is renamed (the old way).

    Its WAL is checkpointed into it first (closing the last connection then removes the WAL
    and ``-shm``), so a crash can never leave a WAL beside a database it does not belong to. A
    database too damaged to checkpoint is renamed with its side files, never linked: its WAL
    holds commits, and must stay beside the one file it belongs to."""
    if not target.exists():
        for suffix in SIDE_FILES:  # a WAL without its database belongs to nothing
            target.with_name(target.name + suffix).unlink(missing_ok=True)
        return None, False
    with contextlib.suppress(sqlite3.Error):
        conn = sqlite3.connect(target)
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.close()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(wall))
    aside = target.with_name(f"{target.name}.replaced-{stamp}")
    for n in range(2, 1000):  # a second restore within the same second keeps the first's
        if not aside.exists():
            break
        aside = target.with_name(f"{target.name}.replaced-{stamp}-{n}")
    if not any(target.with_name(target.name + suffix).exists() for suffix in SIDE_FILES):
        try:
            os.link(target, aside)
            return aside, True
        except OSError:  # no hard links here (some network and FUSE file systems)
            pass
    for suffix in SIDE_FILES:
        side = target.with_name(target.name + suffix)
        with contextlib.suppress(FileNotFoundError):
            os.replace(side, aside.with_name(aside.name + suffix))
    os.replace(target, aside)
    return aside, False


def _put_back(aside: Path, target: Path, linked: bool) -> None:
    """Undo ``_move_aside`` after the restored copy could not take ``target``'s name."""
    if linked:  # ``target`` never left
        aside.unlink()
        return
    os.replace(aside, target)
    for suffix in SIDE_FILES:
        with contextlib.suppress(FileNotFoundError):
            os.replace(aside.with_name(aside.name + suffix), target.with_name(target.name + suffix))



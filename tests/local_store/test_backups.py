"""Backup and restore (``local_store/backups.py``): a restore after a crash restores the backup,
not the crashed store; a refused restore changes nothing; the replaced store is kept whole."""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from local_store import HashingEmbedder, Store, StoreLockedError, backups, db
from local_store.backups import BackupError, backup, restore
from tests.store_probe import dump_tables

REPO_ROOT = Path(__file__).resolve().parents[2]


async def contents(data_dir: Path) -> list[str]:
    store = await Store.open(data_dir, embedder=HashingEmbedder())
    try:
        return sorted(r["content_preview"] for r in (await store.memories.list_memories())["rows"])
    finally:
        await store.close()


def crash_after_saving(data_dir: Path, texts: list[str]) -> None:
    """A real process saves ``texts`` and dies without closing the store (as kill -9 would
    leave it): its last transactions are only in the WAL."""
    code = textwrap.dedent(f"""
        import asyncio, os
        from local_store import HashingEmbedder, Store
        async def main():
            store = await Store.open({str(data_dir)!r}, embedder=HashingEmbedder())
            for text in {texts!r}:
                await store.memories.save({{"content": text}})
            os._exit(0)
        asyncio.run(main())
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)


def files(data_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(data_dir.iterdir()) if p.name != "syncd.lock"}


async def test_a_restore_after_a_crash_is_the_backup_not_the_crash(tmp_path: Path) -> None:
    data, copy = tmp_path / "data", tmp_path / "backup.db"
    store = await Store.open(data, embedder=HashingEmbedder())
    await store.memories.save({"content": "kept in the backup"})
    await store.close()
    assert await asyncio.to_thread(backup, data, copy) == 1
    await asyncio.to_thread(crash_after_saving, data, ["written after the backup",
                                                       "and this too"])
    wal = await asyncio.to_thread((data / "memory.db-wal").stat)
    assert wal.st_size > 0  # the crash left a WAL behind

    # What "put the copy in place as memory.db" did: SQLite replays the crashed WAL onto it.
    control = tmp_path / "control"
    await asyncio.to_thread(shutil.copytree, data, control)
    await asyncio.to_thread(shutil.copyfile, copy, control / "memory.db")
    assert "written after the backup" in await contents(control)

    done = await asyncio.to_thread(restore, data, copy, wall=1_800_000_000)
    assert done.memories == 1 and done.replaced == data / "memory.db.replaced-20270115T080000Z"
    assert set(await asyncio.to_thread(files, data)) == {
        "memory.db", "memory.db.replaced-20270115T080000Z"}  # no WAL, no -shm left
    assert await contents(data) == ["kept in the backup"]

    replaced = tmp_path / "replaced"  # the store it replaced, with its WAL folded in
    await asyncio.to_thread(replaced.mkdir)
    await asyncio.to_thread(shutil.copyfile, done.replaced, replaced / "memory.db")
    assert await contents(replaced) == ["and this too", "kept in the backup",
                                        "written after the backup"]


async def test_a_backup_of_another_install_is_flagged(tmp_path: Path) -> None:
    """Its identity (replica id) comes with it: restored beside the install it came from, a hub
    would leave each one's writes out of the other's passes."""
    mine, theirs, copy = tmp_path / "mine", tmp_path / "theirs", tmp_path / "theirs.db"
    for data in (mine, theirs):
        store = await Store.open(data, embedder=HashingEmbedder())
        await store.memories.save({"content": f"in {data.name}"})
        await store.close()
    await asyncio.to_thread(backup, theirs, copy)
    done = await asyncio.to_thread(restore, mine, copy)
    assert done.other_install and done.memories == 1
    own = tmp_path / "own.db"
    await asyncio.to_thread(backup, mine, own)  # now "theirs" identity: restoring it again
    assert not (await asyncio.to_thread(restore, mine, own)).other_install
    assert not (await asyncio.to_thread(restore, tmp_path / "fresh", own)).other_install


async def test_two_restores_in_one_second_keep_both_replaced_stores(tmp_path: Path) -> None:
    data, copy = tmp_path / "data", tmp_path / "backup.db"
    store = await Store.open(data, embedder=HashingEmbedder())
    await store.memories.save({"content": "a"})
    await store.close()
    await asyncio.to_thread(backup, data, copy)
    first = (await asyncio.to_thread(restore, data, copy, wall=1_800_000_000)).replaced
    second = (await asyncio.to_thread(restore, data, copy, wall=1_800_000_000)).replaced
    assert first is not None and second is not None and first != second
    assert {first.name, second.name} <= set(await asyncio.to_thread(files, data))


async def test_a_restore_while_the_store_is_open_changes_nothing(tmp_path: Path) -> None:
    data, copy = tmp_path / "data", tmp_path / "backup.db"
    store = await Store.open(data, embedder=HashingEmbedder())
    try:
        await store.memories.save({"content": "a"})
        await asyncio.to_thread(backup, data, copy)
        await store.memories.save({"content": "b"})
        # The open store's own checkpointer and readers touch -wal/-shm: compare what a restore
        # would change — the files there (none renamed or added) and the store's contents.
        names, contents = set(await asyncio.to_thread(files, data)), await dump_tables(store)
        with pytest.raises(StoreLockedError, match="in use by another syncd process"):
            await asyncio.to_thread(restore, data, copy)
        assert set(await asyncio.to_thread(files, data)) == names
        assert await dump_tables(store) == contents
        assert len((await store.memories.list_memories())["rows"]) == 2
    finally:
        await store.close()


def _not_sqlite(path: Path) -> None:
    path.write_bytes(b"not a database\n" * 100)


def _not_syncd(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x)")


def _newer(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO schema_migrations VALUES (9999, '9999_future.sql', 'x')")


def _corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[4096:8192] = b"\xff" * 4096
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(("spoil", "message"), [
    (_not_sqlite, "is not a usable backup: file is not a database"),
    (_not_syncd, "is an SQLite file but not a syncd store"),
    (_newer, "has schema version 9999, newer than this syncd knows"),
    (_corrupt, "is not a usable backup: database disk image is malformed"),
])
async def test_an_unusable_backup_is_refused_and_changes_nothing(
        tmp_path: Path, spoil: Callable[[Path], None], message: str) -> None:
    data, copy = tmp_path / "data", tmp_path / "backup.db"
    store = await Store.open(data, embedder=HashingEmbedder())
    await store.memories.save({"content": "a"})
    await store.close()
    if spoil is not _not_sqlite and spoil is not _not_syncd:
        await asyncio.to_thread(backup, data, copy)
    await asyncio.to_thread(spoil, copy)
    before = await asyncio.to_thread(files, data)
    with pytest.raises(BackupError, match=message):
        await asyncio.to_thread(restore, data, copy)
    assert await asyncio.to_thread(files, data) == before


@pytest.mark.parametrize("where", ["under a file", "a file"])
def test_a_restore_into_a_data_dir_that_cannot_be_made_is_refused(tmp_path: Path,
                                                                  where: str) -> None:
    """An OSError from making the directory escaped as a traceback from ``syncd restore``."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    data = blocker / "data" if where == "under a file" else blocker
    with pytest.raises(BackupError, match=f"^cannot use the data directory {data}: "):
        restore(data, tmp_path / "never-read.db")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]
    assert blocker.read_text() == "not a directory\n"


def test_a_backup_of_nothing_or_onto_something_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BackupError, match="no store at"):
        backup(tmp_path / "empty", tmp_path / "x.db")
    assert not (tmp_path / "x.db").exists()


async def test_a_backup_into_a_missing_or_non_directory_says_which(tmp_path: Path) -> None:
    async with await Store.open(tmp_path / "data", embedder=HashingEmbedder()) as store:
        await store.memories.save({"content": "kept"})
    with pytest.raises(BackupError, match=r"/nowhere does not exist"):
        await asyncio.to_thread(backup, tmp_path / "data", tmp_path / "nowhere" / "b.db")
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(BackupError, match=r"/a-file is not a directory"):
        await asyncio.to_thread(backup, tmp_path / "data", tmp_path / "a-file" / "b.db")


async def test_a_backup_copied_with_its_wal_restores_what_the_wal_holds(tmp_path: Path) -> None:
    """A "backup" made by copying a store's files (``cp memory.db memory.db-wal …``, a
    file-level backup tool) holds its last transactions in the WAL beside it. A restore reads
    it through SQLite, so they come along; a byte copy of the main file alone dropped them
    while its check (which reads the WAL) counted them."""
    source, copied, data = tmp_path / "source", tmp_path / "copied", tmp_path / "data"
    store = await Store.open(source, embedder=HashingEmbedder())
    await store.memories.save({"content": "checkpointed long ago"})
    await store.close()
    await asyncio.to_thread(crash_after_saving, source, ["only in the wal", "this one too"])
    copied.mkdir()
    for name in ("memory.db", "memory.db-wal"):
        shutil.copyfile(source / name, copied / name)
    restored = await asyncio.to_thread(restore, data, copied / "memory.db")
    assert restored.memories == 3
    assert await contents(data) == ["checkpointed long ago", "only in the wal", "this one too"]


@pytest.mark.parametrize("name", ["backups #1", "what?", "100%25 sure", "plain"])
async def test_backup_and_restore_paths_may_hold_uri_characters(tmp_path: Path,
                                                                name: str) -> None:
    """``#``, ``?`` and ``%`` are path characters, not URI syntax: unquoted in SQLite's URI,
    ``#`` cut the path (opening, and creating, another file without ``mode=ro``)."""
    data, elsewhere = tmp_path / f"data {name}", tmp_path / name
    store = await Store.open(data, embedder=HashingEmbedder())
    await store.memories.save({"content": "remember the milk"})
    await store.close()
    await asyncio.to_thread(elsewhere.mkdir)
    copy = elsewhere / f"b {name}.db"
    assert await asyncio.to_thread(backup, data, copy) == 1
    restored = await asyncio.to_thread(restore, tmp_path / f"again {name}", copy)
    assert restored.memories == 1
    assert await contents(tmp_path / f"again {name}") == ["remember the milk"]
    expected = {f"data {name}", name, f"again {name}"}
    names = await asyncio.to_thread(lambda: {p.name for p in tmp_path.iterdir()})
    assert names == expected  # no stray file beside them


async def test_a_backup_is_one_private_file(tmp_path: Path) -> None:
    """The copy is 0600 (it holds memories) and alone: reading it for the check leaves no
    ``-wal``/``-shm``; a partial copy a crash left behind does not stop the next backup."""
    data = tmp_path / "data"
    store = await Store.open(data, embedder=HashingEmbedder())
    await store.memories.save({"content": "remember the milk"})
    await store.close()
    out = tmp_path / "out"

    def leave_a_partial() -> None:
        out.mkdir()
        (out / ".b.db.partial").write_bytes(b"left by a crash")

    await asyncio.to_thread(leave_a_partial)
    assert await asyncio.to_thread(backup, data, out / "b.db") == 1
    assert await asyncio.to_thread(lambda: sorted(p.name for p in out.iterdir())) == ["b.db"]
    assert (await asyncio.to_thread((out / "b.db").stat)).st_mode & 0o777 == 0o600


def test_a_crash_as_the_restored_copy_takes_its_place_leaves_a_store_in_place(
        tmp_path: Path) -> None:
    """kill -9 of a real restore just before its last rename (an audit hook sends the signal
    on the rename of the restored copy to ``memory.db``): ``memory.db`` must still be there,
    and be the old store. Two renames — the old store aside, then the copy in — left no
    ``memory.db`` in between, and a daemon started after the crash made a new, empty one."""
    data, copy = tmp_path / "data", tmp_path / "backup.db"
    crash_after_saving(data, ["in the backup"])
    assert backup(data, copy) == 1
    crash_after_saving(data, ["written after the backup"])
    code = textwrap.dedent(f"""
        import os, signal, sys
        from pathlib import Path
        from local_store.backups import restore
        def hook(event, args):
            if (event == "os.rename" and str(args[0]).endswith(".restoring")
                    and str(args[1]).endswith("memory.db")):
                os.kill(os.getpid(), signal.SIGKILL)
        sys.addaudithook(hook)
        restore(Path({str(data)!r}), Path({str(copy)!r}))
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-c", code], env=env, timeout=60, check=False)
    assert done.returncode == -9  # it died at the rename, as meant
    assert (data / "memory.db").is_file()
    assert asyncio.run(contents(data)) == ["in the backup", "written after the backup"]


# A store too damaged to checkpoint keeps its WAL beside it (review of the hard-link restore).

def _store_with_wal_only_row(data_dir: Path) -> None:
    """memory.db whose last commit lives only in memory.db-wal (as after a crash)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    live = data_dir.parent / "live"
    live.mkdir()
    conn = sqlite3.connect(live / db.DB_FILENAME)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute("CREATE TABLE t (x TEXT)")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("INSERT INTO t VALUES ('committed, in the WAL only')")
    conn.commit()
    shutil.copy(live / db.DB_FILENAME, data_dir / db.DB_FILENAME)
    shutil.copy(live / (db.DB_FILENAME + "-wal"), data_dir / (db.DB_FILENAME + "-wal"))
    conn.close()


async def _backup_file(tmp_path: Path) -> Path:
    s = await Store.open(tmp_path / "src", embedder=HashingEmbedder())
    await s.memories.save({"content": "from the backup"})
    await s.close()
    dest = tmp_path / "backup.db"
    await asyncio.to_thread(backups.backup, tmp_path / "src", dest)
    return dest


def _t_rows(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [r[0] for r in conn.execute("SELECT x FROM t")]
    finally:
        conn.close()


def _checkpoint_fails(monkeypatch: pytest.MonkeyPatch, target: Path) -> None:
    """The store is "too damaged to checkpoint" (the case _move_aside names)."""
    real = sqlite3.connect

    def connect(path: object, *args: object, **kwargs: object) -> sqlite3.Connection:
        if Path(str(path)) == target:
            raise sqlite3.DatabaseError("database disk image is malformed")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(backups.sqlite3, "connect", connect)


class _Crash(BaseException):
    pass


def _restore_failing_at_the_last_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        failure: BaseException) -> Path:
    """Restore a backup over a store whose last commit is only in its WAL and which cannot be
    checkpointed, raising ``failure`` where the restored copy would take ``memory.db``'s name;
    returns the data dir, the fault hooks removed."""
    source = asyncio.run(_backup_file(tmp_path))
    data_dir = tmp_path / "data"
    _store_with_wal_only_row(data_dir)
    target = data_dir / db.DB_FILENAME
    _checkpoint_fails(monkeypatch, target)
    real_replace = os.replace

    def replace(src: object, dst: object) -> None:
        if Path(str(dst)) == target and Path(str(src)).name.endswith(".restoring"):
            raise failure
        real_replace(src, dst)

    monkeypatch.setattr(backups.os, "replace", replace)
    try:
        backups.restore(data_dir, source)
    finally:
        monkeypatch.undo()
    return data_dir


def test_restore_crash_after_link_keeps_memory_db_with_its_wal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """_move_aside moved -wal/-shm to the aside name *before* hard-linking: a crash between the
    link and the rename left memory.db (the old store, where the daemon looks) without the
    WAL holding its last commits, and that WAL beside the hard link (the same inode), where it
    is stale as soon as the daemon writes memory.db again."""
    with pytest.raises(_Crash):  # power lost between the link and the rename
        _restore_failing_at_the_last_rename(tmp_path, monkeypatch, _Crash())
    data_dir = tmp_path / "data"
    target = data_dir / db.DB_FILENAME
    # A memory.db the daemon will open must not have lost its WAL's commits, and the old
    # store must still be readable, whole, under some name.
    if target.exists():
        assert _t_rows(target) == ["committed, in the WAL only"]
    (aside,) = [p for p in data_dir.iterdir() if p.name.startswith("memory.db.replaced-")
                and not p.name.endswith(("-wal", "-shm"))]
    assert _t_rows(aside) == ["committed, in the WAL only"]


def test_failed_restore_keeps_memory_db_with_its_wal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """"In each case nothing in data_dir has changed" (restore's docstring): when the final
    rename failed, the hard-link path unlinked the aside name but left the old store's WAL
    moved to ``memory.db.replaced-…-wal``, beside no database; memory.db lost those commits."""
    with pytest.raises(backups.BackupError):
        _restore_failing_at_the_last_rename(
            tmp_path, monkeypatch, OSError(16, "Device or resource busy"))
    data_dir = tmp_path / "data"
    assert _t_rows(data_dir / db.DB_FILENAME) == ["committed, in the WAL only"]
    assert sorted(p.name for p in data_dir.iterdir() if "replaced" in p.name) == []

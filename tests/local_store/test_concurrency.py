"""RELIABILITY S2 at the store level: many concurrent API writers through one ``Store``, an
outside CLI-style reader process and an online backup, with zero "database is locked".

``SYNCD_CONCURRENT_WRITERS`` sets the writer count (default 50; ``make soak`` raises it).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import selectors
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from local_store import HashingEmbedder, Store
from tests.store_probe import integrity_check

WRITERS = int(os.environ.get("SYNCD_CONCURRENT_WRITERS", "50"))
SAVES_PER_WRITER = 20
LOCKED = "database is locked"
READY_TIMEOUT_S = 60.0

# The "CLI reader": a separate process on a read-only stdlib connection. Each loop reads the row
# count and the FTS hit count in one snapshot; every memory written here contains "concurrent",
# so the two must agree (the index moves with the rows), and the count never goes down. It does
# one last loop after the stop file appears and prints what it saw; any error → stderr, exit 1.
READER_SCRIPT = r"""
import os, sqlite3, sys
db, stop = sys.argv[1], sys.argv[2]
loops, last, stopping = 0, 0, False
try:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, isolation_level=None)
    conn.execute("PRAGMA busy_timeout = 10000")
    while True:
        stopping = os.path.exists(stop)
        conn.execute("BEGIN")
        (total,) = conn.execute("SELECT count(*) FROM memories").fetchone()
        (hits,) = conn.execute(
            "SELECT count(*) FROM memories_fts WHERE memories_fts MATCH 'concurrent'").fetchone()
        conn.execute("COMMIT")
        if hits != total:
            raise AssertionError(f"FTS sees {hits} rows, the table {total}")
        if total < last:
            raise AssertionError(f"row count went back from {last} to {total}")
        last = total
        loops += 1
        if loops == 1:
            print("ready", flush=True)
        if stopping:
            break
    conn.close()
except BaseException as exc:
    print(f"reader error after {loops} loops: {type(exc).__name__}: {exc}",
          file=sys.stderr, flush=True)
    sys.exit(1)
print(f"loops={loops} final={last}", flush=True)
"""


def start_reader(db_path: Path, stop_file: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", READER_SCRIPT, str(db_path), str(stop_file)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_reader_ready(proc: subprocess.Popen[bytes]) -> None:
    """Block until the reader has done one loop, with a deadline (unbuffered: no lost bytes)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + READY_TIMEOUT_S
    seen = b""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while not seen.endswith(b"ready\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(timeout=left):
                pytest.fail(f"reader not ready after {READY_TIMEOUT_S}s: {seen!r}")
            chunk = os.read(proc.stdout.fileno(), 1)
            if not chunk:
                _, err = proc.communicate(timeout=READY_TIMEOUT_S)
                pytest.fail(f"reader exited {proc.returncode} before ready: {err!r}")
            seen += chunk


def finish_reader(proc: subprocess.Popen[bytes], stop_file: Path) -> tuple[int, str, str]:
    stop_file.touch()
    try:
        out, err = proc.communicate(timeout=READY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def online_backup(src_path: Path, dest_path: Path) -> None:
    """The backup API on its own connections, as ``syncd backup`` / an outside tool would."""
    src = sqlite3.connect(src_path)
    try:
        dest = sqlite3.connect(dest_path)
        try:
            src.backup(dest)
        finally:
            dest.close()
    finally:
        src.close()


def sqlite_integrity(path: Path) -> str:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return "; ".join(str(r[0]) for r in conn.execute("PRAGMA integrity_check"))
    finally:
        conn.close()


async def test_concurrent_writers_reader_and_backup_never_see_locked(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    run = secrets.token_hex(4)
    total = WRITERS * SAVES_PER_WRITER
    backup_path = tmp_path / "backup.db"
    stop_file = tmp_path / "reader.stop"
    store = await Store.open(tmp_path / "data", embedder=HashingEmbedder())
    reader = start_reader(store.db_path, stop_file)
    try:
        wait_reader_ready(reader)

        acked = 0
        halfway = asyncio.Event()
        backup_window: list[int] = []

        async def writer(w: int) -> list[str]:
            nonlocal acked
            ids = []
            for i in range(SAVES_PER_WRITER):
                res = await store.memories.save({
                    "content": f"concurrent writer {w} save {i} run {run}",
                    "realm": "concurrency", "tags": [f"writer-{w}"]})
                ids.append(res["id"])
                acked += 1
                if acked >= total // 2:
                    halfway.set()
            return ids

        async def backup() -> None:
            await halfway.wait()
            backup_window.append(acked)
            await asyncio.to_thread(online_backup, store.db_path, backup_path)
            backup_window.append(acked)

        started = time.monotonic()
        results = await asyncio.gather(*(writer(w) for w in range(WRITERS)), backup(),
                                       return_exceptions=True)
        elapsed = time.monotonic() - started
    finally:
        code, out, err = finish_reader(reader, stop_file)
        final = (await store.maintenance.stats())["memories"]
        await store.close()

    failures = [r for r in results if isinstance(r, BaseException)]
    assert failures == [], failures
    assert not any(LOCKED in str(f) for f in failures)
    assert LOCKED not in err
    assert LOCKED not in caplog.text
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert code == 0, f"reader exited {code}: {err}"
    assert out.strip().endswith(f"final={total}"), out

    ids = [i for r in results[:WRITERS] if isinstance(r, list) for i in r]
    assert len(ids) == len(set(ids)) == total
    assert final == total

    # The backup taken mid-way is a consistent store: integrity ok, it opens as a Store in
    # another dir, and it holds at least every write acked before it started.
    assert sqlite_integrity(backup_path) == "ok"
    restored_dir = tmp_path / "restored"
    restored_dir.mkdir()
    shutil.copyfile(backup_path, restored_dir / "memory.db")
    restored = await Store.open(restored_dir, embedder=HashingEmbedder())
    try:
        assert await integrity_check(restored) == "ok"
        count = (await restored.maintenance.stats())["memories"]
    finally:
        await restored.close()
    assert 0 <= count <= final
    assert count >= backup_window[0], (count, backup_window)
    print(f"{WRITERS} writers x {SAVES_PER_WRITER} saves: {elapsed:.2f}s; "
          f"backup holds {count} (acked {backup_window[0]}..{backup_window[1]} during it); "
          f"reader {out.strip()}")


async def test_concurrent_batches_and_updates_take_unique_commit_ordered_seqs(
        tmp_path: Path) -> None:
    batches, batch_size, updates = 20, 10, 20
    run = secrets.token_hex(4)
    store = await Store.open(tmp_path / "data", embedder=HashingEmbedder())
    try:
        base = [(await store.memories.save({"content": f"base {i} run {run}", "realm": "seq"}))["id"]
                for i in range(updates)]

        def batch(b: int) -> list[dict[str, object]]:
            return [{"content": f"concurrent batch {b} item {i} run {run}", "realm": "seq",
                     "tags": [f"b{b}"]} for i in range(batch_size)]

        calls = []
        for k in range(max(batches, updates)):
            if k < batches:
                calls.append(store.memories.save_many(batch(k)))
            if k < updates:
                calls.append(store.memories.update_importance(base[k], (k + 1) / 32))
        results = await asyncio.gather(*calls, return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        assert failures == [], failures

        batch_ids = [r["ids"] for r in results if "ids" in r]
        assert len(batch_ids) == batches
        for r in results:
            if "ids" in r:
                assert r["saved"] is True and r["count"] == batch_size and "errors" not in r
            else:
                assert r["ok"] is True
        for k, mid in enumerate(base):
            assert (await store.memories.get(mid))["importance"] == (k + 1) / 32

        writes = updates + batches * batch_size + updates  # each write takes one local_seq
        nodes, edges, cursor = (await store.feed.page(0, limit=10_000))[:3]
        assert edges == []
        assert len(nodes) == updates + batches * batch_size
        assert len({n.id for n in nodes}) == len(nodes)
        assert cursor == writes

        # Walk the change feed one row at a time: the cursor is each row's local_seq.
        seq_of: dict[str, int] = {}
        since = 0
        while True:
            page, page_edges, nxt = (await store.feed.page(since, limit=1))[:3]
            if not page and not page_edges:
                break
            assert len(page) == 1 and page_edges == [] and nxt > since
            assert page[0].id not in seq_of
            seq_of[page[0].id or ""] = nxt
            since = nxt
        seqs = list(seq_of.values())
        assert len(seqs) == len(set(seqs)) == len(nodes)
        assert max(seqs) == writes and min(seqs) >= 1
        # Updated memories carry the seq of their update, after every base save.
        assert all(seq_of[f"memory:{mid}"] > updates for mid in base)
        # One save_many = one transaction on the one writer: its rows take consecutive seqs.
        for ids in batch_ids:
            members = sorted(seq_of[f"memory:{mid}"] for mid in ids)
            assert members == list(range(members[0], members[0] + batch_size)), members
    finally:
        await store.close()

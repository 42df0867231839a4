"""RELIABILITY S1: kill -9 under continuous writes, then restart and check.

Each iteration runs ``crash_writer.py`` in a real subprocess against one data dir, lets it ack a
random 1–30 writes, SIGKILLs it, then reopens the store here and asserts:

  * ``PRAGMA integrity_check`` = ok;
  * every write ever acked (all iterations so far) is present;
  * no partial multi-row write is visible: every ``save_many`` batch is all 5 rows or none,
    in the raw table, through ``list_memories`` and in the FTS index.

``SYNCD_CRASH_ITERATIONS`` sets the count (default 20; ``make soak`` raises it).
"""

from __future__ import annotations

import os
import random
import secrets
import selectors
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from local_store import HashingEmbedder, NotFoundError, Store, StoreLockedError
from tests.store_probe import integrity_check

ITERATIONS = int(os.environ.get("SYNCD_CRASH_ITERATIONS", "20"))
REPO_ROOT = Path(__file__).resolve().parents[2]
WRITER = Path(__file__).with_name("crash_writer.py")
BATCH_SIZE = 5
READY_TIMEOUT_S = 60.0
ACK_TIMEOUT_S = 60.0
POLL_S = 0.002


# ---------------------------------------------------------------------- writer subprocess

def start_writer(data_dir: Path, ack_file: Path, stderr_file: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    with stderr_file.open("ab") as err:
        return subprocess.Popen(
            [sys.executable, str(WRITER), str(data_dir), str(ack_file)],
            cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=err)


def wait_ready(proc: subprocess.Popen[bytes], stderr_file: Path) -> None:
    """Block until the writer prints ``ready`` (the store is open), with a deadline."""
    assert proc.stdout is not None
    deadline = time.monotonic() + READY_TIMEOUT_S
    seen = b""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while b"ready\n" not in seen:
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"writer not ready after {READY_TIMEOUT_S}s; stdout={seen!r} "
                            f"stderr={stderr_file.read_text(errors='replace')}")
            if sel.select(timeout=left):
                chunk = os.read(proc.stdout.fileno(), 4096)
                if not chunk:
                    proc.wait()
                    pytest.fail(f"writer exited ({proc.returncode}) before ready; "
                                f"stderr={stderr_file.read_text(errors='replace')}")
                seen += chunk


def complete_lines(ack_file: Path) -> list[str]:
    """The fully written lines (a SIGKILL may leave a partial last line: not an ack)."""
    try:
        text = ack_file.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return text.split("\n")[:-1]


def wait_for_acks(proc: subprocess.Popen[bytes], ack_file: Path, target: int,
                  stderr_file: Path) -> None:
    """Poll (with a deadline) until the writer has acked at least ``target`` writes."""
    deadline = time.monotonic() + ACK_TIMEOUT_S
    while len(complete_lines(ack_file)) < target:
        if proc.poll() is not None:
            pytest.fail(f"writer died ({proc.returncode}) after "
                        f"{len(complete_lines(ack_file))} acks; "
                        f"stderr={stderr_file.read_text(errors='replace')}")
        if time.monotonic() > deadline:
            pytest.fail(f"writer acked {len(complete_lines(ack_file))} < {target} writes "
                        f"in {ACK_TIMEOUT_S}s")
        time.sleep(POLL_S)


def kill9(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait()


# ---------------------------------------------------------------------- acks

@dataclass
class Acks:
    ids: list[str] = field(default_factory=list)
    batches: dict[str, list[str]] = field(default_factory=dict)

    def read(self, ack_file: Path) -> int:
        lines = complete_lines(ack_file)
        for line in lines:
            kind, *rest = line.split(" ")
            if kind == "single":
                assert len(rest) == 1, line
                self.ids.append(rest[0])
            else:
                assert kind == "batch" and len(rest) == 1 + BATCH_SIZE, line
                name, *members = rest
                self.batches[name] = members
                self.ids.extend(members)
        return len(lines)


@dataclass
class RawView:
    """What the file holds, read with the stdlib module (read-only, the store closed)."""

    ids: set[str]
    per_batch: Counter[str]
    singles: int
    fts_items: int
    fts_singles: int


def raw_view(db_path: Path) -> RawView:
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        view = RawView(set(), Counter(), 0, 0, 0)
        for node_id, tags, deleted in conn.execute("SELECT id, tags, deleted FROM memories"):
            assert deleted == 0
            view.ids.add(node_id)
            for tag in tags.split(","):
                if tag.startswith("batch-"):
                    view.per_batch[tag.removeprefix("batch-")] += 1
                elif tag == "single":
                    view.singles += 1
        (view.fts_items,) = conn.execute(
            "SELECT count(*) FROM memories_fts WHERE memories_fts MATCH 'item'").fetchone()
        (view.fts_singles,) = conn.execute(
            "SELECT count(*) FROM memories_fts WHERE memories_fts MATCH 'single'").fetchone()
    finally:
        conn.close()
    return view


# ---------------------------------------------------------------------- tests

async def test_kill9_loop_keeps_every_acked_write_whole(tmp_path: Path) -> None:
    seed = int(os.environ.get("SYNCD_CRASH_SEED", secrets.randbits(32)))
    rng = random.Random(seed)
    data_dir = tmp_path / "data"
    stderr_file = tmp_path / "writer.stderr"
    acks = Acks()
    listed_batches: set[str] = set()
    started = time.monotonic()
    for iteration in range(ITERATIONS):
        where = f"seed={seed} iteration={iteration}"
        ack_file = tmp_path / f"acks-{iteration:04d}.txt"
        target = rng.randint(1, 30)
        with start_writer(data_dir, ack_file, stderr_file) as proc:
            try:
                wait_ready(proc, stderr_file)
                wait_for_acks(proc, ack_file, target, stderr_file)
            finally:
                kill9(proc)
        assert proc.returncode == -signal.SIGKILL, where
        first_new = len(acks.ids)
        assert acks.read(ack_file) >= target, where
        last = iteration == ITERATIONS - 1

        # Through the store's API. Every iteration checks this run's acks with get(); the last
        # iteration re-checks every ack of every run (the raw check below covers the rest in
        # between, so the loop stays linear for `make soak`).
        store = await Store.open(data_dir, embedder=HashingEmbedder())
        try:
            assert await integrity_check(store) == "ok", where
            missing = []
            for node_id in acks.ids if last else acks.ids[first_new:]:
                try:
                    got = await store.memories.get(node_id)
                except NotFoundError:
                    missing.append(node_id)
                else:
                    assert got["id"] == node_id, where
            assert missing == [], f"{where}: acked writes lost after kill -9"
        finally:
            await store.close()

        # The file itself: every ack of every run so far, and no partial batch anywhere.
        raw = raw_view(data_dir / "memory.db")
        lost = [node_id for node_id in acks.ids if node_id not in raw.ids]
        assert lost == [], f"{where}: acked writes lost after kill -9"
        partial = {name: n for name, n in raw.per_batch.items() if n != BATCH_SIZE}
        assert partial == {}, f"{where}: partial save_many visible after kill -9"
        assert set(acks.batches) <= set(raw.per_batch), where
        assert raw.fts_items == BATCH_SIZE * len(raw.per_batch), f"{where}: FTS out of step"
        assert raw.fts_singles == raw.singles, f"{where}: FTS out of step"

        # Each batch through list_memories: all 5 members (= the acked ids when acked).
        store = await Store.open(data_dir, embedder=HashingEmbedder())
        try:
            for name in raw.per_batch if last else set(raw.per_batch) - listed_batches:
                listed = await store.memories.list_memories(
                    {"realm": "crash", "tags": [f"batch-{name}"], "limit": 500})
                ids = sorted(row["id"] for row in listed["rows"])
                assert len(ids) == BATCH_SIZE, f"{where}: batch {name} has {ids}"
                if name in acks.batches:
                    assert ids == sorted(acks.batches[name]), f"{where}: batch {name}"
                listed_batches.add(name)
        finally:
            await store.close()
    elapsed = time.monotonic() - started
    print(f"kill -9 loop: {ITERATIONS} iterations, {len(acks.ids)} acked ids, "
          f"{len(acks.batches)} acked batches, {elapsed:.1f}s (seed {seed})")


async def test_second_process_cannot_open_a_data_dir_in_use(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    stderr_file = tmp_path / "writer.stderr"
    with start_writer(data_dir, tmp_path / "acks.txt", stderr_file) as proc:
        try:
            wait_ready(proc, stderr_file)
            try:
                intruder = await Store.open(data_dir, embedder=HashingEmbedder())
            except StoreLockedError as refused:
                assert f"pid {proc.pid}" in str(refused)
            else:
                await intruder.close()
                pytest.fail("a second process opened a data dir that a live writer holds")
            assert proc.poll() is None  # the refused opener did not disturb the holder
        finally:
            kill9(proc)
    # The flock dies with its holder: the dir opens again, and is intact.
    store = await Store.open(data_dir, embedder=HashingEmbedder())
    try:
        assert await integrity_check(store) == "ok"
    finally:
        await store.close()

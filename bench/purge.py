"""What a hard delete costs now that it scrubs the WAL (issue 32, point 3), and how long its text
stays on disk.

One store (``Store``, hashing embedder) of N memories; then, alternated, D soft deletes (the
baseline: a tombstone that keeps the text, no scrub) and D hard deletes (FTS merge and a
``wal_checkpoint(TRUNCATE)`` before the call returns), and D hard deletes without the scrub (as
before issue 32: the FTS merge only). Each scrubbed hard delete's memory holds a unique
marker; right after the call returns, every file of the data directory is read (untimed) and
the count of deletes whose marker was still on disk is printed (0 expected). A last row: a
hard delete while an outside connection holds an older snapshot, then the time from that
reader's end until the scrub is done (``Checkpointer.wait_scrubbed``; bounded by the
background retry's 1 s gap).

    .venv/bin/python bench/purge.py [--memories N] [--deletes D]    (default 2,000 / 40)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # bench/http.py
sys.path.insert(0, str(HERE.parent))

from local_store import HashingEmbedder, Store  # noqa: E402

SOFT = "soft delete (baseline)"
UNSCRUBBED = "hard delete, no scrub (before issue 32)"
SCRUBBED = "hard delete, WAL scrubbed before it returns"
KINDS = (SOFT, UNSCRUBBED, SCRUBBED)


def on_disk(root: Path, marker: str) -> bool:
    needle = marker[-12:].encode()
    for folder, _, names in os.walk(root):
        for name in names:
            if needle in Path(folder, name).read_bytes().lower():
                return True
    return False


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def row(name: str, values: list[float], base: float | None) -> str:
    ratio = "" if base is None else f"{statistics.median(values) / base:>7.2f}x"
    return (f"{name:<44} {len(values):>4} {statistics.median(values):>9.2f} "
            f"{pct(values, 0.95):>9.2f} {ratio:>8}")


async def main(memories: int, deletes: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        store = await Store.open(data, embedder=HashingEmbedder())
        try:
            for first in range(0, memories, 100):
                await store.memories.save_many([{"content": f"memory {n} about builds, deploys {n % 97}"}
                                       for n in range(first, min(first + 100, memories))])
            times: dict[str, list[float]] = {kind: [] for kind in KINDS}
            left = 0
            scrub = store.checkpointer.scrub

            async def no_scrub() -> bool:
                return False

            for _ in range(deletes):
                for kind in KINDS:
                    marker = "purgemark" + secrets.token_hex(8)
                    saved = await store.memories.save({"content": f"the key is {marker}",
                                              "title": f"key {marker}"})
                    # as before issue 32: the FTS merge, no scrub (the text stays in the WAL)
                    store.checkpointer.scrub = no_scrub if kind == UNSCRUBBED else scrub  # type: ignore[method-assign]
                    started = time.perf_counter()
                    await store.memories.delete(saved["id"], hard=kind != SOFT)
                    times[kind].append((time.perf_counter() - started) * 1e3)
                    if kind == SCRUBBED:
                        left += await asyncio.to_thread(on_disk, data, marker)
            store.checkpointer.scrub = scrub  # type: ignore[method-assign]
            marker = "purgemark" + secrets.token_hex(8)
            saved = await store.memories.save({"content": f"the key is {marker}"})

            def hold() -> sqlite3.Connection:
                conn = sqlite3.connect(f"file:{store.db_path}?mode=ro", uri=True,
                                       isolation_level=None, check_same_thread=False)
                conn.execute("BEGIN")
                conn.execute("SELECT count(*) FROM memories").fetchall()
                return conn

            reader = await asyncio.to_thread(hold)
            started = time.perf_counter()
            await store.memories.delete(saved["id"], hard=True)
            held_ms = (time.perf_counter() - started) * 1e3
            await asyncio.to_thread(reader.close)
            ended = time.perf_counter()
            await store.checkpointer.wait_scrubbed()
            after_ms = (time.perf_counter() - ended) * 1e3
            gone = not await asyncio.to_thread(on_disk, data, marker)
        finally:
            await store.close()
    base = statistics.median(times[SOFT])
    print(f"store of {memories:,} memories; {deletes} deletes of each kind, alternated")
    print(f"{'measure (ms)':<44} {'n':>4} {'median':>9} {'p95':>9} {'ratio':>8}")
    for kind in KINDS:
        print(row(kind, times[kind], None if kind == SOFT else base))
    print(f"hard deletes whose marker was on disk after the call: {left} of {deletes}")
    print(f"hard delete with an older snapshot open: returned after {held_ms:.0f} ms; "
          f"scrubbed {after_ms:.0f} ms after the reader ended; marker gone: {gone}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--memories", type=int, default=2000)
    parser.add_argument("--deletes", type=int, default=40)
    args = parser.parse_args()
    asyncio.run(main(args.memories, args.deletes))

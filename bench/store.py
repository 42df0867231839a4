"""Store benchmark: save latency against store size, apply throughput, and the SQLite floor.

Run from the repo root:  .venv/bin/python bench/store.py [--quick]

What is measured (HashingEmbedder throughout, so no model cost; its own cost is printed apart):
  * save p50/p95 over N individual ``Store.save`` calls (validate, redact, embed, one
    BEGIN IMMEDIATE transaction) at store sizes 1k, 10k and 100k memories: one store per size,
    filled through ``Store.apply`` in batches of 5,000 synthetic remote rows, then saved to in
    turns of 10 saves per store, so every size is timed in the same minutes (this VM's speed
    drifts by 30% over a minute; timed one size after the other, the drift showed up as a
    size effect).
  * apply throughput into an empty store: 10,000 fresh rows with 384-float embeddings (as the
    control plane sends them), the same rows without embeddings, and re-applying the same
    10,000 rows (all skipped by LWW). Each is the median of R runs, each on a fresh store.
  * the floors: a raw ``sqlite3`` single-row INSERT + COMMIT with the store's pragmas (for
    save), and the same 10,000 rows written into the store's own schema by bare ``executemany``
    INSERTs (memories, their FTS entries, vectors) and one COMMIT, with the store's pragmas and
    page size (for apply: what SQLite alone costs, without validation, redaction, hashing,
    LWW or the vector index). Each apply floor run alternates with a fresh-apply run.
Row generation happens before each timed section and is never timed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from local_store import HashingEmbedder, Store, db
from local_store.apply import node_from_wire, vector_from_wire
from local_store.columns import NODE_COLUMNS
from local_store.db import JOURNAL_SIZE_LIMIT, PAGE_SIZE
from protocol.rows import NodeRow
from protocol.timestamp import format_ns

DIM = 384
FILL_BATCH = 5_000
APPLY_ROWS = 10_000
SAVE_TURN = 10  # saves per store per turn: the sizes take turns, so each sees the same minutes
REALMS = ("work", "personal", "oss")
TYPES = ("fact", "decision", "preference", "learning", "procedure")

VOCABULARY = """
the a we use run build test deploy cache config database index query schema migration table
column row replica sync push pull cursor server client daemon agent memory session token
error retry timeout backoff lock writer reader transaction commit rollback checkpoint wal
python rust typescript go module package import function class method async await loop task
thread pool queue worker job cron schedule release version tag branch merge rebase review
lint format type check mypy ruff pytest fixture mock fake integration unit benchmark latency
throughput p50 p95 memory cpu disk network socket port loopback tls certificate key secret
redact private field value json yaml toml env variable path file directory repo project
docs readme changelog issue bug fix feature refactor rename delete archive restore backup
export import embedding vector search recall rank score filter limit offset page order
because after before when always never only prefer avoid instead should must can keep note
user team ci pipeline docker image container kubernetes service endpoint route handler api
slow fast small large stable flaky broken green red default custom local remote upstream
""".split()


def words(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(VOCABULARY) for _ in range(rng.randint(low, high)))


def unit_vectors(rng: np.random.Generator, n: int) -> np.ndarray:
    m = rng.standard_normal((n, DIM)).astype(np.float32)
    m /= np.linalg.norm(m, axis=1, keepdims=True)
    return m


def synthetic_rows(n: int, seed: int, start_ns: int, *, vectors: bool = True,
                   origin: str | None = None, step_ns: int = 1_000_000) -> list[NodeRow]:
    """Remote rows as the plane sends them: distinct ids, canonical stamps ``step_ns`` apart,
    384-d embeddings (``vectors=False``: none, as a laptop pushes rows the plane has no vector
    for)."""
    rng = random.Random(seed)
    embeddings = unit_vectors(np.random.default_rng(seed), n).tolist() if vectors else None
    rows = []
    for i in range(n):
        stamp = format_ns(start_ns + i * step_ns)
        rows.append(NodeRow(
            id=f"memory:{uuid.UUID(int=rng.getrandbits(128), version=4)}", labels="Memory",
            realm=rng.choice(REALMS), memory_type=rng.choice(TYPES), title=words(rng, 2, 6),
            content=words(rng, 15, 40), tags=",".join(rng.sample(VOCABULARY, 2)),
            importance=round(rng.random(), 2), status="active",
            embedding=None if embeddings is None else embeddings[i],
            created_at=stamp, updated_at=stamp, valid_at=stamp,
            provenance='{"source":"bench"}', origin=origin))
    return rows


def pct(samples: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(samples), q))


class Clock:
    """Distinct, increasing past timestamps for synthetic rows (inside any HLC drift bound)."""

    def __init__(self) -> None:
        self.next_ns = time.time_ns() - 90 * 86_400 * 1_000_000_000

    def take(self, n: int) -> int:
        start = self.next_ns
        self.next_ns += n * 1_000_000
        return start


# ---------------------------------------------------------------------------- measurements

async def fill(store: Store, target: int, clock: Clock, seed: int) -> float:
    """Apply synthetic batches until the store holds ``target`` memories; returns seconds spent
    applying (generation excluded)."""
    spent = 0.0
    count = (await store.maintenance.stats())["memories"]
    while count < target:
        n = min(FILL_BATCH, target - count)
        rows = synthetic_rows(n, seed + count, clock.take(n))
        t0 = time.perf_counter()
        result = await store.replication.apply(rows, [], model=store.embedder.model_id)
        spent += time.perf_counter() - t0
        if result.applied_nodes != n or result.problems:
            raise RuntimeError(f"fill: applied {result.applied_nodes}/{n}: {result.problems[:3]}")
        count += n
    return spent


async def time_saves(store: Store, n: int, rng: random.Random, seen: set[str],
                     warm_up: int = 10) -> list[float]:
    """``n`` timed saves, after ``warm_up`` untimed ones (the statement cache, the executors)."""
    samples = []
    for i in range(n + warm_up):
        content = words(rng, 15, 40)
        while content in seen:
            content = words(rng, 15, 40)
        seen.add(content)
        args = {"content": content, "title": words(rng, 2, 6), "memory_type": rng.choice(TYPES),
                "tags": rng.sample(VOCABULARY, 2), "realm": rng.choice(REALMS),
                "importance": round(rng.random(), 2)}
        t0 = time.perf_counter()
        res = await store.memories.save(args)
        elapsed = time.perf_counter() - t0
        if res.get("deduped"):
            raise RuntimeError("a timed save was deduplicated; contents must be unique")
        if i >= warm_up:
            samples.append(elapsed * 1000)
    return samples


def time_embed(n: int, rng: random.Random) -> list[float]:
    embedder = HashingEmbedder()
    texts = [words(rng, 15, 40) for _ in range(n + 10)]
    samples = []
    for i, text in enumerate(texts):
        t0 = time.perf_counter()
        embedder.embed([text])
        if i >= 10:
            samples.append((time.perf_counter() - t0) * 1000)
    return samples


def time_sqlite_floor(path: Path, n: int, rng: random.Random) -> list[float]:
    """Single-row INSERT + COMMIT with the store's pragmas: the cost any durable save pays."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute(f"PRAGMA journal_size_limit = {JOURNAL_SIZE_LIMIT}")
        conn.execute("CREATE TABLE t (id TEXT PRIMARY KEY, content TEXT NOT NULL, "
                     "vec BLOB NOT NULL) STRICT")
        blob = unit_vectors(np.random.default_rng(1), 1)[0].astype("<f4").tobytes()
        samples = []
        for i in range(n + 10):
            row = (f"memory:{uuid.uuid4()}", words(rng, 15, 40), blob)
            t0 = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t (id, content, vec) VALUES (?, ?, ?)", row)
            conn.execute("COMMIT")
            if i >= 10:
                samples.append((time.perf_counter() - t0) * 1000)
        return samples
    finally:
        conn.close()


def bulk_floor(path: Path, rows: list[NodeRow]) -> float:
    """rows/s of SQLite alone writing ``rows`` (normalised beforehand, untimed) into a new
    store file: plain ``executemany`` INSERTs, the FTS entries in one statement, one COMMIT."""
    prepared = []
    for i, wire in enumerate(rows):
        row = node_from_wire(wire)
        row["local_seq"] = i + 1
        prepared.append(row)
    params = [tuple(row[c] for c in NODE_COLUMNS) for row in prepared]
    vectors = [(row["id"], "bench", DIM, values.astype("<f4").tobytes())
               for row, wire in zip(prepared, rows, strict=True)
               if (values := vector_from_wire(wire)) is not None]
    conn = db.open_migrated(path)
    try:
        insert = (f"INSERT INTO memories ({', '.join(NODE_COLUMNS)}) "
                  f"VALUES ({', '.join('?' * len(NODE_COLUMNS))})")
        gc.collect()
        t0 = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(insert, params)
        conn.execute("INSERT INTO memories_fts (rowid, title, content, tags) "
                     "SELECT rowid, title, content, tags FROM memories ORDER BY rowid")
        conn.executemany("INSERT INTO vectors (memory_id, model, dim, vec) VALUES (?, ?, ?, ?)",
                         vectors)
        conn.execute("COMMIT")
        elapsed = time.perf_counter() - t0
    finally:
        conn.close()
    return len(rows) / elapsed


async def time_apply(root: Path, label: str, rows: list[NodeRow], *,
                     again: bool) -> tuple[float, float]:
    """rows/s of one apply of ``rows`` into a fresh store (or of the second apply if ``again``),
    and the ms from its return until the background WAL checkpoint it started had finished
    (off the writer's path, so not in rows/s; printed in the notes)."""
    async with await Store.open(root / label, embedder=HashingEmbedder()) as store:
        model = store.embedder.model_id
        if again:
            await store.replication.apply(rows, [], model=model)
            await store.checkpointer.wait_idle()  # the first apply's checkpoint is not timed
        gc.collect()
        t0 = time.perf_counter()
        result = await store.replication.apply(rows, [], model=model)
        elapsed = time.perf_counter() - t0
        t1 = time.perf_counter()
        await store.checkpointer.wait_idle()
        settle = (time.perf_counter() - t1) * 1000
    expected = (0, len(rows)) if again else (len(rows), 0)
    if (result.applied_nodes, result.skipped_nodes) != expected or result.problems:
        raise RuntimeError(f"{label}: unexpected apply result {result}")
    return len(rows) / elapsed, settle


async def median_of(runs: int,
                    measure: Callable[[int], Awaitable[tuple[float, float]]]) -> tuple[float, float]:
    results = [await measure(i) for i in range(runs)]
    return (statistics.median(r[0] for r in results), statistics.median(r[1] for r in results))


# ---------------------------------------------------------------------------- report

Row = tuple[str, str, str, str, str, str]


def ms(value: float) -> str:
    return f"{value:.3f} ms"


def verdict(ok: bool) -> str:
    return "ok" if ok else "MISS"


def print_table(rows: list[Row]) -> None:
    header: Row = ("metric", "n", "p50", "p95", "value", "target")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(6)]
    aligns = ["<", ">", ">", ">", ">", "<"]

    def line(r: Row) -> str:
        return " | ".join(f"{c:{a}{w}}" for c, a, w in zip(r, aligns, widths, strict=True))

    print(line(header))
    print("-+-".join("-" * w for w in widths))
    for r in rows:
        print(line(r))


async def main(quick: bool) -> int:
    started = time.perf_counter()
    load = os.getloadavg()[0]
    sizes = (1_000, 10_000) if quick else (1_000, 10_000, 100_000)
    saves = 100 if quick else 300
    runs = 1 if quick else 5
    rng = random.Random(7)
    rows: list[Row] = []
    notes: list[str] = []
    p50_by_size: dict[int, float] = {}

    with tempfile.TemporaryDirectory(prefix="syncd-bench-") as tmp:
        root = Path(tmp)
        clock, seen = Clock(), set[str]()
        fill_seconds = 0.0
        async with contextlib.AsyncExitStack() as stack:
            stores: dict[int, Store] = {}
            for size in sizes:
                store = await stack.enter_async_context(
                    await Store.open(root / f"sized-{size}", embedder=HashingEmbedder()))
                fill_seconds += await fill(store, size, clock, seed=size)
                stores[size] = store
            filled = 0
            for store in stores.values():
                await store.checkpointer.wait_idle()  # the fill's checkpoint is not a save's
                filled += (await store.maintenance.stats())["memories"]
            gc.collect()
            samples_by_size: dict[int, list[float]] = {size: [] for size in sizes}
            for turn in range(0, saves, SAVE_TURN):
                for size, store in stores.items():
                    samples_by_size[size] += await time_saves(
                        store, min(SAVE_TURN, saves - turn), rng, seen,
                        warm_up=10 if turn == 0 else 0)
            for size, samples in samples_by_size.items():
                p50_by_size[size] = pct(samples, 50)
                rows.append((f"save @ {size // 1000}k memories", str(len(samples)),
                             ms(pct(samples, 50)), ms(pct(samples, 95)),
                             verdict(p50_by_size[size] <= 3.0), "p50 <= 3 ms"))
        small, large = sizes[0], sizes[-1]
        ratio = p50_by_size[large] / p50_by_size[small]
        rows.append((f"save p50 ratio {large // 1000}k / {small // 1000}k", "", "", "",
                     f"{ratio:.2f}x {verdict(ratio <= 1.5)}", "flat (<= 1.5x)"))
        notes.append(f"fill: {filled} memories applied in batches of {FILL_BATCH} "
                     f"({filled / fill_seconds:,.0f} rows/s while growing, generation excluded)")

        embed = time_embed(saves, rng)
        rows.append(("HashingEmbedder.embed, 1 text", str(len(embed)), ms(pct(embed, 50)),
                     ms(pct(embed, 95)), "", "(inside every save)"))
        floor = time_sqlite_floor(root / "floor.db", saves, rng)
        rows.append(("baseline: sqlite3 INSERT+COMMIT", str(len(floor)), ms(pct(floor, 50)),
                     ms(pct(floor, 95)), "", "floor (WAL, sync=NORMAL)"))

        with_vectors = synthetic_rows(APPLY_ROWS, 99, clock.take(APPLY_ROWS))
        without = [msgspec.structs.replace(r, embedding=None) for r in with_vectors]
        fresh_runs: list[tuple[float, float]] = []
        floor_runs: list[float] = []
        for i in range(runs):  # alternated: both see the same minutes of this VM
            fresh_runs.append(await time_apply(root, f"fresh-{i}", with_vectors, again=False))
            floor_runs.append(await asyncio.to_thread(bulk_floor, root / f"bulk-{i}.db",
                                                      with_vectors))
        first = statistics.median(r[0] for r in fresh_runs)
        settle = statistics.median(r[1] for r in fresh_runs)
        bulk = statistics.median(floor_runs)
        bare, _ = await median_of(runs, lambda i: time_apply(root, f"bare-{i}", without,
                                                              again=False))
        again, _ = await median_of(runs, lambda i: time_apply(root, f"again-{i}", with_vectors,
                                                               again=True))
        notes.append(f"the background WAL checkpoint after a fresh apply finished {settle:.0f} ms "
                     "after apply returned (its own thread; the writer does not wait for it)")
        rows.append(("apply fresh, 384-d embeddings", str(APPLY_ROWS), "", "",
                     f"{first:,.0f} rows/s {verdict(first >= 20_000)}", ">= 20,000 rows/s"))
        # The checkpoint runs on its own thread, but a stream of pulled pages pays for it
        # (a WAL past the backstop is checkpointed on the writer's thread): the sustained rate.
        whole = statistics.median(APPLY_ROWS / (APPLY_ROWS / rate + wait / 1000)
                                  for rate, wait in fresh_runs)
        rows.append(("apply fresh + its WAL checkpoint", str(APPLY_ROWS), "", "",
                     f"{whole:,.0f} rows/s", "(the checkpoint after it, counted in)"))
        rows.append(("baseline: bare bulk INSERT+COMMIT", str(APPLY_ROWS), "", "",
                     f"{bulk:,.0f} rows/s", f"floor (apply = {first / bulk:.0%} of it)"))
        rows.append(("apply fresh, no embeddings", str(APPLY_ROWS), "", "",
                     f"{bare:,.0f} rows/s", "(vector cost = the difference)"))
        rows.append(("re-apply same rows (all skipped)", str(APPLY_ROWS), "", "",
                     f"{again:,.0f} rows/s {verdict(again >= 100_000)}", ">= 100,000 rows/s"))

    mode = "quick" if quick else "full"
    print(f"syncd store benchmark ({mode}: sizes {', '.join(f'{s // 1000}k' for s in sizes)}; "
          f"{saves} timed saves per size; apply median of {runs}; SQLite {sqlite3.sqlite_version}, "
          f"Python {sys.version.split()[0]}; {os.cpu_count()} CPUs, load average at start "
          f"{load:.2f})")
    print()
    print_table(rows)
    print()
    notes.insert(0, f"save includes HashingEmbedder (p50 {pct(embed, 50):.3f} ms, measured "
                    "alone above); save p50 minus that is the store's own cost")
    notes.append(f"save p50 over the raw sqlite floor: {p50_by_size[small] - pct(floor, 50):.3f} ms "
                 f"at {small // 1000}k")
    notes.append(f"vectors cost {APPLY_ROWS / first - APPLY_ROWS / bare:.3f} s "
                 f"per {APPLY_ROWS:,} rows ({(1 / first - 1 / bare) * 1e6:.1f} us/row: conversion, "
                 "the vectors table, the index)")
    for note in notes:
        print(f"note: {note}")
    print(f"run time: {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="sizes 1k and 10k only, fewer repetitions (a smoke test)")
    sys.exit(asyncio.run(main(parser.parse_args().quick)))

"""Recall speed: p50/p95 at 1k, 10k and 100k memories, index load time, query-embedding time,
and a store whose every memory shares the query's words (``dense_rows``).

Vectors are the hashing embedder's, 384-d (issue 3): stored memories and queries alike, so
similarities behave like a text embedder's (a query shares n-grams with many memories, not with
one random vector) and recall does the work it would on real text. Query vectors are computed
before the clock starts (``TableEmbedder``), so query embedding is excluded from the recall
numbers and reported on its own for the default model. Recalls share a memo of the rows they
read (``local_store/reader.py``), from which a write drops the rows of the memories it wrote;
the ``after a write`` row times recalls that each follow a save, whose commit also empties
SQLite's page cache of the reader's connection. Baselines measured in the same run: a
bare numpy exact top-50 over the same matrix (the floor for the semantic leg) and the control
plane's exact algorithm. Index load is the median of ``LOADS`` reopenings.

    .venv/bin/python bench/recall_speed.py [--quick] [--sizes 1000,10000,100000]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from local_store import HashingEmbedder, Store  # noqa: E402
from local_store.embed import Vectors  # noqa: E402
from protocol.rows import NodeRow  # noqa: E402
from protocol.timestamp import format_ns  # noqa: E402

DOMAIN = ("deploy release billing invoice postgres redis queue worker retry timeout cache "
          "frontend react bundle route api token auth session migration schema index test "
          "pipeline model feature training drift metric alert incident rollback config env "
          "docker kubernetes helm terraform lint format commit branch review latency budget "
          "stripe webhook payout ledger tax currency rounding export import sync backup").split()
_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in ("a", "e", "i", "o", "u", "ar", "en")]
# Memory text draws from a Zipf-distributed vocabulary of ~8,000 words (the 60 domain words are
# the most frequent), like real prose: a few words are everywhere, most are rare.
WORDS = DOMAIN + [a + b + c for a in _SYLLABLES[:20] for b in _SYLLABLES[:20]
                  for c in _SYLLABLES[:20]][:8000]
ZIPF = [1.0 / (rank + 1) for rank in range(len(WORDS))]
DIM = 384


def words(rng: random.Random, k: int) -> str:
    return " ".join(rng.choices(WORDS, weights=ZIPF, k=k))


LONG_QUERIES = 5
LOADS = 3
LONG_WORDS = 15_000
LONG_ROW = f"recall syncd, {LONG_WORDS:,}-word query"
AFTER_WRITE = 50
AFTER_ROW = "recall syncd, after a write"


def pasted_log(rng: random.Random) -> str:
    """A prompt carrying a pasted log: 15,000 words, ~12,000 of them distinct (ids, numbers)."""
    return " ".join(f"{rng.choice(WORDS)}={rng.randrange(100_000)}" for _ in range(LONG_WORDS))


class TableEmbedder:
    """The hashing embedder's vectors, from a table filled before timing (``prepare``): recall
    timing excludes query embedding."""

    model_id = "bench-hashing-384"
    dim = DIM

    def __init__(self) -> None:
        self.hashing = HashingEmbedder()
        self.table: dict[str, np.ndarray] = {}

    def prepare(self, texts: list[str]) -> None:
        missing = [t for t in dict.fromkeys(texts) if t not in self.table]
        if missing:
            self.table.update(zip(missing, self.hashing.embed(missing), strict=True))

    def vector(self, text: str) -> np.ndarray:
        if text not in self.table:
            self.prepare([text])
        return self.table[text]

    def embed(self, texts: list[str]) -> Vectors:
        return np.stack([self.vector(t) for t in texts]).astype(np.float32)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def fill(store: Store, n: int, rng: random.Random, start: int) -> None:
    now = time.time_ns()
    hashing = HashingEmbedder()
    for offset in range(0, n, 5000):
        count = min(n, offset + 5000) - offset
        texts = [words(rng, rng.randint(12, 30)) for _ in range(count)]
        vecs = hashing.embed(texts)
        rows = []
        for k, text in enumerate(texts):
            i = start + offset + k
            stamp = format_ns(now - rng.randint(0, 90) * 86_400 * 10**9 - i)
            rows.append(NodeRow(id=f"memory:{uuid.UUID(int=rng.getrandbits(128), version=4)}",
                                realm=rng.choice(["billing", "web", "ml"]), memory_type="fact",
                                content=text, tags=",".join(rng.sample(DOMAIN, 2)),
                                importance=rng.random(), status="active",
                                embedding=vecs[k].tolist(), created_at=stamp, updated_at=stamp))
        await store.replication.apply(rows, [], model=TableEmbedder.model_id)


async def measure(sizes: list[int], queries: int) -> list[tuple[str, ...]]:
    rng = random.Random(7)
    embedder = TableEmbedder()
    qtexts: list[str] = []
    rows: list[tuple[str, ...]] = []
    with tempfile.TemporaryDirectory() as tmp:
        store = await Store.open(Path(tmp), embedder=embedder)  # type: ignore[arg-type]
        have = 0
        try:
            for size in sizes:
                await fill(store, size - have, rng, have)
                have = size
                qtexts = await related_queries(store, embedder, rng, queries)
                # The fill's WAL checkpoint (tens of MB, on its own thread) is not a recall's:
                # let it finish before the clock starts, as bench/store.py does for saves.
                await store.checkpointer.wait_idle()
                for mode in ("syncd", "plane"):
                    if mode == "plane" and size > 10_000:
                        continue  # its substring keyword leg scans every row
                    lat = []
                    for text in qtexts:
                        t = time.perf_counter()
                        await store.recall.query({"query": text}, mode=mode)
                        lat.append((time.perf_counter() - t) * 1000)
                    rows.append((f"recall {mode}", f"{size:,}", f"{statistics.median(lat):.2f}",
                                 f"{pct(lat, 0.95):.2f}", _target(mode, size)))
                lat = []
                for k, text in enumerate(qtexts[:AFTER_WRITE]):
                    await store.memories.save({"content": f"{words(rng, 20)} {k}"})
                    t = time.perf_counter()
                    await store.recall.query({"query": text})
                    lat.append((time.perf_counter() - t) * 1000)
                have += AFTER_WRITE
                rows.append((AFTER_ROW, f"{size:,}", f"{statistics.median(lat):.2f}",
                             f"{pct(lat, 0.95):.2f}", "(each follows a save)"))
                lat = []
                pasted = [pasted_log(rng) for _ in range(LONG_QUERIES)]
                embedder.prepare(pasted)
                for text in pasted:
                    t = time.perf_counter()
                    await store.recall.query({"query": text})
                    lat.append((time.perf_counter() - t) * 1000)
                rows.append((LONG_ROW, f"{size:,}", f"{statistics.median(lat):.2f}",
                             f"{pct(lat, 0.95):.2f}", "(a prompt with a pasted log)"))
                matrix = store.index.matrix
                floor = []
                for text in qtexts:
                    q = embedder.vector(text)
                    t = time.perf_counter()
                    sims = matrix @ q
                    np.argpartition(-sims, 49)[:50]
                    floor.append((time.perf_counter() - t) * 1000)
                rows.append(("baseline numpy top-50", f"{size:,}",
                             f"{statistics.median(floor):.2f}", f"{pct(floor, 0.95):.2f}", ""))
        finally:
            await store.close()
        loads, held = [], 0
        for _ in range(LOADS):
            t = time.perf_counter()
            reopened = await Store.open(Path(tmp), embedder=embedder)  # type: ignore[arg-type]
            loads.append((time.perf_counter() - t) * 1000)
            held = len(reopened.index)
            await reopened.close()
        rows.append(("open + index load", f"{held:,}", f"{statistics.median(loads):.0f}",
                     f"{max(loads):.0f}", f"<= 2000 ms at 100k (median of {LOADS} opens; "
                     "p95 column: the slowest)"))
    return rows


async def related_queries(store: Store, embedder: TableEmbedder, rng: random.Random,
                          n: int) -> list[str]:
    """Queries that look for something stored, as agents' queries do: 2–4 words of a random
    memory (skipping the 60 most frequent words, which act as stopwords here), embedded like
    the memories (the vectors of the text, before the clock starts). Random words would mostly
    hit the fallback instead."""
    common = set(WORDS[:60])
    out = []
    for _ in range(n):
        mid = rng.choice(store.index.ids)
        (row,) = await store._fetch("SELECT content FROM memories WHERE id = ?", (mid,))
        pool = [w for w in row[0].split() if w not in common] or row[0].split()
        out.append(" ".join(rng.sample(pool, min(len(pool), rng.randint(2, 4)))))
    embedder.prepare(out)
    return out


DENSE_MEMORIES = 2_000
DENSE_QUERIES = 200


def dense_workload(rng: random.Random, memories: int, queries: int) -> tuple[list[str], list[str]]:
    """Memory texts of 12–30 words drawn from the 60 domain words only, and queries of 3 of
    them: every memory holds most of every query's words (also bench/peer.py's workload)."""
    texts = [" ".join(rng.choices(DOMAIN, k=rng.randint(12, 30))) for _ in range(memories)]
    return texts, [" ".join(rng.sample(DOMAIN, 3)) for _ in range(queries)]


async def dense_rows() -> list[tuple[str, ...]]:
    """Dense keyword overlap (issue 36): memories of 12–30 words drawn from the 60 domain words
    only and queries of 3 of them, so every memory holds most of every query's words. Each leg
    alone (``keyword``, ``vector`` modes) and syncd's full recall, alternated query by query;
    the ratio is full recall's p50 over the sum of the legs' p50s, in the same run."""
    rng = random.Random(11)
    embedder = TableEmbedder()
    texts, queries = dense_workload(rng, DENSE_MEMORIES, DENSE_QUERIES)
    embedder.prepare(texts + queries)
    now = time.time_ns()
    rows = [NodeRow(id=f"memory:{uuid.UUID(int=rng.getrandbits(128), version=4)}", realm="r",
                    memory_type="fact", content=text, importance=rng.random(), status="active",
                    embedding=embedder.vector(text).tolist(), created_at=format_ns(now - i),
                    updated_at=format_ns(now - i)) for i, text in enumerate(texts)]
    lat: dict[str, list[float]] = {"keyword": [], "vector": [], "syncd": []}
    with tempfile.TemporaryDirectory() as tmp:
        store = await Store.open(Path(tmp), embedder=embedder)  # type: ignore[arg-type]
        try:
            await store.replication.apply(rows, [], model=TableEmbedder.model_id)
            await store.checkpointer.wait_idle()
            for text in queries:
                for mode in lat:
                    t = time.perf_counter()
                    await store.recall.query({"query": text}, mode=mode)  # type: ignore[arg-type]
                    lat[mode].append((time.perf_counter() - t) * 1000)
        finally:
            await store.close()
    p50 = {mode: statistics.median(values) for mode, values in lat.items()}
    size = f"{DENSE_MEMORIES:,}"
    out = [(f"dense overlap: {mode} leg", size, f"{p50[mode]:.2f}", f"{pct(lat[mode], 0.95):.2f}",
            "") for mode in ("keyword", "vector")]
    ratio = p50["syncd"] / (p50["keyword"] + p50["vector"])
    out.append(("dense overlap: recall syncd", size, f"{p50['syncd']:.2f}",
                f"{pct(lat['syncd'], 0.95):.2f}",
                f"p50 <= 2 ms; x{ratio:.2f} the legs' sum (<= 1.3)"))
    return out


def _target(mode: str, size: int) -> str:
    if mode != "syncd":
        return "(plane, same code)"
    return {10_000: "p50 <= 2 ms", 100_000: "p50 <= 10 ms"}.get(size, "")


def embed_rows() -> list[tuple[str, ...]]:
    try:
        from local_store.embed_minilm import MiniLMEmbedder
    except ImportError as exc:  # pragma: no cover - the model package is a dependency
        return [("default model query embed", "", "n/a", "", str(exc))]
    model = MiniLMEmbedder()
    t = time.perf_counter()
    model.embed(["warm up"])
    load = (time.perf_counter() - t) * 1000
    lat = []
    for i in range(200):
        t = time.perf_counter()
        model.embed([f"how do I deploy the billing service {i}"])
        lat.append((time.perf_counter() - t) * 1000)
    return [("default model load + first", "1", f"{load:.0f}", "", ""),
            ("default model query embed", "200", f"{statistics.median(lat):.2f}",
             f"{pct(lat, 0.95):.2f}", "p50 <= 5 ms")]


def main() -> None:
    parser = argparse.ArgumentParser(description="recall speed")
    parser.add_argument("--quick", action="store_true", help="1k and 10k only, 50 queries")
    parser.add_argument("--sizes", default="")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s] or (
        [1_000, 10_000] if args.quick else [1_000, 10_000, 100_000])
    started = time.perf_counter()
    rows = asyncio.run(measure(sizes, 50 if args.quick else 200))
    rows += asyncio.run(dense_rows())
    rows += embed_rows()
    head = ("metric", "memories", "p50 ms", "p95 ms", "target")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, tuple("-" * w for w in widths), *rows]:
        print(" | ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)))
    print(f"hashing embedder for reference: {HashingEmbedder().model_id}; "
          f"run time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()

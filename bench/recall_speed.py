"""Recall speed: p50/p95 at 1k, 10k and 100k memories, index load time, query-embedding time.

Vectors are 384-d (random unit vectors for stored memories; the query's vector comes from a
precomputed table, so query embedding is excluded from the recall numbers and reported on its
own for the default model). Baselines measured in the same run: a bare numpy exact top-50 over
the same matrix (the floor for the semantic leg) and the control plane's exact algorithm.

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
LONG_WORDS = 15_000
LONG_ROW = f"recall syncd, {LONG_WORDS:,}-word query"


def pasted_log(rng: random.Random) -> str:
    """A prompt carrying a pasted log: 15,000 words, ~12,000 of them distinct (ids, numbers)."""
    return " ".join(f"{rng.choice(WORDS)}={rng.randrange(100_000)}" for _ in range(LONG_WORDS))


class TableEmbedder:
    """Answers from a precomputed table, so timing excludes query embedding."""

    model_id = "bench-random-384"
    dim = DIM

    def __init__(self) -> None:
        self.table: dict[str, np.ndarray] = {}
        self.rng = np.random.default_rng(1)

    def vector(self, text: str) -> np.ndarray:
        if text not in self.table:
            v = self.rng.standard_normal(DIM).astype(np.float32)
            self.table[text] = v / np.linalg.norm(v)
        return self.table[text]

    def embed(self, texts: list[str]) -> Vectors:
        return np.stack([self.vector(t) for t in texts]).astype(np.float32)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def fill(store: Store, n: int, rng: random.Random, start: int) -> None:
    now = time.time_ns()
    vecs = np.random.default_rng(start).standard_normal((n, DIM)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    for offset in range(0, n, 5000):
        rows = []
        for i in range(offset, min(n, offset + 5000)):
            text = words(rng, rng.randint(12, 30))
            stamp = format_ns(now - rng.randint(0, 90) * 86_400 * 10**9 - i)
            rows.append(NodeRow(id=f"memory:{uuid.UUID(int=rng.getrandbits(128), version=4)}",
                                realm=rng.choice(["billing", "web", "ml"]), memory_type="fact",
                                content=text, tags=",".join(rng.sample(DOMAIN, 2)),
                                importance=rng.random(), status="active",
                                embedding=vecs[i].tolist(), created_at=stamp, updated_at=stamp))
        await store.apply(rows, [], model=TableEmbedder.model_id)


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
                        await store.recall({"query": text}, mode=mode)
                        lat.append((time.perf_counter() - t) * 1000)
                    rows.append((f"recall {mode}", f"{size:,}", f"{statistics.median(lat):.2f}",
                                 f"{pct(lat, 0.95):.2f}", _target(mode, size)))
                lat = []
                for _ in range(LONG_QUERIES):
                    text = pasted_log(rng)
                    t = time.perf_counter()
                    await store.recall({"query": text})
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
        t = time.perf_counter()
        reopened = await Store.open(Path(tmp), embedder=embedder)  # type: ignore[arg-type]
        load = time.perf_counter() - t
        rows.append(("open + index load", f"{len(reopened.index):,}", f"{load * 1000:.0f}", "",
                     "<= 2000 ms at 100k"))
        await reopened.close()
    return rows


async def related_queries(store: Store, embedder: TableEmbedder, rng: random.Random,
                          n: int) -> list[str]:
    """Queries that look for something stored, as agents' queries do: 2–4 words of a random
    memory (skipping the 60 most frequent words, which act as stopwords here), with a vector
    near that memory's (its own plus noise, cosine ≈ 0.5–0.6 — what MiniLM gives a real
    paraphrase). Random words and random vectors would mostly hit the fallback instead."""
    common = set(WORDS[:60])
    out = []
    for _ in range(n):
        mid = rng.choice(store.index.ids)
        (row,) = await store._fetch("SELECT content FROM memories WHERE id = ?", (mid,))
        pool = [w for w in row[0].split() if w not in common] or row[0].split()
        text = " ".join(rng.sample(pool, min(len(pool), rng.randint(2, 4))))
        noise = embedder.rng.standard_normal(DIM).astype(np.float32)
        noise /= np.linalg.norm(noise)
        own = store.index.matrix[store.index.ids.index(mid)]
        vector = own + 1.4 * noise
        embedder.table[text] = (vector / np.linalg.norm(vector)).astype(np.float32)
        out.append(text)
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
    rows += embed_rows()
    head = ("metric", "memories", "p50 ms", "p95 ms", "target")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, tuple("-" * w for w in widths), *rows]:
        print(" | ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)))
    print(f"hashing embedder for reference: {HashingEmbedder().model_id}; "
          f"run time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()

"""Benchmark the offline MiniLM embedder: load time, single-query latency, batch throughput.

    .venv/bin/python bench/embed.py [--threads N] [--queries 200] [--batches 20] [--loads 5]

Load time is measured in fresh child processes (import of onnxruntime/tokenizers, file lookup,
sha256 checks, tokenizer and session creation): that is what a daemon pays at its first embed.
Query latency is one ``embed([query])`` call on a warm embedder. Throughput embeds 64-text
batches of memory-like texts (10-60 words) and of short queries. Prints a table with median and p95.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from local_store.embed_minilm import BATCH_SIZE, MiniLMEmbedder  # noqa: E402

QUERIES = [
    "how do I deploy",
    "release procedure",
    "why does the sqlite writer lock",
    "where are the api tokens redacted",
    "fix flaky merge conflict test",
    "what port does the daemon listen on",
    "embedding model cache location",
    "retry policy for the control plane",
]

WORDS = (
    "deploy release tag make build test sqlite writer lock daemon token redact merge conflict "
    "vector embedding cache retry timeout schema migration replica control plane agent memory "
    "python async queue index search cosine batch commit rollback config secret path file"
).split()

LOAD_CHILD = """
import json, sys, time
sys.path.insert(0, {root!r})
t0 = time.perf_counter()
from local_store.embed_minilm import MiniLMEmbedder
e = MiniLMEmbedder({threads})
t1 = time.perf_counter()
e.load()
t2 = time.perf_counter()
e.embed(["warm up"])
t3 = time.perf_counter()
print(json.dumps({{"load": t2 - t1, "first_embed": t3 - t2, "module_import": t1 - t0}}))
"""


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def memory_texts(n: int, seed: int = 7) -> list[str]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        length = int(rng.integers(10, 61))
        out.append(" ".join(WORDS[int(i)] for i in rng.integers(0, len(WORDS), length)))
    return out


def measure_loads(runs: int, threads: int | None) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {"load": [], "first_embed": [], "module_import": []}
    code = LOAD_CHILD.format(root=str(REPO_ROOT), threads="" if threads is None else threads)
    for _ in range(runs):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True, stdin=subprocess.DEVNULL)
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        for key in results:
            results[key].append(float(row[key]))
    return results


def row(name: str, values_ms: list[float], extra: str = "") -> str:
    return (f"{name:<34} {len(values_ms):>5} {statistics.median(values_ms):>10.2f} "
            f"{percentile(values_ms, 95):>10.2f} {min(values_ms):>10.2f}  {extra}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None,
                        help="onnxruntime intra-op threads (default: min(2, cpus))")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--loads", type=int, default=5)
    args = parser.parse_args()

    import onnxruntime

    loads = measure_loads(args.loads, args.threads)

    embedder = MiniLMEmbedder(args.threads)
    embedder.load()
    for q in QUERIES:  # warm-up
        embedder.embed([q])
    query_ms = []
    for i in range(args.queries):
        q = QUERIES[i % len(QUERIES)]
        t0 = time.perf_counter()
        embedder.embed([q])
        query_ms.append((time.perf_counter() - t0) * 1000)

    def throughput(texts: list[str]) -> tuple[list[float], float]:
        batches = [texts[i:i + BATCH_SIZE] for i in range(0, len(texts), BATCH_SIZE)]
        embedder.embed(batches[0])  # warm-up
        batch_ms = []
        for batch in batches:
            t0 = time.perf_counter()
            embedder.embed(batch)
            batch_ms.append((time.perf_counter() - t0) * 1000)
        tokens = statistics.mean(len(embedder._tokenizer.encode(t).ids) for t in texts)
        return batch_ms, tokens

    memory_ms, memory_tokens = throughput(memory_texts(BATCH_SIZE * args.batches))
    short_ms, short_tokens = throughput(
        [f"{QUERIES[i % len(QUERIES)]} {i}" for i in range(BATCH_SIZE * args.batches)])

    load1, load5, _ = os.getloadavg()
    print(f"MiniLMEmbedder ({embedder.model_id}, int8 ONNX) on onnxruntime {onnxruntime.__version__}; "
          f"cpus={os.cpu_count()} intra_op_threads={embedder._threads} "
          f"loadavg(1m,5m)={load1:.2f},{load5:.2f}")
    print(f"{'measure':<34} {'n':>5} {'median':>10} {'p95':>10} {'min':>10}")
    print(row("load, fresh process (ms)", [s * 1000 for s in loads["load"]],
              "import onnxruntime+tokenizers, sha256, tokenizer, session"))
    print(row("module import (ms)", [s * 1000 for s in loads["module_import"]],
              "import local_store.embed_minilm"))
    print(row("first embed after load (ms)", [s * 1000 for s in loads["first_embed"]]))
    print(row("single query embed (ms)", query_ms, "target <= 5 ms"))
    for label, batch_ms, tokens in (("memory texts", memory_ms, memory_tokens),
                                    ("short queries", short_ms, short_tokens)):
        per_sec = [BATCH_SIZE / (ms / 1000) for ms in batch_ms]
        print(row(f"batch of {BATCH_SIZE} {label} (ms)", batch_ms,
                  f"{tokens:.1f} tokens/text incl. [CLS]/[SEP]"))
        print(f"{'  throughput (texts/s)':<34} {len(per_sec):>5} "
              f"{statistics.median(per_sec):>10.1f} {percentile(per_sec, 5):>10.1f} "
              f"{max(per_sec):>10.1f}  p95 = 5th percentile, min = best")

if __name__ == "__main__":
    main()

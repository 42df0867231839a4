"""Benchmark the offline MiniLM embedder: load time, single-query latency, batch throughput.

    .venv/bin/python bench/embed.py [--threads N] [--queries 200] [--batches 20] [--loads 5]

Load time is measured in fresh child processes (import of onnxruntime/tokenizers, file lookup,
sha256 checks, tokenizer and session creation): that is what a daemon pays at its first embed.
Query latency is one ``embed([query])`` call on a warm embedder. Throughput embeds 64-text
batches of memory-like texts (10-60 words) and of short queries. Each latency is measured for the
default fused graph and, alternated with it in the same run, for the model file's exported graph
(the baseline). Prints a table with median, p95 and the ratio to the baseline.
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
    return (f"{name:<42} {len(values_ms):>5} {statistics.median(values_ms):>10.2f} "
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
    exported = MiniLMEmbedder(args.threads, fused=False)  # baseline: the graph as it ships
    pair = {"fused": embedder, "exported": exported}
    for one in pair.values():
        one.load()
        for q in QUERIES:  # warm-up
            one.embed([q])
    query_ms: dict[str, list[float]] = {name: [] for name in pair}
    for block in range(0, args.queries, 25):  # alternate blocks, so both see the same minutes
        for name, one in pair.items():
            for i in range(block, min(block + 25, args.queries)):
                q = QUERIES[i % len(QUERIES)]
                t0 = time.perf_counter()
                one.embed([q])
                query_ms[name].append((time.perf_counter() - t0) * 1000)

    def throughput(texts: list[str]) -> dict[str, list[float]]:
        batches = [texts[i:i + BATCH_SIZE] for i in range(0, len(texts), BATCH_SIZE)]
        batch_ms: dict[str, list[float]] = {name: [] for name in pair}
        for one in pair.values():
            one.embed(batches[0])  # warm-up
        for batch in batches:
            for name, one in pair.items():
                t0 = time.perf_counter()
                one.embed(batch)
                batch_ms[name].append((time.perf_counter() - t0) * 1000)
        return batch_ms

    def tokens(texts: list[str]) -> float:
        return statistics.mean(len(embedder._tokenizer.encode(t).ids) for t in texts)

    memory = memory_texts(BATCH_SIZE * args.batches)
    short = [f"{QUERIES[i % len(QUERIES)]} {i}" for i in range(BATCH_SIZE * args.batches)]
    memory_ms, short_ms = throughput(memory), throughput(short)

    load1, load5, _ = os.getloadavg()
    print(f"MiniLMEmbedder ({embedder.model_id}, int8 ONNX) on onnxruntime {onnxruntime.__version__}; "
          f"cpus={os.cpu_count()} intra_op_threads={embedder._threads} "
          f"loadavg(1m,5m)={load1:.2f},{load5:.2f}")
    print("fused = the default graph (local_store/minilm_graph.py); exported = the model file's "
          "own graph, alternated with it in the same run")
    print(f"{'measure':<42} {'n':>5} {'median':>10} {'p95':>10} {'min':>10}")
    print(row("load, fresh process (ms)", [s * 1000 for s in loads["load"]],
              "import onnxruntime+tokenizers+onnx, sha256, tokenizer, fused graph, session"))
    print(row("module import (ms)", [s * 1000 for s in loads["module_import"]],
              "import local_store.embed_minilm"))
    print(row("first embed after load (ms)", [s * 1000 for s in loads["first_embed"]]))
    for name in pair:
        ratio = statistics.median(query_ms[name]) / statistics.median(query_ms["exported"])
        print(row(f"single query embed, {name} (ms)", query_ms[name],
                  f"×{ratio:.2f} of exported; target <= 5 ms"))
    for label, batch_ms, texts in (("memory texts", memory_ms, memory),
                                   ("short queries", short_ms, short)):
        for name in pair:
            ratio = statistics.median(batch_ms[name]) / statistics.median(batch_ms["exported"])
            per_sec = [BATCH_SIZE / (ms / 1000) for ms in batch_ms[name]]
            print(row(f"batch of {BATCH_SIZE} {label}, {name} (ms)", batch_ms[name],
                      f"×{ratio:.2f} of exported; {tokens(texts):.1f} tokens/text incl. "
                      "[CLS]/[SEP]"))
            print(f"{'  throughput (texts/s)':<42} {len(per_sec):>5} "
                  f"{statistics.median(per_sec):>10.1f} {percentile(per_sec, 5):>10.1f} "
                  f"{max(per_sec):>10.1f}  p95 = 5th percentile, min = best")


if __name__ == "__main__":
    main()

"""Versions benchmark: what keeping history costs an apply of updates and a local edit.

Run from the repo root:  .venv/bin/python bench/versions.py [--baseline DIR] [--runs R]

Measured, each the median of R runs on fresh stores (HashingEmbedder, no model cost):
  * update apply: 10,000 rows applied to a store that holds an older version of each, so every
    row wins last-writer-wins and its local version is kept (``versions.keep_replaced``);
  * edit: p50 of 500 topic-key upserts of one memory (each keeps the version it replaces).
``--baseline DIR``: a checkout without versions (e.g. /work/main); the same measurements run
there in a child process, alternating with this tree's runs, so both see the same minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def measure(root: str) -> dict[str, float]:
    """One run of both measurements with the code under ``root`` (import path set by caller)."""
    import msgspec

    from bench.store import Clock, synthetic_rows
    from local_store import HashingEmbedder, Store

    async def run() -> dict[str, float]:
        clock = Clock()
        start = clock.take(10_000)
        rows = synthetic_rows(10_000, 7, start, vectors=False, origin="benchplane")
        newer = [msgspec.structs.replace(r, updated_at=_later(r.updated_at),
                                         content=r.content + " edited") for r in rows]
        with tempfile.TemporaryDirectory() as tmp:
            store = await Store.open(Path(tmp) / "s", embedder=HashingEmbedder())
            try:
                await store.replication.apply(rows, [], model="bench")
                began = time.perf_counter()
                await store.replication.apply(newer, [], model="bench")
                apply_s = time.perf_counter() - began
                samples = []
                for i in range(500):
                    began = time.perf_counter()
                    await store.memories.save({"content": f"edit number {i}", "topic_key": "bench/one"})
                    samples.append(time.perf_counter() - began)
            finally:
                await store.close()
        return {"update_apply_rows_per_s": 10_000 / apply_s,
                "edit_p50_ms": statistics.median(samples) * 1000}

    return asyncio.run(run())


def _later(stamp: str | None) -> str:
    from protocol.timestamp import format_ns, parse_ns
    assert stamp is not None
    return format_ns(parse_ns(stamp) + 500_000)


def child(root: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{HERE}", "PYTHONDONTWRITEBYTECODE": "1"}
    code = ("import json, sys; sys.path[:0] = [sys.argv[1]]; from bench.versions import "
            "measure; print(json.dumps(measure(sys.argv[1])))")
    out = subprocess.run([sys.executable, "-c", code, str(root)], env=env, check=True,
                         capture_output=True, text=True, cwd=root).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    mine: list[dict[str, float]] = []
    base: list[dict[str, float]] = []
    for _ in range(args.runs):
        mine.append(child(HERE))
        if args.baseline:
            base.append(child(args.baseline))
    print(f"{'measure':<26}{'versions':>12}{'baseline':>12}{'ratio':>8}")
    for key in mine[0]:
        ours = statistics.median(m[key] for m in mine)
        if base:
            theirs = statistics.median(b[key] for b in base)
            print(f"{key:<26}{ours:>12.1f}{theirs:>12.1f}{ours / theirs:>8.2f}")
        else:
            print(f"{key:<26}{ours:>12.1f}")


if __name__ == "__main__":
    main()

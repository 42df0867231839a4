"""syncd against a peer, mcp-memory-service 12.4.0, on one workload in one run (issue 36, point 5).

The workload is recall_speed.py's dense overlap (``dense_workload``): 2,000 memories of 12–30
words from the 60-word technical vocabulary, saved one at a time, then 200 queries of 3 of those
words, each followed by the same texts on every side. Rows:

- ``peer``: mcp-memory-service's sqlite_vec backend called in-process (no HTTP, no MCP framing)
  with its hash embeddings, so no model runs: the peer's best case. It needs SQLite extension
  loading, which Debian's ``/usr/bin/python3`` has and pyenv's builds lack, so it runs in a child
  process of a bench-only venv, ``.bench-venv/peer`` (git-ignored), made on first use with
  ``/usr/bin/python3 -m venv`` and ``pip install mcp-memory-service==12.4.0``, never a test
  dependency. That install is ~55 packages, 193 MB (its MCP SDK, FastAPI and uvicorn, aiohttp,
  numpy, sqlite-vec 0.1.9, cryptography, zeroconf) and no torch, sentence-transformers or
  onnxruntime: with ``MCP_MEMORY_USE_ONNX=0`` its storage takes its ``_HashEmbeddingModel``
  (sha256 vectors) and never downloads a model; the child checks it did.
- ``syncd``: a real ``syncd run`` daemon (a temporary HOME, ``--listen 127.0.0.1:0``) through
  HTTP on one keep-alive connection, the default MiniLM embedder; ``syncd, hashing`` the same
  with ``SYNCD_EMBEDDING_MODEL=hashing``, like for like with the peer's hash embeddings.

Ratios are the peer's p50 over syncd's, from the same run. Targets (MiniLM row): save ≥ 3×,
query ≥ 2×.

    .venv/bin/python bench/peer.py [--memories 2000] [--queries 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PEER_VERSION = "12.4.0"
PEER_VENV = ROOT / ".bench-venv" / "peer"
PEER_PYTHON = Path("/usr/bin/python3")  # has sqlite3 extension loading, which sqlite_vec needs
REALM = "bench"
SAVE = "/v1/agent/memory/tools/save_memory"
QUERY = "/v1/agent/memory/query"
WARMUP = 20
LIMIT = 10


# ---------------------------------------------------------------------- the peer (child venv)

def peer_child() -> None:
    """Runs in the peer's venv: reads the workload (JSON) on stdin, prints the latencies."""
    work = json.load(sys.stdin)
    print(json.dumps(asyncio.run(_peer_run(work["memories"], work["queries"]))), flush=True)


async def _peer_run(memories: list[str], queries: list[str]) -> dict[str, list[float]]:
    from mcp_memory_service.models.memory import Memory
    from mcp_memory_service.storage.mixins.embeddings import _HashEmbeddingModel
    from mcp_memory_service.storage.sqlite_vec import SqliteVecMemoryStorage
    from mcp_memory_service.utils.hashing import generate_content_hash

    with tempfile.TemporaryDirectory() as tmp:
        storage = SqliteVecMemoryStorage(str(Path(tmp) / "peer.db"))
        await storage.initialize()
        if not isinstance(storage.embedding_model, _HashEmbeddingModel):
            raise SystemExit(f"the peer loaded {type(storage.embedding_model)}, not its hash "
                             "embeddings")
        stored = 0

        async def save(text: str) -> bool:
            ok, _ = await storage.store(Memory(content=text,
                                               content_hash=generate_content_hash(text)))
            return bool(ok)

        async def query(text: str) -> int:
            return len(await storage.retrieve(text, n_results=LIMIT))

        lat: dict[str, list[float]] = {"save": [], "query": []}
        for text in memories:
            started = time.perf_counter()
            stored += await save(text)
            lat["save"].append((time.perf_counter() - started) * 1000)
        for i in range(WARMUP):
            await query(queries[i % len(queries)])
        for text in queries:
            started = time.perf_counter()
            await query(text)
            lat["query"].append((time.perf_counter() - started) * 1000)
        await storage.close()
    if stored != len(memories):
        raise SystemExit(f"the peer stored {stored} of {len(memories)} memories")
    return lat


def ensure_peer_venv() -> Path:
    python = PEER_VENV / "bin" / "python"
    marker = PEER_VENV / f".installed-{PEER_VERSION}"
    if marker.exists():
        return python
    if not PEER_PYTHON.exists():
        raise SystemExit(f"{PEER_PYTHON} not found: the peer needs a Python with SQLite extension "
                         "loading (Debian's python3)")
    subprocess.run([str(PEER_PYTHON), "-m", "venv", str(PEER_VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet",
                    f"mcp-memory-service=={PEER_VERSION}"], check=True)
    marker.touch()
    return python


def run_peer(memories: list[str], queries: list[str]) -> dict[str, list[float]]:
    python = ensure_peer_venv()
    with tempfile.TemporaryDirectory() as home:
        out = subprocess.run([str(python), str(Path(__file__).resolve()), "--peer-child"],
                             input=json.dumps({"memories": memories, "queries": queries}),
                             capture_output=True, text=True, env=_peer_env(Path(home)), check=False)
    if out.returncode != 0:
        raise SystemExit(f"the peer's run failed ({out.returncode}):\n{out.stderr[-4000:]}")
    result: dict[str, list[float]] = json.loads(out.stdout.splitlines()[-1])
    return result


def _peer_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_")}
    env.update(HOME=str(home), XDG_DATA_HOME=str(home / "data"), HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", MCP_MEMORY_USE_ONNX="0")
    return env


# ---------------------------------------------------------------------- syncd (a real daemon)

def run_syncd(memories: list[str], queries: list[str], model: str | None
              ) -> dict[str, list[float]]:
    import http.client

    from bench.hook import env_for
    from syncd.token import read_token, token_path

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        data = home / "data"
        env = env_for(home)
        if model:
            env["SYNCD_EMBEDDING_MODEL"] = model
        proc = subprocess.Popen([str(ROOT / ".venv" / "bin" / "syncd"), "--data-dir", str(data),
                                 "run", "--listen", "127.0.0.1:0"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            url = _ready_url(proc)
            host, port = url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
            conn = http.client.HTTPConnection(host, int(port))
            headers = {"Authorization": f"Bearer {read_token(token_path(data))}",
                       "Content-Type": "application/json"}

            def post(route: str, body: dict[str, object]) -> float:
                started = time.perf_counter()
                conn.request("POST", route, json.dumps(body).encode(), headers)
                resp = conn.getresponse()
                payload = resp.read()
                elapsed = (time.perf_counter() - started) * 1000
                if resp.status != 200:
                    raise SystemExit(f"{route} answered {resp.status}: {payload[:500]!r}")
                return elapsed

            return _drive(memories, queries,
                          lambda text: post(SAVE, {"content": text, "realm": REALM}),
                          lambda text: post(QUERY, {"query": text, "limit": LIMIT}))
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def _ready_url(proc: subprocess.Popen[bytes]) -> str:
    assert proc.stderr is not None
    for line in proc.stderr:  # wait on its "ready on URL" line
        text = line.decode(errors="replace")
        if "ready on " in text:
            return text.split("ready on ", 1)[1].split()[0]
    raise SystemExit(f"the daemon exited before ready ({proc.wait()})")


def _drive(memories: list[str], queries: list[str], save, query) -> dict[str, list[float]]:  # type: ignore[no-untyped-def]
    """Every save, then ``WARMUP`` untimed queries, then every query: the peer's order too."""
    saves = [save(text) for text in memories]
    for i in range(WARMUP):
        query(queries[i % len(queries)])
    return {"save": saves, "query": [query(text) for text in queries]}


# ---------------------------------------------------------------------- report

def report(results: dict[str, dict[str, list[float]]]) -> None:
    import statistics

    from bench.recall_speed import pct

    peer = results["peer"]
    print(f"{'system':<26} {'save p50':>9} {'save p95':>9} {'query p50':>10} {'query p95':>10} "
          f"{'save x':>7} {'query x':>8}")
    for name, lat in results.items():
        ratio = {op: statistics.median(peer[op]) / statistics.median(lat[op])
                 for op in ("save", "query")}
        print(f"{name:<26} {statistics.median(lat['save']):>9.2f} {pct(lat['save'], 0.95):>9.2f} "
              f"{statistics.median(lat['query']):>10.2f} {pct(lat['query'], 0.95):>10.2f} "
              f"{ratio['save']:>6.2f}x {ratio['query']:>7.2f}x")
    print("ms; x = the peer's p50 over the row's (targets for syncd, MiniLM: save >= 3x, "
          "query >= 2x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--memories", type=int, default=2000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--peer-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer_child:
        peer_child()
        return
    import random

    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # bench/http.py
    sys.path.insert(0, str(ROOT))
    from bench.recall_speed import dense_workload

    memories, queries = dense_workload(random.Random(11), args.memories, args.queries)
    results = {"peer": run_peer(memories, queries),
               "syncd (MiniLM, HTTP)": run_syncd(memories, queries, None),
               "syncd (hashing, HTTP)": run_syncd(memories, queries, "hashing")}
    report(results)


if __name__ == "__main__":
    main()

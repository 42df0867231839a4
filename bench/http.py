"""HTTP API speed: requests/s and p50/p95 of the daemon's query and save routes over real
loopback HTTP with 1 and 16 concurrent clients, against the same calls made in-process.

The server is the real app (``create_app`` behind an ``AppRunner``, as the daemon runs it) in a
subprocess of its own, so the load-generating client does not share its CPU: this script
re-runs itself with ``--serve``, which fills a store, prints its port and serves until its stdin
closes. Both processes fill an identical 10,000-memory store (``fill`` from recall_speed.py,
same seed) and derive the same query texts (``related_queries``); vectors come from the
TableEmbedder, so query embedding is excluded. Saves carry unique content per request (the
table embedder makes their vectors on demand, on both sides alike). The in-process baseline
(``await store.recall.query(...)`` / ``await store.memories.save(...)``, 1 client) runs in this
process on its own identically filled store while the server sits idle; HTTP overhead = p50(HTTP, 1 client) −
p50(in-process), target ≤ 1 ms.

Mixed section (issue 36, point 4): a real ``syncd run`` daemon (default all-MiniLM-L6-v2,
port 0, a temporary HOME) on a store of ``--mixed-memories`` memories saved through it, then
``--clients`` concurrent keep-alive clients sending a seeded mix of 55 % saves (one memory each:
a text of the recall eval's corpus made unique, ~34 tokens) and 45 % queries (the eval's
queries, ~14 tokens); the store is filled with the corpus texts likewise. ``--baseline TREE`` runs the
same daemon from another checkout (e.g. main before a change)
on a copy of the same store, alternated with this tree's (baseline, this, this, baseline, …),
so both see the same minutes. Each row gives req/s, save and query p50/p95, and the CPU each
request cost the daemon (utime + stime from /proc, its embedding child process included) and
the load-generating client.

    .venv/bin/python bench/http.py [--quick] [--mixed | --no-mixed] [--baseline /work/main]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# This file is named http.py: take bench/ off the path so ``import http`` finds the stdlib.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
from aiohttp import web  # noqa: E402

from bench.memory import Daemon, children  # noqa: E402
from bench.recall_speed import TableEmbedder, fill, pct, related_queries, words  # noqa: E402
from local_store import Store  # noqa: E402
from syncd.http import create_app  # noqa: E402

TOKEN = "bench-token-0123456789abcdef"
QUERY = "/v1/agent/memory/query"
SAVE = "/v1/agent/memory/tools/save_memory"
WARMUP = 50
SEED = 7
REALMS = ("billing", "web", "ml")


@contextlib.asynccontextmanager
async def filled_store(size: int, pool: int) -> AsyncIterator[tuple[Store, list[str]]]:
    """A store of ``size`` memories and ``pool`` query texts; identical in every process."""
    rng = random.Random(SEED)
    embedder = TableEmbedder()
    with tempfile.TemporaryDirectory() as tmp:
        store = await Store.open(Path(tmp), embedder=embedder)  # type: ignore[arg-type]
        try:
            await fill(store, size, rng, 0)
            yield store, await related_queries(store, embedder, rng, pool)
        finally:
            await store.close()


def save_args(tag: str, n: int) -> list[dict[str, str]]:
    """``n`` save_memory bodies with unique content (``tag`` keeps phases apart)."""
    rng = random.Random(f"{SEED}-{tag}")
    return [{"content": f"{words(rng, rng.randint(12, 30))} (bench {tag} {i})",
             "realm": rng.choice(REALMS)} for i in range(n)]


# ---------------------------------------------------------------------- server (subprocess)

async def serve(size: int, pool: int) -> None:
    async with filled_store(size, pool) as (store, queries):
        runner = web.AppRunner(create_app(store, token=TOKEN), access_log=None,
                               handle_signals=False)
        await runner.setup()
        try:
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            print(json.dumps({"port": runner.addresses[0][1], "queries": queries}), flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until EOF
        finally:
            await runner.cleanup()


# ---------------------------------------------------------------------- client

Stats = tuple[list[float], float]  # per-request latencies (ms), wall time (s)


async def drive(call: Callable[[int], Awaitable[None]], n: int, clients: int) -> Stats:
    """``n`` calls from ``clients`` tasks, each looping on the next index until none are left."""
    indices = iter(range(n))
    lat: list[float] = []

    async def worker() -> None:
        for i in indices:
            t = time.perf_counter()
            await call(i)
            lat.append((time.perf_counter() - t) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    return lat, time.perf_counter() - started


async def http_run(url: str, route: str, bodies: list[bytes], warm: list[bytes],
                   clients: int) -> Stats:
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:

        def caller(payloads: list[bytes]) -> Callable[[int], Awaitable[None]]:
            async def call(i: int) -> None:
                async with session.post(url + route, data=payloads[i]) as resp:
                    body = await resp.read()
                    if resp.status != 200:
                        raise RuntimeError(f"{route}: HTTP {resp.status}: {body[:300]!r}")
            return call

        await drive(caller(warm), len(warm), clients)  # opens all `clients` connections
        return await drive(caller(bodies), len(bodies), clients)


async def in_process(store: Store, queries: list[str], n: int) -> dict[str, Stats]:
    def recall(texts: list[str]) -> Callable[[int], Awaitable[None]]:
        async def call(i: int) -> None:
            await store.recall.query({"query": texts[i % len(texts)]})
        return call

    def save(args: list[dict[str, str]]) -> Callable[[int], Awaitable[None]]:
        async def call(i: int) -> None:
            await store.memories.save(args[i])
        return call

    out: dict[str, Stats] = {}
    await drive(recall(queries[-WARMUP:]), WARMUP, 1)
    out[QUERY] = await drive(recall(queries), n, 1)
    await drive(save(save_args("local-warm", WARMUP)), WARMUP, 1)
    out[SAVE] = await drive(save(save_args("local", n)), n, 1)
    return out


async def measure(size: int, n1: int, n16: int) -> tuple[list[tuple[str, ...]], list[str]]:
    pool = max(n1, n16)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(HERE / "http.py"), "--serve", f"{size},{pool}",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=1 << 26)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        async with filled_store(size, pool) as (store, queries):
            line = await proc.stdout.readline()  # the server fills its store meanwhile
            if not line:
                raise RuntimeError(f"server exited before serving (code {await proc.wait()})")
            ready = json.loads(line)
            if ready["queries"] != queries:
                raise RuntimeError("server and client derived different query texts")
            local = await in_process(store, queries, n1)  # the server is idle now
        url = f"http://127.0.0.1:{ready['port']}"
        remote: dict[tuple[str, int], Stats] = {}
        for route in (QUERY, SAVE):  # queries first: the saves grow the store
            for clients, n in ((1, n1), (16, n16)):
                if route == QUERY:
                    payload = [{"query": queries[i % len(queries)]} for i in range(n)]
                    warm = [{"query": q} for q in queries[-WARMUP:]]
                else:
                    payload = save_args(f"http-{clients}", n)
                    warm = save_args(f"http-{clients}-warm", WARMUP)
                remote[route, clients] = await http_run(
                    url, route, [json.dumps(b).encode() for b in payload],
                    [json.dumps(b).encode() for b in warm], clients)
    finally:
        if proc.returncode is None:
            proc.stdin.close()
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()

    rows: list[tuple[str, ...]] = []
    for route in (QUERY, SAVE):
        for clients in (1, 16):
            rows.append(_row(route, str(clients), remote[route, clients],
                             "HTTP, server in subprocess"))
        name = "store.recall" if route == QUERY else "store.save"
        rows.append(_row(route, "1", local[route], f"in-process baseline ({name})"))
    lines = []
    for route in (QUERY, SAVE):
        http_p50 = statistics.median(remote[route, 1][0])
        local_p50 = statistics.median(local[route][0])
        overhead = http_p50 - local_p50
        verdict = "met" if overhead <= 1.0 else "MISSED"
        lines.append(f"HTTP overhead {route}: p50 {http_p50:.2f} − {local_p50:.2f} = "
                     f"{overhead:.2f} ms (target ≤ 1 ms p50: {verdict})")
    return rows, lines


def _row(route: str, clients: str, stats: Stats, note: str) -> tuple[str, ...]:
    lat, wall = stats
    return (route, clients, f"{len(lat):,}", f"{len(lat) / wall:,.0f}",
            f"{statistics.median(lat):.2f}", f"{pct(lat, 0.95):.2f}", note)


# ---------------------------------------------------------------------- mixed, real daemon

SAVE_SHARE = 0.55
SAVE_MANY = "/v1/agent/memory/tools/save_memories"


def corpus() -> tuple[list[str], list[str]]:
    """The recall eval's memory texts and queries (bench/data/recall_corpus.json)."""
    data = json.loads((HERE / "data" / "recall_corpus.json").read_text())
    return [m["content"] for m in data["memories"]], [q["query"] for q in data["queries"]]


def mixed_ops(n: int, seed: str) -> list[tuple[str, bytes]]:
    """``n`` (route, body) pairs: 55 % saves of an eval memory's text made unique, 45 % eval
    queries, in a seeded order."""
    memories, queries = corpus()
    rng = random.Random(seed)
    ops = []
    for i in range(n):
        if rng.random() < SAVE_SHARE:
            content = f"{rng.choice(memories)} [{seed}-{i}]"
            ops.append((SAVE, json.dumps({"content": content}).encode()))
        else:
            ops.append((QUERY, json.dumps({"query": rng.choice(queries)}).encode()))
    return ops


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` and of its live child processes (the daemon's embedding
    process: its CPU is the daemon's work)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return own + sum(cpu_seconds(kid) for kid in children(pid))


async def mixed_load(port: int, token: str, ops: list[tuple[str, bytes]], warm: int,
                     clients: int, pid: int) -> tuple[dict[str, list[float]], float, float, float]:
    """Latencies (ms) per route, the wall time, the daemon's (``pid``) and this process's CPU
    seconds of ``ops[warm:]`` from ``clients`` tasks."""
    url = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    lat: dict[str, list[float]] = {QUERY: [], SAVE: []}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients),
                                     headers=headers) as session:
        async def run(part: list[tuple[str, bytes]], keep: bool) -> float:
            todo = iter(part)

            async def worker() -> None:
                for route, body in todo:
                    t = time.perf_counter()
                    async with session.post(url + route, data=body) as resp:
                        data = await resp.read()
                        if resp.status != 200:
                            raise RuntimeError(f"{route}: HTTP {resp.status}: {data[:300]!r}")
                    if keep:
                        lat[route].append((time.perf_counter() - t) * 1000)

            started = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(clients)))
            return time.perf_counter() - started

        await run(ops[:warm], False)  # opens the connections, loads the model
        cpu, client = cpu_seconds(pid), time.process_time()
        wall = await run(ops[warm:], True)
        cpu, client = cpu_seconds(pid) - cpu, time.process_time() - client
    return lat, wall, cpu, client


def filled_data(home: Path, memories: int, model: str) -> Path:
    """A data directory holding ``memories`` eval memory texts (each made unique) saved through
    this tree's daemon."""
    texts = corpus()[0]
    home.mkdir()
    daemon = Daemon(home, ROOT, 0, False, model)
    try:
        for start in range(0, memories, 100):
            daemon.post(SAVE_MANY, {"memories": [
                {"content": f"{texts[i % len(texts)]} [fill-{i}]"}
                for i in range(start, min(memories, start + 100))]})
    finally:
        daemon.stop()
    return home / "data"


def mixed_once(tree: Path, data: Path, clients: int, n: int, seed: str,
               model: str = "all-MiniLM-L6-v2") -> tuple[str, ...]:
    with tempfile.TemporaryDirectory(prefix="syncd-httpmix-") as tmp:
        home = Path(tmp)
        shutil.copytree(data, home / "data")
        daemon = Daemon(home, tree, 0, False, model)
        try:
            ops = mixed_ops(WARMUP + n, seed)
            lat, wall, cpu, client = asyncio.run(mixed_load(
                daemon.port, daemon.token, ops, WARMUP, clients, daemon.proc.pid))
        finally:
            daemon.stop()
    done = len(lat[SAVE]) + len(lat[QUERY])
    return (f"{clients}", f"{done:,}", f"{done / wall:,.0f}",
            f"{statistics.median(lat[SAVE]):.1f}", f"{pct(lat[SAVE], 0.95):.1f}",
            f"{statistics.median(lat[QUERY]):.1f}", f"{pct(lat[QUERY], 0.95):.1f}",
            f"{cpu * 1000 / done:.2f}", f"{client * 1000 / done:.2f}",
            f"{(cpu + client) / wall / (os.cpu_count() or 1) * 100:.0f} %")


def mixed(args: argparse.Namespace) -> None:
    memories, n = (300, 600) if args.quick else (args.mixed_memories, args.mixed_requests)
    minilm = "all-MiniLM-L6-v2"
    trees: list[tuple[str, Path, str]] = [("this tree", ROOT, minilm)]
    if args.baseline is not None:
        trees = [("baseline", args.baseline.resolve(), minilm), *trees]
    if args.floor:  # everything but the model: this tree's daemon with the hashing embedder
        trees.append(("hashing floor", ROOT, "hashing"))
    started = time.perf_counter()
    rows: list[tuple[str, ...]] = []
    with tempfile.TemporaryDirectory(prefix="syncd-httpmix-fill-") as tmp:
        data = {model: filled_data(Path(tmp) / model, memories, model)
                for model in {model for _, _, model in trees}}
        for rnd in range(args.rounds):
            order = trees if rnd % 2 == 0 else trees[::-1]  # A B, B A, …: the minutes even out
            for clients in args.clients:
                for name, tree, model in order:
                    # Every daemon sees the same requests: the seed names the round, not the tree.
                    row = mixed_once(tree, data[model], clients, n, f"r{rnd}-c{clients}", model)
                    rows.append((name, str(rnd + 1), *row))
    head = ("code", "round", "clients", "requests", "req/s", "save p50", "save p95",
            "query p50", "query p95", "daemon CPU ms/req", "client CPU ms/req", "CPU busy")
    load1, load5, _ = os.getloadavg()
    print(f"\nmixed load on a real `syncd run` (all-MiniLM-L6-v2): {memories:,} memories, "
          f"{SAVE_SHARE:.0%} saves / {1 - SAVE_SHARE:.0%} queries, {WARMUP} warm-up requests; "
          f"latencies in ms; cpus={os.cpu_count()} loadavg(1m,5m)={load1:.2f},{load5:.2f}")
    if args.baseline is not None:
        print(f"baseline = {args.baseline}")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, tuple("-" * w for w in widths), *rows]:
        print(" | ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    for clients in args.clients:
        mine = [r for r in rows if r[0] == "this tree" and r[2] == str(clients)]
        rate = statistics.median(float(r[4].replace(",", "")) for r in mine)
        save = statistics.median(float(r[5]) for r in mine)
        query = statistics.median(float(r[7]) for r in mine)
        line = (f"{clients} clients, this tree (median of rounds): {rate:,.0f} req/s, save p50 "
                f"{save:.1f} ms, query p50 {query:.1f} ms")
        base = [r for r in rows if r[0] == "baseline" and r[2] == str(clients)]
        if base:
            base_rate = statistics.median(float(r[4].replace(",", "")) for r in base)
            line += f"; ×{rate / base_rate:.2f} the baseline's {base_rate:,.0f} req/s"
        if clients == 8:
            met = rate >= 400 and save <= 15 and query <= 15
            line += f" (target ≥ 400 req/s, p50s ≤ 15 ms: {'met' if met else 'MISSED'})"
        print(line)
    print(f"mixed run time {time.perf_counter() - started:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description="HTTP API speed")
    parser.add_argument("--quick", action="store_true",
                        help="2,000 memories, 200/400 requests (1/16 clients)")
    parser.add_argument("--serve", default="", help=argparse.SUPPRESS)  # SIZE,POOL: server side
    parser.add_argument("--mixed", action=argparse.BooleanOptionalAction, default=None,
                        help="only the mixed section (--no-mixed: only the first)")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="another checkout whose daemon the mixed section alternates with")
    parser.add_argument("--clients", type=lambda v: [int(x) for x in v.split(",")],
                        default=[8], help="mixed section's client counts, e.g. 1,8")
    parser.add_argument("--rounds", type=int, default=2, help="mixed section's rounds")
    parser.add_argument("--floor", action="store_true",
                        help="mixed section: also this tree with the hashing embedder")
    parser.add_argument("--mixed-memories", type=int, default=1000)
    parser.add_argument("--mixed-requests", type=int, default=2000)
    args = parser.parse_args()
    if args.serve:
        size, pool = (int(x) for x in args.serve.split(","))
        asyncio.run(serve(size, pool))
        return
    if args.mixed is not False:
        mixed(args)
    if args.mixed:
        return
    size, n1, n16 = (2_000, 200, 400) if args.quick else (10_000, 2_000, 4_000)
    started = time.perf_counter()
    rows, lines = asyncio.run(measure(size, n1, n16))
    head = ("route", "clients", "requests", "req/s", "p50 ms", "p95 ms", "note")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    print(f"{size:,} memories; {WARMUP} warm-up requests per run; keep-alive aiohttp clients "
          "on 127.0.0.1; server in a subprocess (real create_app + AppRunner)")
    for r in [head, tuple("-" * w for w in widths), *rows]:
        print(" | ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    for line in lines:
        print(line)
    print(f"run time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()

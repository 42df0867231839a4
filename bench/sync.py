"""Sync benchmark: how soon a save on laptop A is recallable on laptop B, bootstrapping a fresh
laptop from a full plane, the idle pass, and pushing a big outbox — over real loopback HTTP.

    .venv/bin/python bench/sync.py [--quick] [--minilm] [--memories N] [--saves N] [--idle N]
                                   [--idle-secs S]

Every laptop is a real store, on 127.0.0.1 port 0 in temporary directories. What is measured:
  * save → recallable with the default settings (interval 30 s, jitter 0.1, long-poll on): a
    ``syncd hub`` process and laptops A and B as real daemon apps (``create_app`` with a
    ``SyncRunner``) in this process, started once; both hold their long-poll before the first
    save. Before each save a random pause of up to 1 s (untimed); the save goes through A's
    HTTP API (A pushes at once: the save pokes its runner), then B's recall is polled every
    20 ms until the memory is among its hits (B's held poll answered, B pulled). Also the polls
    B sent in all, and then what B sends in ``--idle-secs`` with nothing to do.
  * save → recallable through interval polling alone (long-poll off, as against Kyma): an
    in-process hub (``create_hub_app``) and daemon apps with interval 1 s and the configured
    default jitter 0.1. Before each save a random
    pause of up to one interval (untimed) makes saves land at every point of the schedule; the
    save goes through A's HTTP API, then B's recall (POST query) is polled every 20 ms until
    the memory is among its hits. B's schedule runs half an interval after A's (the mean phase
    of two daemons started independently) and, as the worst case, in phase with A's (B's pull
    on the tick of A's push just misses it). Baseline: the same save followed by a manual pass
    on A, a manual pass on B and one recall on B (``POST /v1/agent/sync/run``) — the sync path
    without the schedule's wait. HashingEmbedder by default; ``--minilm`` uses all-MiniLM-L6-v2
    (the default model) for the saves and the queries.
  * bootstrap: a ``syncd hub`` process (its own process and CPU, as in production) over a store
    holding N memories with 384-d embeddings (filled through ``Store.apply`` in imports of 1,000
    synthetic rows, untimed), then one ``SyncEngine.run_pass`` on a fresh laptop in this
    process: the paged pull (a bootstrap from no cursor counts as the first anti-entropy). rows/s = N /
    pass time; every pulled vector must be stored. Baseline: ``Store.apply`` of the same rows
    into a fresh store in-process (no HTTP, no JSON). Peak-RSS growth of the process too.
  * idle pass: then M passes on that laptop with nothing to do: p50/p95, requests and bytes per
    pass. Baseline: a ``GET /healthz`` round trip to the same hub.
  * push: N new local memories (``save_many``, untimed) on that laptop, then the one pass that
    pushes them (and pulls the plane's feed after the push, as every pass does).
The bootstrap and push sections use HashingEmbedder stores (their vectors are synthetic or
already stored; no embedding happens inside the timed passes).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import resource
import secrets
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# bench/ holds http.py: take it off the path so aiohttp's ``import http`` finds the stdlib.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
from aiohttp import web  # noqa: E402

from bench.store import Clock, pct, synthetic_rows, words  # noqa: E402
from local_store import Embedder, HashingEmbedder, Store  # noqa: E402
from local_store.embed_minilm import MiniLMEmbedder  # noqa: E402
from syncd.config import DEFAULT_SYNC_INTERVAL_SECS, DEFAULT_SYNC_JITTER  # noqa: E402
from syncd.http import create_app  # noqa: E402
from syncd.hub.app import create_hub_app  # noqa: E402
from syncd.hub.tokens import TokenBook, create_token  # noqa: E402
from syncd.sync.engine import PassReport, SyncEngine, SyncOptions  # noqa: E402
from syncd.sync.plane import PlaneClient  # noqa: E402
from syncd.sync.runner import SyncRunner  # noqa: E402

INTERVAL_SECS = 1.0
POLL_SECS = 0.02
GIVE_UP_SECS = 30.0
FILL_ROWS = 1_000  # one import's worth
SAVE_BATCH = 1_000  # save_memories' limit
QUERY = "/v1/agent/memory/query"
SAVE = "/v1/agent/memory/tools/save_memory"
SYNC_RUN = "/v1/agent/sync/run"
HEADER = ("metric", "n", "p50", "p95", "value", "vs baseline", "target")
Row = tuple[str, str, str, str, str, str, str]


# ---------------------------------------------------------------------- the pieces

@dataclass
class Served:
    url: str
    token: str
    store: Store


@contextlib.asynccontextmanager
async def serve(app: web.Application, store: Store, token: str) -> AsyncIterator[Served]:
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield Served(f"http://127.0.0.1:{runner.addresses[0][1]}", token, store)
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def hub(root: Path, embedder: Embedder) -> AsyncIterator[Served]:
    """A hub; ``token`` is its write token (what laptops use)."""
    async with await Store.open(root, embedder=embedder, feed=True) as store:
        token = create_token(root, role="write", name="laptops")
        async with serve(create_hub_app(store, TokenBook(root)), store, token) as served:
            yield served


@contextlib.asynccontextmanager
async def daemon(root: Path, embedder: Embedder, plane: Served, *,
                 interval: float = INTERVAL_SECS, long_poll: bool = False,
                 ) -> AsyncIterator[tuple[Served, SyncRunner]]:
    """A laptop daemon app with its sync schedule (started by the caller)."""
    async with await Store.open(root, embedder=embedder) as store:
        model = embedder.model_id
        sync = SyncRunner.create(store, url=plane.url, token=plane.token,
                                 options=SyncOptions(plane_model=model, long_poll=long_poll),
                                 interval=interval, jitter=DEFAULT_SYNC_JITTER)
        token = secrets.token_urlsafe(24)
        try:
            async with serve(create_app(store, token=token, plane_model=model, sync=sync),
                             store, token) as served:
                yield served, sync
        finally:
            await sync.stop()


class Api:
    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session

    async def post(self, node: Served, path: str, body: dict[str, Any] | None = None) -> Any:
        async with self.session.post(node.url + path, json=body or {}, headers={
                "Authorization": f"Bearer {node.token}"}) as resp:
            if resp.status != 200:
                raise RuntimeError(f"{path}: HTTP {resp.status}: {(await resp.text())[:300]}")
            return await resp.json()

    async def recalled(self, node: Served, text: str, node_id: str) -> bool:
        answer = await self.post(node, QUERY, {"query": text, "limit": 5})
        return any(m["id"] == node_id and not m["fallback"] for m in answer["memories"])


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


# ---------------------------------------------------------------------- save → recallable

async def recallable(root: Path, embedder: Embedder, saves: int, phase: float,
                     rng: random.Random, forced: int = 0) -> tuple[list[float], list[float]]:
    """Seconds from each save on A to its recall on B (schedule only), then ``forced`` more
    with manual passes on A and B (the baseline)."""
    async with hub(root / "hub", embedder) as plane, \
            daemon(root / "a", embedder, plane) as (a, sync_a), \
            daemon(root / "b", embedder, plane) as (b, sync_b), \
            aiohttp.ClientSession() as session:
        api = Api(session)
        await sync_a.start()
        await asyncio.sleep(phase * INTERVAL_SECS)  # B's ticks this far after A's
        await sync_b.start()
        await asyncio.sleep(0.2)  # both first passes (with their anti-entropy) done
        scheduled = await timed_saves(api, a, b, saves, rng, f"{phase}", INTERVAL_SECS)
        manual: list[float] = []
        for i in range(forced):
            text = f"{words(rng, 12, 24)} (sync bench forced {i})"
            began = time.perf_counter()
            saved = await api.post(a, SAVE, {"content": text})
            for laptop in (a, b):
                report = await api.post(laptop, SYNC_RUN)
                if not report["ok"]:
                    raise RuntimeError(f"manual pass failed: {report['error']}")
            if not await api.recalled(b, text, saved["node_id"]):
                raise RuntimeError(f"forced save {i} not recallable on B after both passes")
            manual.append(time.perf_counter() - began)
        return scheduled, manual


async def timed_saves(api: Api, a: Served, b: Served, saves: int, rng: random.Random,
                      label: str, pause: float) -> list[float]:
    """Seconds from each save on A to its recall on B; a random pause of up to ``pause``
    seconds (untimed) before each save."""
    took: list[float] = []
    for i in range(saves):
        await asyncio.sleep(rng.uniform(0, pause))  # land anywhere in the cycle
        text = f"{words(rng, 12, 24)} (sync bench {label} {i})"
        began = time.perf_counter()
        saved = await api.post(a, SAVE, {"content": text})
        while not await api.recalled(b, text, saved["node_id"]):
            if time.perf_counter() - began > GIVE_UP_SECS:
                raise RuntimeError(f"save {i} not recallable on B after {GIVE_UP_SECS} s")
            await asyncio.sleep(POLL_SECS)
        took.append(time.perf_counter() - began)
    return took


async def held_polls(session: aiohttp.ClientSession, plane: Served) -> int:
    async with session.get(plane.url + "/v1/agent/status", headers={
            "Authorization": f"Bearer {plane.token}"}) as resp:
        return int((await resp.json())["long_poll"]["held"])


@dataclass
class Live:
    seconds: list[float]
    polls: int  # sent by B over the whole run
    run_secs: float
    idle_secs: float  # then a window with no saves:
    idle_polls: int  # B's long-polls in it
    idle_requests: int  # B's other requests in it (its scheduled passes)


async def live(root: Path, embedder: Embedder, saves: int, rng: random.Random,
               idle_secs: float) -> Live:
    """Save → recallable with the default settings through a ``syncd hub`` process, then
    ``idle_secs`` with nothing to do (what B sends meanwhile)."""
    async with hub_process(root / "hub", 0, 0, 0) as plane, \
            daemon(root / "a", embedder, plane, interval=DEFAULT_SYNC_INTERVAL_SECS,
                   long_poll=True) as (a, sync_a), \
            daemon(root / "b", embedder, plane, interval=DEFAULT_SYNC_INTERVAL_SECS,
                   long_poll=True) as (b, sync_b), \
            aiohttp.ClientSession() as session:
        api = Api(session)
        began = time.perf_counter()
        await sync_a.start()
        await sync_b.start()
        while await held_polls(session, plane) < 2:  # both first passes done, both held
            if time.perf_counter() - began > GIVE_UP_SECS:
                raise RuntimeError("the laptops never held their long-polls")
            await asyncio.sleep(POLL_SECS)
        took = await timed_saves(api, a, b, saves, rng, "live", 1.0)
        client = sync_b.engine.client
        polls, run_secs = client.polls, time.perf_counter() - began
        await asyncio.sleep(1.0)  # the last save's pass and the poll after it
        before = (client.polls, client.requests)
        await asyncio.sleep(idle_secs)
        return Live(took, polls, run_secs, idle_secs, client.polls - before[0],
                    client.requests - before[1])


# ---------------------------------------------------------------------- bootstrap, idle, push

@dataclass
class Timed:
    seconds: float
    report: PassReport
    rss_growth_mib: float


async def timed_pass(engine: SyncEngine) -> Timed:
    before = peak_rss_mib()
    began = time.perf_counter()
    report = await engine.run_pass("bench")
    seconds = time.perf_counter() - began
    if not report.ok:
        raise RuntimeError(f"pass failed: {report.error}")
    return Timed(seconds, report, peak_rss_mib() - before)


async def apply_baseline(root: Path, memories: int, seed: int, start_ns: int) -> float:
    """rows/s of in-process ``Store.apply`` of the bootstrap rows into a fresh store."""
    spent = 0.0
    async with await Store.open(root, embedder=HashingEmbedder()) as store:
        for offset in range(0, memories, FILL_ROWS):
            n = min(FILL_ROWS, memories - offset)
            rows = synthetic_rows(n, seed + offset, start_ns + offset * 1_000_000)
            began = time.perf_counter()
            await store.replication.apply(rows, [], model=store.embedder.model_id)
            spent += time.perf_counter() - began
    return memories / spent


@contextlib.asynccontextmanager
async def hub_process(root: Path, fill: int, seed: int, start_ns: int) -> AsyncIterator[Served]:
    """A ``syncd hub`` process (as in production: its own process, its own CPU) over a store
    filled here first with ``fill`` synthetic rows in imports of 1,000 (untimed)."""
    async with await Store.open(root, embedder=HashingEmbedder(), feed=True) as store:
        for offset in range(0, fill, FILL_ROWS):
            n = min(FILL_ROWS, fill - offset)
            rows = synthetic_rows(n, seed + offset, start_ns + offset * 1_000_000)
            await store.replication.apply(rows, [], model=store.embedder.model_id)
    token = create_token(root, role="write", name="laptops")
    env = {**os.environ, "SYNCD_EMBEDDING_MODEL": "hashing", "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "syncd", "hub", "--data-dir", str(root), "--listen",
        "127.0.0.1:0", env=env, stderr=asyncio.subprocess.PIPE)
    drain: asyncio.Future[bytes] | None = None
    try:
        assert proc.stderr is not None
        url = ""
        while not url:
            line = (await proc.stderr.readline()).decode()
            if not line:
                raise RuntimeError("syncd hub exited before it was ready")
            if "ready on " in line:
                url = line.split("ready on ", 1)[1].strip()
        drain = asyncio.ensure_future(proc.stderr.read())
        yield Served(url, token, store)
    finally:
        if proc.returncode is None:
            proc.terminate()
        await proc.wait()
        if drain is not None:
            await drain


async def plane_sections(root: Path, memories: int, idle: int) -> dict[str, Any]:
    embedder = HashingEmbedder()
    model = embedder.model_id
    seed, start_ns = 11, Clock().take(memories)
    out: dict[str, Any] = {"apply": await apply_baseline(root / "baseline", memories, seed,
                                                         start_ns)}
    async with hub_process(root / "plane", memories, seed, start_ns) as plane, \
            await Store.open(root / "fresh", embedder=embedder) as laptop:
        engine = SyncEngine(laptop, PlaneClient(plane.url, plane.token, timeout=120),
                            SyncOptions(plane_model=model))
        try:
            await engine.start()
            out["bootstrap"] = boot = await timed_pass(engine)
            stats = await laptop.maintenance.stats()
            vectors = await laptop.maintenance.indexed_vectors()
            if boot.report.pulled_nodes < memories or stats["memories"] != memories or \
                    vectors != memories:
                raise RuntimeError(f"bootstrap: {stats['memories']} memories, "
                                   f"{vectors} vectors, expected {memories}")
            out["idle"] = [await timed_pass(engine) for _ in range(idle)]
            async with aiohttp.ClientSession() as session:
                out["healthz"] = [await roundtrip(session, plane.url + "/healthz")
                                  for _ in range(idle)]
            rng = random.Random(5)
            for offset in range(0, memories, SAVE_BATCH):  # untimed
                batch = [{"content": f"{words(rng, 15, 40)} (local {offset + i})"}
                         for i in range(min(SAVE_BATCH, memories - offset))]
                await laptop.memories.save_many(batch)
            out["push"] = push = await timed_pass(engine)
            if push.report.pushed_nodes != memories or (await laptop.maintenance.stats())["outbox"]:
                raise RuntimeError(f"push: pushed {push.report.pushed_nodes} of {memories}")
        finally:
            await engine.close()
    return out


async def roundtrip(session: aiohttp.ClientSession, url: str) -> float:
    began = time.perf_counter()
    async with session.get(url) as resp:
        await resp.read()
    return time.perf_counter() - began


# ---------------------------------------------------------------------- report

def dur(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1000:.1f} ms"


def verdict(ok: bool) -> str:
    return "ok" if ok else "MISS"


def print_table(rows: list[Row]) -> None:
    widths = [max(len(r[i]) for r in [HEADER, *rows]) for i in range(len(HEADER))]
    aligns = ["<", ">", ">", ">", ">", ">", "<"]

    def line(r: Row) -> str:
        return " | ".join(f"{c:{a}{w}}" for c, a, w in zip(r, aligns, widths, strict=True))

    print(line(HEADER))
    print("-+-".join("-" * w for w in widths))
    for r in rows:
        print(line(r))


def latency_rows(found: Live, typical: list[float], worst: list[float],
                 manual: list[float]) -> list[Row]:
    base = statistics.median(manual)
    p50 = statistics.median(typical)
    live_p50, live_p95 = statistics.median(found.seconds), pct(found.seconds, 95)
    return [
        ("save → recallable on B, defaults (long-poll)", str(len(found.seconds)), dur(live_p50),
         dur(live_p95), verdict(live_p50 <= 0.5 and live_p95 <= 1.5),
         f"{live_p50 / base:.1f}x", "p50 <= 0.5 s, p95 <= 1.5 s"),
        ("interval 1 s, no long-poll (B ticks 0.5 s after A)", str(len(typical)), dur(p50),
         dur(pct(typical, 95)), verdict(p50 <= 1.5), f"{p50 / base:.1f}x", "p50 <= 1.5 s"),
        ("interval 1 s, no long-poll (same phase: worst)", str(len(worst)),
         dur(statistics.median(worst)), dur(pct(worst, 95)), "",
         f"{statistics.median(worst) / base:.1f}x", "(one more interval)"),
        ("baseline: save, sync/run A, sync/run B, recall", str(len(manual)), dur(base),
         dur(pct(manual, 95)), "", "1.0x", "the path without the schedule"),
    ]


def plane_rows(found: dict[str, Any], memories: int) -> list[Row]:
    apply, boot, push = found["apply"], found["bootstrap"], found["push"]
    boot_rate, push_rate = memories / boot.seconds, memories / push.seconds
    idle = [t.seconds for t in found["idle"]]
    health = found["healthz"]
    requests = statistics.mean(t.report.requests for t in found["idle"])
    size = statistics.mean(t.report.bytes_in + t.report.bytes_out for t in found["idle"])
    idle_ok = statistics.median(idle) <= 0.020 and requests == 1
    return [
        (f"bootstrap {memories:,} memories + vectors", f"{memories:,}", "", "",
         f"{boot_rate:,.0f} rows/s {verdict(boot_rate >= 5_000)}", f"{boot_rate / apply:.2f}x",
         ">= 5,000 rows/s"),
        ("idle pass (after sync)", str(len(idle)), dur(statistics.median(idle)),
         dur(pct(idle, 95)), f"{requests:.1f} req, {size:,.0f} B {verdict(idle_ok)}",
         f"{statistics.median(idle) / statistics.median(health):.1f}x",
         "p50 <= 20 ms, 1 small request"),
        ("baseline: GET /healthz on the hub", str(len(health)), dur(statistics.median(health)),
         dur(pct(health, 95)), "", "1.0x", "one HTTP round trip"),
        (f"push {memories:,} local memories (one pass)", f"{memories:,}", "", "",
         f"{push_rate:,.0f} rows/s", f"{push_rate / apply:.2f}x", "(no target)"),
        ("baseline: Store.apply in-process, 384-d", f"{memories:,}", "", "",
         f"{apply:,.0f} rows/s", "1.0x", "no HTTP, no JSON"),
    ]


def notes(found: dict[str, Any], embedder: str, held: Live) -> list[str]:
    boot, push = found["bootstrap"].report, found["push"].report
    return [
        f"save → recallable: {embedder} on both laptops; B's recall polled every "
        f"{POLL_SECS * 1000:.0f} ms (the p50 includes up to that much polling lag)",
        f"defaults: a `syncd hub` process (hashing model); B sent {held.polls} long-polls for "
        f"{len(held.seconds)} saves in {held.run_secs:.1f} s; then, idle for "
        f"{held.idle_secs:.0f} s, {held.idle_polls} long-polls (25 s each, and one after each "
        f"pass) and {held.idle_requests} other requests (its 30 s passes)",
        "bootstrap, idle and push: the hub is a `syncd hub` process; the laptop is this one",
        f"bootstrap pass: {boot.pull_pages} pull pages, anti-entropy {boot.anti_entropy}, "
        f"{boot.requests} requests, {boot.bytes_in / 2**20:.1f} MiB in, "
        f"{boot.took_ms / 1000:.2f} s; peak RSS grew {found['bootstrap'].rss_growth_mib:.0f} MiB",
        f"push pass: {push.push_requests} import requests ({push.push_splits} splits), "
        f"{push.requests} requests in all, {push.bytes_out / 2**20:.1f} MiB out, "
        f"{push.bytes_in / 2**20:.1f} MiB in ({push.pull_pages} pull pages before and after "
        f"the push, {push.pulled_nodes} rows applied from them), {push.took_ms / 1000:.2f} s; "
        f"peak RSS grew {found['push'].rss_growth_mib:.0f} MiB",
    ]


async def main(args: argparse.Namespace) -> int:
    started, load = time.perf_counter(), os.getloadavg()[0]
    embedder: Embedder = MiniLMEmbedder() if args.minilm else HashingEmbedder()
    if isinstance(embedder, MiniLMEmbedder):
        embedder.load()
    rng = random.Random(7)
    worst_saves = max(1, args.saves // 2)
    with tempfile.TemporaryDirectory(prefix="syncd-bench-sync-") as tmp:
        root = Path(tmp)
        held = await live(root / "live", embedder, args.saves, rng, args.idle_secs)
        typical, manual = await recallable(root / "typical", embedder, args.saves, 0.5, rng,
                                           forced=args.saves)
        worst, _ = await recallable(root / "worst", embedder, worst_saves, 0.0, rng)
        found = await plane_sections(root / "plane", args.memories, args.idle)
    mode = "quick" if args.quick else "full"
    print(f"syncd sync benchmark ({mode}: {args.saves} saves, {args.memories:,} memories, "
          f"{args.idle} idle passes; defaults: interval {DEFAULT_SYNC_INTERVAL_SECS:.0f} s with "
          f"long-poll; interval-only rows {INTERVAL_SECS:.0f} s; jitter {DEFAULT_SYNC_JITTER}; "
          f"save → recallable with {embedder.model_id}; SQLite {sqlite3.sqlite_version}, Python "
          f"{sys.version.split()[0]}; {os.cpu_count()} CPUs, load average at start {load:.2f})")
    print()
    print_table(latency_rows(held, typical, worst, manual) + plane_rows(found, args.memories))
    print()
    for note in notes(found, embedder.model_id, held):
        print(f"note: {note}")
    print(f"run time: {time.perf_counter() - started:.1f} s")
    return 0


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 500 memories, 2 saves, 10 idle passes")
    parser.add_argument("--minilm", action="store_true",
                        help="save → recallable with all-MiniLM-L6-v2 instead of hashing")
    parser.add_argument("--memories", type=int, help="bootstrap and push size (default 10000)")
    parser.add_argument("--saves", type=int, help="timed saves per phase (default 50)")
    parser.add_argument("--idle", type=int, help="idle passes (default 50)")
    parser.add_argument("--idle-secs", type=float,
                        help="seconds laptop B is watched idle on the default settings "
                             "(default 90; quick 5)")
    args = parser.parse_args(argv)
    quick = (500, 2, 10, 5.0)
    full = (10_000, 50, 50, 90.0)
    for name, q, f in zip(("memories", "saves", "idle", "idle_secs"), quick, full, strict=True):
        if getattr(args, name) is None:
            setattr(args, name, q if args.quick else f)
        minimum = 0 if name == "idle_secs" else 1
        if getattr(args, name) < minimum:
            parser.error(f"--{name.replace('_', '-')} must be >= {minimum}")
    return args


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse(sys.argv[1:]))))

"""Hub benchmark: the PostgreSQL hub (one or several ``syncd hub`` processes on one database)
against the SQLite hub — import throughput, paging the change feed, and bootstrapping a laptop
from a hub holding a million memories — over real loopback HTTP.

    .venv/bin/python bench/hub.py [--quick] [--rows N] [--bootstrap-rows N]

The bench starts its own PostgreSQL server (``tests/pgserver.py``, ``durable=True``: fsync and
synchronous commit on, as in production) and stops it at the end, also on errors and Ctrl-C;
without PostgreSQL binaries it exits 2. Every hub is a real ``syncd hub`` process (its own
process and CPU, hashing embedder, background re-embedding off: ``SYNCD_HUB_REEMBED_SECS=0``)
on 127.0.0.1 port 0; every database is fresh. What is measured:
  * import: ``IMPORTERS`` concurrent clients (this process, one aiohttp session) each posting
    batches of ``BATCH`` rows (no vectors, distinct ids; bodies encoded before the clock
    starts) to ``POST /v1/agent/memory/import`` until N rows in all landed; importer k posts
    to hub process k mod P. rows/s = N / wall time from the first request to the last answer;
    p50/p95 are per-batch round trips. On PostgreSQL with 1 and with 3 processes (the target:
    3 processes import at least twice as fast as 1), and on the SQLite hub (the baseline).
  * changes paging: right after each import, ``READERS`` concurrent readers each page the
    whole ingest feed (``GET …/changes?since=<until>&limit=2000`` from no cursor until
    ``has_more`` is false; every reader must see all N ids); reader j's page i comes from
    process (i + j) mod P. rows/s = rows delivered to all readers / wall time; p50/p95 per page.
  * bootstrap: a fresh database seeded in this process through ``PgHubStore.apply`` in
    transactions of ``SEED_BATCH`` rows, ``SEED_WORKERS`` at a time (no vectors; its rate is
    printed too), then one
    ``syncd hub`` process on it and a laptop — a real ``Store`` + ``SyncEngine`` over
    ``PlaneClient`` — in a child process of its own (``bench/hub.py --laptop …``), timing its
    first ``run_pass`` (the paged pull of everything). The laptop's peak RSS is read by the
    laptop process itself after the pass: ``VmHWM`` (its peak since exec), not
    ``getrusage(RUSAGE_SELF).ru_maxrss``, which on Linux starts at the parent's RSS at fork.
    Baseline: ``Store.apply`` of the same kind of rows into a fresh store in this process
    (no HTTP, no JSON), in the same batch size.
CPU seconds of the hub processes (``/proc/PID/stat``), of the PostgreSQL server (the postmaster
and all its backends, reaped ones included) and of the clients are printed per phase, to show
where the time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import resource
import shutil
import signal
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SELF = Path(__file__).resolve()
HERE = SELF.parent
ROOT = HERE.parent
# bench/ holds http.py: take it off the path so aiohttp's ``import http`` finds the stdlib.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
import msgspec  # noqa: E402

from bench.store import Clock, pct, synthetic_rows  # noqa: E402
from local_store import HashingEmbedder, Store  # noqa: E402
from protocol.rows import ChangesResponse, NodeRow  # noqa: E402
from syncd.sync.engine import SyncEngine, SyncOptions  # noqa: E402
from syncd.sync.plane import PlaneClient, UnreadableRow  # noqa: E402
from tests.pgserver import PgServer, PgServerError, find_bindir  # noqa: E402

IMPORTERS = 6
HUBS = 3
READERS = 3
PAGE = 2_000
BATCH = 500
SEED_BATCH = 10_000
SEED_WORKERS = 2
APPLY_BASELINE_ROWS = 50_000
IMPORT = "/v1/agent/memory/import"
CHANGES = "/v1/agent/memory/changes"
TICK = os.sysconf("SC_CLK_TCK")
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
HEADER = ("metric", "n", "p50", "p95", "value", "vs baseline", "target")
Row = tuple[str, str, str, str, str, str, str]
# CLOCK_MONOTONIC is system-wide: the laptop child gets the bench's start and prints on its clock.
STARTED = float(os.environ.get("BENCH_HUB_T0") or time.monotonic())


def progress(message: str) -> None:
    print(f"[{time.monotonic() - STARTED:7.1f} s] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- rows

def node_rows(n: int, seed: int, start_ns: int, origin: str) -> list[NodeRow]:
    """Remote rows as a laptop pushes them when the plane has no vector for them."""
    return synthetic_rows(n, seed, start_ns, vectors=False, origin=origin, step_ns=1_000)


@dataclass
class Workload:
    """The import workload, encoded once: ``bodies[b]`` holds ``ids[b]``."""
    bodies: list[bytes]
    ids: list[list[str]]

    @property
    def rows(self) -> int:
        return sum(len(i) for i in self.ids)


def workload(rows: int, batch: int) -> Workload:
    clock = Clock()
    bodies, ids = [], []
    for b, offset in enumerate(range(0, rows, batch)):
        n = min(batch, rows - offset)
        nodes = node_rows(n, 1_000 + b, clock.take(n), f"bench-importer-{b % IMPORTERS}")
        bodies.append(msgspec.json.encode({"memory_nodes": nodes, "memory_edges": []}))
        ids.append([str(node.id) for node in nodes])
    return Workload(bodies, ids)


# ---------------------------------------------------------------------- CPU accounting

def _stat(pid: int) -> list[str]:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text.rsplit(")", 1)[1].split()  # fields from the 3rd (state) on


def proc_cpu(pid: int, *, reaped: bool = False) -> float:
    """CPU seconds of one process (utime + stime), plus its reaped children's with ``reaped``;
    0 when it is gone."""
    try:
        f = _stat(pid)
    except (OSError, IndexError):
        return 0.0
    ticks = int(f[11]) + int(f[12]) + (int(f[13]) + int(f[14]) if reaped else 0)
    return ticks / TICK


def tree_cpu(root: int | None) -> float:
    """CPU seconds of a postmaster and all its backends, live or already reaped."""
    if root is None:
        return 0.0
    total = proc_cpu(root, reaped=True)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if int(_stat(int(entry.name))[1]) == root:
                total += proc_cpu(int(entry.name), reaped=True)
        except (OSError, IndexError, ValueError):
            continue  # exited while we looked
    return total


def self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Cpu:
    """CPU seconds spent during a phase, by whom."""
    wall: float = 0.0
    hubs: float | None = None
    postgres: float = 0.0
    client: float = 0.0

    def text(self) -> str:
        available = self.wall * (os.cpu_count() or 1)
        hubs = f"hubs {self.hubs:.1f}, " if self.hubs is not None else ""
        db = f"PostgreSQL {self.postgres:.1f}, " if self.postgres else ""
        busy = ((self.hubs or 0) + self.postgres + self.client) / available
        return (f"{self.wall:.2f} s wall; CPU s: {hubs}{db}clients {self.client:.1f} "
                f"(of {available:.1f} on {os.cpu_count()} CPUs: {busy:.0%} busy)")


class CpuMeter:
    def __init__(self, hubs: Sequence[HubProcess], postmaster: int | None) -> None:
        self.hubs, self.postmaster = hubs, postmaster
        self.began = time.perf_counter()
        self.start = self._sample()

    def _sample(self) -> tuple[float, float, float]:
        return (sum(proc_cpu(h.pid) for h in self.hubs), tree_cpu(self.postmaster), self_cpu())

    def stop(self, extra_client: float = 0.0) -> Cpu:
        end = self._sample()
        return Cpu(time.perf_counter() - self.began,
                   end[0] - self.start[0] if self.hubs else None,
                   end[1] - self.start[1], end[2] - self.start[2] + extra_client)


# ---------------------------------------------------------------------- hub processes

def _die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn: the child gets SIGTERM when this process dies, even by SIGKILL."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:
            os._exit(1)

    return preexec


def hub_env(home: Path) -> dict[str, str]:
    """No inherited SYNCD_* overrides, HOME and XDG dirs under ``home`` (no user config), the
    hashing embedder, no background re-embedding."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNCD_")}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"),
               XDG_DATA_HOME=str(home / ".local/share"), PYTHONPATH=str(ROOT),
               SYNCD_EMBEDDING_MODEL="hashing", SYNCD_HUB_REEMBED_SECS="0")
    return env


class HubProcess:
    """A running ``syncd hub``; its stderr is drained (a full pipe would stall it)."""

    def __init__(self, proc: asyncio.subprocess.Process, url: str, log: list[str]) -> None:
        self.proc, self.url, self.log = proc, url, log
        self.pid = proc.pid
        self._drain = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            self.log.append(line.decode(errors="replace"))
            del self.log[:-40]

    async def stop(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(30):
                    await self.proc.wait()
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                await self.proc.wait()
        await self._drain


async def start_hub(home: Path, where: Sequence[str]) -> HubProcess:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "syncd", "hub", *where, "--listen", "127.0.0.1:0",
        env=hub_env(home), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        preexec_fn=_die_with_parent())
    assert proc.stderr is not None
    log: list[str] = []
    try:
        async with asyncio.timeout(60):
            while True:
                line = (await proc.stderr.readline()).decode(errors="replace")
                if not line:
                    await proc.wait()
                    raise RuntimeError(f"syncd hub exited ({proc.returncode}) before it was "
                                       f"ready:\n{''.join(log)}")
                log.append(line)
                if "ready on " in line:
                    return HubProcess(proc, line.split("ready on ", 1)[1].strip(), log)
    except BaseException:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise


@contextlib.asynccontextmanager
async def hubs(home: Path, where: Sequence[str], count: int) -> AsyncIterator[list[HubProcess]]:
    started: list[HubProcess] = []
    try:
        for _ in range(count):
            started.append(await start_hub(home, where))
        yield started
    finally:
        for hub in started:
            await hub.stop()
    for hub in started:
        if hub.proc.returncode != 0:
            raise RuntimeError(f"syncd hub exited {hub.proc.returncode}:\n{''.join(hub.log)}")


async def new_token(home: Path, where: Sequence[str]) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "syncd", "hub", "token", "create", *where, "--role", "write",
        "--name", "bench", env=hub_env(home), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    async with asyncio.timeout(60):
        out, err = await communicate(proc)
    if proc.returncode != 0:
        raise RuntimeError(f"syncd hub token create: exit {proc.returncode}: {err.decode()}")
    return out.decode().strip()


async def communicate(proc: asyncio.subprocess.Process) -> tuple[bytes, bytes]:
    """``proc.communicate()``; a child still running when this fails or is cancelled (a
    timeout around it) is killed."""
    try:
        out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return out or b"", err or b""


# ---------------------------------------------------------------------- import and paging

@dataclass
class Run:
    """One timed phase: rows moved, wall seconds, per-request latencies, CPU by whom."""
    rows: int
    seconds: float
    latencies: list[float]
    cpu: Cpu = field(default_factory=Cpu)

    @property
    def rate(self) -> float:
        return self.rows / self.seconds


async def import_rows(session: aiohttp.ClientSession, urls: list[str], work: Workload,
                      meter: CpuMeter) -> Run:
    latencies: list[float] = []

    async def importer(k: int) -> None:
        url = urls[k % len(urls)] + IMPORT
        for b in range(k, len(work.bodies), IMPORTERS):
            began = time.perf_counter()
            async with session.post(url, data=work.bodies[b], headers={
                    "Content-Type": "application/json"}) as resp:
                body = await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"import: HTTP {resp.status}: {body[:300]!r}")
            latencies.append(time.perf_counter() - began)
            answer = json.loads(body)
            if answer["applied_nodes"] != len(work.ids[b]) or answer.get("row_errors"):
                raise RuntimeError(f"import batch {b}: {body[:300]!r}")

    began = time.perf_counter()
    await asyncio.gather(*(importer(k) for k in range(IMPORTERS)))
    seconds = time.perf_counter() - began
    return Run(work.rows, seconds, latencies, meter.stop())


class _Id(msgspec.Struct):
    id: str


class _Page(msgspec.Struct):
    """Only what a reader checks of a ``changes`` page (the rest is skipped, not decoded)."""
    memory_nodes: list[_Id]
    memory_edges: list[_Id]
    until: str
    has_more: bool = False


_page_decoder = msgspec.json.Decoder(_Page)


async def page_feed(session: aiohttp.ClientSession, urls: list[str], work: Workload,
                    meter: CpuMeter) -> Run:
    expected = {i for ids in work.ids for i in ids}
    latencies: list[float] = []

    async def reader(j: int) -> int:
        seen: list[str] = []
        since, page = "", 0
        while True:
            url = urls[(j + page) % len(urls)] + CHANGES
            page += 1
            began = time.perf_counter()
            async with session.get(url, params={"since": since, "limit": str(PAGE)}) as resp:
                body = await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"changes: HTTP {resp.status}: {body[:300]!r}")
            latencies.append(time.perf_counter() - began)
            decoded = _page_decoder.decode(body)
            seen += [n.id for n in decoded.memory_nodes]
            since = decoded.until
            if not decoded.has_more:
                break
        if len(seen) != len(expected) or set(seen) != expected:
            raise RuntimeError(f"reader {j}: {len(seen)} rows ({len(set(seen))} distinct), "
                               f"expected {len(expected)}")
        return len(seen)

    began = time.perf_counter()
    delivered = sum(await asyncio.gather(*(reader(j) for j in range(READERS))))
    seconds = time.perf_counter() - began
    return Run(delivered, seconds, latencies, meter.stop())


@dataclass
class Setup:
    name: str
    where: list[str]
    processes: int
    postmaster: int | None


async def import_and_page(home: Path, setup: Setup, work: Workload) -> tuple[Run, Run]:
    token = await new_token(home, setup.where)
    async with hubs(home, setup.where, setup.processes) as running, aiohttp.ClientSession(
            headers={"Authorization": f"Bearer {token}"},
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=600)) as session:
        urls = [h.url for h in running]
        progress(f"{setup.name}: importing {work.rows:,} rows ({len(work.bodies)} batches, "
                 f"{IMPORTERS} importers)")
        imported = await import_rows(session, urls, work, CpuMeter(running, setup.postmaster))
        progress(f"{setup.name}: import {imported.rate:,.0f} rows/s ({imported.cpu.text()})")
        progress(f"{setup.name}: {READERS} readers paging the feed")
        paged = await page_feed(session, urls, work, CpuMeter(running, setup.postmaster))
        progress(f"{setup.name}: paging {paged.rate:,.0f} rows/s ({paged.cpu.text()})")
    return imported, paged


# ---------------------------------------------------------------------- bootstrap

@dataclass
class Boot:
    seed_rate: float
    seed_cpu: Cpu
    apply_rate: float
    seconds: float
    laptop: dict[str, Any]
    cpu: Cpu


async def seed(dsn: str, rows: int, batch: int, postmaster: int | None) -> tuple[float, Cpu]:
    """Fill the database in-process through ``PgHubStore.apply``, ``SEED_WORKERS`` transactions
    at a time (one prepares its rows while the other is in the database); returns rows/s of
    wall time, row generation included, and the CPU spent (read before the connections close).
    """
    from syncd.hub.pg import PgHubStore
    embedder = HashingEmbedder()
    clock = Clock()
    offsets = iter(range(0, rows, batch))
    done, began, last = 0, time.perf_counter(), time.perf_counter()
    store = await PgHubStore.open(dsn, embedder=embedder, pool_size=SEED_WORKERS + 1,
                                  follow=False, load_index=False)
    meter = CpuMeter([], postmaster)

    async def worker() -> None:
        nonlocal done, last
        for offset in offsets:
            n = min(batch, rows - offset)
            nodes = node_rows(n, 7_000_000 + offset, clock.take(n), "bench-seed")
            result = await store.apply(nodes, [], model=embedder.model_id)
            if result.applied_nodes != n:
                raise RuntimeError(f"seed: applied {result.applied_nodes} of {n}")
            done += n
            if time.perf_counter() - last >= 10:
                last = time.perf_counter()
                progress(f"seeding: {done:,} of {rows:,} rows, "
                         f"{done / (last - began):,.0f} rows/s")

    try:
        await asyncio.gather(*(worker() for _ in range(SEED_WORKERS)))
        cpu = meter.stop()
    finally:
        await store.close()
    return rows / cpu.wall, cpu


async def apply_baseline(root: Path, rows: int, batch: int) -> float:
    """rows/s of in-process ``Store.apply`` of the same kind of rows into a fresh store."""
    clock = Clock()
    spent = 0.0
    async with await Store.open(root, embedder=HashingEmbedder()) as store:
        for offset in range(0, rows, batch):
            n = min(batch, rows - offset)
            nodes = node_rows(n, 9_000_000 + offset, clock.take(n), "bench-baseline")
            began = time.perf_counter()
            result = await store.replication.apply(nodes, [], model=store.embedder.model_id)
            spent += time.perf_counter() - began
            if result.applied_nodes != n:
                raise RuntimeError(f"baseline: applied {result.applied_nodes} of {n}")
    return rows / spent


async def bootstrap(root: Path, pg: PgServer, rows: int, batch: int, baseline_rows: int,
                    ) -> Boot:
    progress(f"baseline: Store.apply of {baseline_rows:,} rows in-process")
    apply_rate = await apply_baseline(root / "baseline", baseline_rows, batch)
    progress(f"baseline: {apply_rate:,.0f} rows/s")
    dsn = pg.create_database("bootstrap")
    progress(f"seeding PostgreSQL with {rows:,} memories ({batch:,} a transaction)")
    seed_rate, seed_cpu = await seed(dsn, rows, batch, pg.pid)
    progress(f"seeded: {seed_rate:,.0f} rows/s ({seed_cpu.text()})")
    where = ["--store", dsn]
    token = await new_token(root, where)
    async with hubs(root, where, 1) as running:
        progress(f"bootstrap: laptop pulling {rows:,} memories from {running[0].url}")
        meter = CpuMeter(running, pg.pid)
        laptop = await run_laptop(running[0].url, token, root / "laptop", rows)
        cpu = meter.stop(laptop["cpu_s"])
    cpu.wall = laptop["seconds"]  # the pass itself, not the laptop's start-up
    progress(f"bootstrap: {rows / laptop['seconds']:,.0f} rows/s, laptop peak RSS "
             f"{laptop['peak_rss_mib']:.0f} MiB")
    return Boot(seed_rate, seed_cpu, apply_rate, laptop["seconds"], laptop, cpu)


async def run_laptop(url: str, token: str, root: Path, rows: int) -> dict[str, Any]:
    """The laptop in a child process of its own; its result is one JSON line on stdout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNCD_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(SELF), "--laptop", url, str(root), str(rows),
        env={**env, "BENCH_HUB_TOKEN": token, "BENCH_HUB_T0": repr(STARTED)},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, preexec_fn=_die_with_parent())  # stderr: ours
    out, _ = await communicate(proc)
    if proc.returncode != 0:
        raise RuntimeError(f"the laptop process exited {proc.returncode}")
    answer: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return answer


class CountingPlane(PlaneClient):
    """``PlaneClient`` that counts the rows it fetched (for progress lines)."""
    fetched = 0

    async def changes(self, since: str | None, realm: str | None, limit: int | None,
                      exclude_origin: str | None = None, *,
                      unreadable: list[UnreadableRow] | None = None) -> ChangesResponse:
        page = await super().changes(since, realm, limit, exclude_origin,
                                     unreadable=unreadable)
        self.fetched += len(page.memory_nodes)
        return page


def peak_rss_mib() -> float:
    """This process's peak resident set since its exec: ``VmHWM`` of /proc/self/status.

    Not ``getrusage(RUSAGE_SELF).ru_maxrss``: Linux carries the pre-exec image's peak across
    exec, so in a child that number starts at the parent's RSS at fork (printed apart)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024  # kB
    raise RuntimeError("no VmHWM in /proc/self/status")


def maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


async def laptop_main(url: str, root: Path, rows: int) -> int:
    """``bench/hub.py --laptop URL DIR ROWS``: a fresh laptop store and one sync pass."""
    embedder = HashingEmbedder()
    client = CountingPlane(url, os.environ["BENCH_HUB_TOKEN"], timeout=600)
    async with await Store.open(root, embedder=embedder) as store:
        engine = SyncEngine(store, client, SyncOptions(plane_model=embedder.model_id))
        try:
            await engine.start()
            rss_before, cpu_before = peak_rss_mib(), self_cpu()
            began = time.perf_counter()

            async def report_progress() -> None:
                while True:
                    await asyncio.sleep(10)
                    progress(f"laptop: {client.fetched:,} rows fetched after "
                             f"{time.perf_counter() - began:.1f} s, peak RSS "
                             f"{peak_rss_mib():.0f} MiB")

            ticker = asyncio.create_task(report_progress())
            try:
                report = await engine.run_pass("bench")
            finally:
                ticker.cancel()
            seconds = time.perf_counter() - began
            cpu = self_cpu() - cpu_before
        finally:
            await engine.close()
        stats = await store.maintenance.stats()
    if not report.ok:
        raise RuntimeError(f"bootstrap pass failed: {report.error}")
    if stats["memories"] != rows or report.pulled_nodes != rows:
        raise RuntimeError(f"bootstrap: pulled {report.pulled_nodes}, the laptop holds "
                           f"{stats['memories']} memories, expected {rows}")
    print(json.dumps({"seconds": seconds, "cpu_s": cpu, "peak_rss_mib": peak_rss_mib(),
                      "ru_maxrss_mib": maxrss_mib(),
                      "rss_before_mib": rss_before, "pages": report.pull_pages, "rows": rows,
                      "requests": report.requests, "mib_in": report.bytes_in / 2**20}))
    return 0


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


def timed_row(name: str, run: Run, value: str, ratio: float, target: str) -> Row:
    return (name, f"{run.rows:,}", dur(statistics.median(run.latencies)),
            dur(pct(run.latencies, 95)), value, f"{ratio:.2f}x", target)


def table(found: dict[str, Run], boot: Boot, rows: int, boot_rows: int,
          baseline_rows: int) -> list[Row]:
    one, three, lite = found["import pg1"], found["import pg3"], found["import sqlite"]
    scale = three.rate / one.rate
    p1, p3, plite = found["paging pg1"], found["paging pg3"], found["paging sqlite"]
    boot_rate = boot_rows / boot.seconds
    return [
        timed_row("import, PostgreSQL, 1 hub process", one, f"{one.rate:,.0f} rows/s",
                  one.rate / lite.rate, "(1); vs the SQLite hub"),
        timed_row(f"import, PostgreSQL, {HUBS} hub processes", three,
                  f"{three.rate:,.0f} rows/s = {scale:.2f}x (1) {verdict(scale >= 2)}",
                  three.rate / lite.rate, ">= 2x (1)"),
        timed_row("baseline: import, SQLite hub, 1 process", lite, f"{lite.rate:,.0f} rows/s",
                  1.0, "the comparison point"),
        timed_row("changes paging, PostgreSQL, 1 hub process", p1, f"{p1.rate:,.0f} rows/s",
                  p1.rate / plite.rate, "(no target)"),
        timed_row(f"changes paging, PostgreSQL, {HUBS} hub processes", p3,
                  f"{p3.rate:,.0f} rows/s = {p3.rate / p1.rate:.2f}x (1 process)",
                  p3.rate / plite.rate, "(no target)"),
        timed_row("baseline: changes paging, SQLite hub", plite, f"{plite.rate:,.0f} rows/s",
                  1.0, f"{READERS} readers, limit {PAGE}"),
        ("seed PostgreSQL in-process (PgHubStore.apply)", f"{boot_rows:,}", "", "",
         f"{boot.seed_rate:,.0f} rows/s", f"{boot.seed_rate / boot.apply_rate:.2f}x",
         f"(no target) {SEED_WORKERS} transactions at a time"),
        ("bootstrap a laptop from a PostgreSQL hub", f"{boot_rows:,}", "", "",
         f"{boot_rate:,.0f} rows/s {verdict(boot_rate >= 10_000)}",
         f"{boot_rate / boot.apply_rate:.2f}x", ">= 10,000 rows/s"),
        ("laptop peak RSS (bootstrap, VmHWM)", f"{boot_rows:,}", "", "",
         f"{boot.laptop['peak_rss_mib']:,.0f} MiB", "", "(no target)"),
        ("baseline: Store.apply in-process, no vectors", f"{baseline_rows:,}", "", "",
         f"{boot.apply_rate:,.0f} rows/s", "1.00x", "no HTTP, no JSON"),
    ]


def notes(found: dict[str, Run], boot: Boot, batch: int, seed_batch: int) -> list[str]:
    laptop = boot.laptop
    out = [f"import: {IMPORTERS} importers, batches of {batch} rows without vectors; p50/p95 "
           f"per batch; PostgreSQL durable (fsync on); fresh database or data dir per setup",
           f"changes: {READERS} readers, each paging the whole feed with limit {PAGE}; p50/p95 "
           f"per page; rows/s counts the rows delivered to all readers"]
    for key, label in (("import pg1", "import, PostgreSQL 1 process"),
                       ("import pg3", f"import, PostgreSQL {HUBS} processes"),
                       ("import sqlite", "import, SQLite hub"),
                       ("paging pg1", "paging, PostgreSQL 1 process"),
                       ("paging pg3", f"paging, PostgreSQL {HUBS} processes"),
                       ("paging sqlite", "paging, SQLite hub")):
        out.append(f"{label}: {found[key].cpu.text()}")
    out += [
        f"seeding (row generation included; {SEED_WORKERS} concurrent transactions of "
        f"{seed_batch:,} rows): {boot.seed_cpu.text()} (clients = this process)",
        f"bootstrap pass: {laptop['pages']} pull pages (~{laptop['rows'] / laptop['pages']:,.0f} "
        f"rows each: a page ends on a transaction boundary), {laptop['requests']} requests, "
        f"{laptop['mib_in']:.1f} MiB in; {boot.cpu.text()} (clients = the laptop process)",
        f"laptop process: peak RSS {laptop['peak_rss_mib']:.0f} MiB (VmHWM of the laptop "
        f"process, read by itself after the pass; {laptop['rss_before_mib']:.0f} MiB before "
        f"it, with the store open); its getrusage(RUSAGE_SELF).ru_maxrss says "
        f"{laptop['ru_maxrss_mib']:.0f} MiB, which includes this bench's RSS at fork time "
        f"(Linux keeps the pre-exec peak)",
    ]
    return out


async def run_all(pg: PgServer, args: argparse.Namespace, root: Path) -> int:
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    started, load = time.perf_counter(), os.getloadavg()[0]
    progress(f"encoding the import workload: {args.rows:,} rows in batches of {args.batch}")
    work = workload(args.rows, args.batch)
    found: dict[str, Run] = {}
    (root / "sqlite").mkdir()
    setups = [
        (Setup("SQLite hub", ["--data-dir", str(root / "sqlite")], 1, None), "sqlite"),
        (Setup("PostgreSQL, 1 process", ["--store", pg.create_database("import_1")], 1,
               pg.pid), "pg1"),
        (Setup(f"PostgreSQL, {HUBS} processes", ["--store", pg.create_database("import_3")],
               HUBS, pg.pid), "pg3"),
    ]
    for setup, key in setups:
        found[f"import {key}"], found[f"paging {key}"] = await import_and_page(root, setup,
                                                                               work)
    baseline_rows = min(APPLY_BASELINE_ROWS, args.bootstrap_rows)
    boot = await bootstrap(root, pg, args.bootstrap_rows, args.seed_batch, baseline_rows)
    version = pg.psql("SHOW server_version").strip()
    mode = "quick" if args.quick else "full"
    print(f"syncd hub benchmark ({mode}: {args.rows:,} import rows, {args.bootstrap_rows:,} "
          f"bootstrap rows; PostgreSQL {version} durable, SQLite {sqlite3.sqlite_version}, "
          f"Python {sys.version.split()[0]}; {os.cpu_count()} CPUs, load average {load:.2f} at "
          f"start, {os.getloadavg()[0]:.2f} at the end)")
    print()
    print_table(table(found, boot, args.rows, args.bootstrap_rows, baseline_rows))
    print()
    for note in notes(found, boot, args.batch, args.seed_batch):
        print(f"note: {note}")
    print(f"run time: {time.perf_counter() - started:.1f} s")
    return 0


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 3,000 import rows, 5,000 bootstrap rows")
    parser.add_argument("--rows", type=int, help="rows per import run (default 60000)")
    parser.add_argument("--bootstrap-rows", type=int,
                        help="memories the laptop bootstraps (default 1000000)")
    parser.add_argument("--laptop", nargs=3, metavar=("URL", "DIR", "ROWS"),
                        help=argparse.SUPPRESS)  # the laptop child process
    args = parser.parse_args(argv)
    quick = (3_000, 5_000)
    full = (60_000, 1_000_000)
    for name, q, f in zip(("rows", "bootstrap_rows"), quick, full, strict=True):
        if getattr(args, name) is None:
            setattr(args, name, q if args.quick else f)
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    args.batch = 250 if args.quick else BATCH
    args.seed_batch = 1_000 if args.quick else SEED_BATCH
    return args


def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.laptop is not None:
        url, root, rows = args.laptop
        return asyncio.run(laptop_main(url, Path(root), int(rows)))
    if find_bindir() is None:
        print("bench/hub.py: PostgreSQL binaries not found (install postgresql-15 or set "
              "SYNCD_PG_BINDIR); this benchmark needs a PostgreSQL server", file=sys.stderr)
        return 2
    progress("starting PostgreSQL (durable)")
    try:
        pg = PgServer.start(durable=True)
    except PgServerError as exc:
        print(f"bench/hub.py: {exc}", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="syncd-bench-hub-"))
    try:
        progress(f"PostgreSQL ready on port {pg.port}")
        return asyncio.run(run_all(pg, args, root))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("bench/hub.py: interrupted", file=sys.stderr)
        return 130
    finally:
        progress("stopping PostgreSQL")
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A Kyma plane's whole feed in one body: what pulling it costs a laptop in time and memory.

Kyma ignores ``limit`` and ``cursor`` and answers ``changes`` with everything (contract §4.3).
This writes such a body for N memories with 384-d vectors to a file (row by row, untimed),
serves it from a small real aiohttp server on 127.0.0.1 (``FileResponse``: the server holds
no copy), and runs one pass on a fresh laptop in this process:

  * spooled, as syncd pulls now (``syncd/sync/spool.py``): the body goes to a temporary file
    and is applied a batch at a time;
  * baseline, the same run: a client that decodes the body whole (``spool_from`` above its
    size), as syncd did before.

Each pass runs in a process of its own (peak RSS only ever grows), started once the server is
up; each row reports the pass time, rows/s and the growth of that process's peak RSS from
just before the pass (after its imports and opening its store), then the same after the first
recall. The store's in-RAM vector index holds N × 384 × 4 bytes once recall runs (it is what
makes recall fast): a pull with no room for its vectors drops the index and the first recall
rebuilds it from the store (``Shell.drop_index``), so the pass's peak and the index do not
add up; the table shows both, and the growth beyond the index. A second table breaks each pass down (Linux, glibc):
the peak growth before the first row is applied (download, and the spool's first read
through), SQLite's own heap at its highest (``sqlite3_memory_highwater``: page caches,
statements, FTS5's pending terms), and the free memory glibc's malloc still holds at the end
(``mallinfo2``: freed, not returned to the system).

    .venv/bin/python bench/one_body_pull.py [--memories N]    (default 100,000)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import ctypes.util
import itertools
import json
import random
import resource
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # bench/http.py
sys.path.insert(0, str(ROOT))

import msgspec  # noqa: E402
from aiohttp import web  # noqa: E402

from local_store import HashingEmbedder, Store  # noqa: E402
from protocol.rows import NodeRow  # noqa: E402
from syncd.sync.engine import SyncEngine, SyncOptions  # noqa: E402
from syncd.sync.plane import PlaneClient  # noqa: E402
from syncd.sync.spool import SPOOL_FROM, SPOOL_ROWS  # noqa: E402

DIM = 384
TARGET_MIB = 150


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def sqlite_highwater_mib(reset: bool = False) -> float | None:
    """SQLite's heap at its highest since the last reset (None: the library is not found)."""
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("sqlite3") or "libsqlite3.so.0")
    except OSError:
        return None
    lib.sqlite3_memory_highwater.restype = ctypes.c_int64
    return float(lib.sqlite3_memory_highwater(int(reset))) / 2**20


def malloc_free_mib() -> float | None:
    """Free bytes glibc's malloc holds in its arenas (None: not glibc ≥ 2.33)."""
    try:
        mallinfo2 = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _MallInfo2
    return float(mallinfo2().fordblks) / 2**20


Breakdown = tuple[float | None, float | None, float | None]  # before rows, SQLite, malloc free
# (pass seconds, its peak-RSS growth in MiB, breakdown, first recall's seconds, peak growth
# from before the pass to after that recall)
Outcome = tuple[float, float, Breakdown, float, float]


async def first_recall(store: Store, memories: int, before: float) -> tuple[float, float]:
    """(seconds, peak-RSS growth since ``before``) of the first recall after the pass — where
    an index the pull dropped is rebuilt (``Shell.drop_index``) — once the store says every
    vector is there to rank."""
    if (held := await store.maintenance.indexed_vectors()) != memories:
        raise RuntimeError(f"{held} vectors to rank, expected {memories}")
    began = time.perf_counter()
    await store.recall.query({"query": "release train note", "limit": 5})
    seconds = time.perf_counter() - began
    if len(store.index) != memories:
        raise RuntimeError(f"the index holds {len(store.index)} vectors, expected {memories}")
    return seconds, peak_rss_mib() - before


def watch_first_apply(store: Store, before: float, seen: list[float]) -> None:
    """Record in ``seen`` the peak growth when the first batch is applied (bench only)."""
    replication = store.replication
    for name in ("pull", "apply"):
        original = getattr(replication, name)

        async def first(*args: object, _original: object = original, **kwargs: object) -> object:
            if not seen:
                seen.append(peak_rss_mib() - before)
            return await _original(*args, **kwargs)  # type: ignore[operator]

        setattr(replication, name, first)


def body_rows(memories: int) -> Iterator[dict[str, object]]:
    """The plane's rows, one at a time (deterministic)."""
    rng = random.Random(3)
    for i in range(memories):
        stamp = f"2026-11-{1 + i % 28:02d}T00:00:{i % 60:02d}.{i:06d}Z"
        yield {"id": f"memory:{i:08d}", "labels": "Memory", "realm": "default",
               "memory_type": "fact", "content": f"note {i} about the release train",
               "tags": "", "importance": 0.5, "status": "active",
               "embedding": [round(rng.uniform(-0.1, 0.1), 6) for _ in range(DIM)],
               "created_at": stamp, "updated_at": stamp}


def write_body(path: Path, memories: int) -> int:
    """The plane's ``changes`` body, one row at a time; returns its size in bytes."""
    with path.open("w") as out:
        out.write('{"since":"1970-01-01T00:00:00Z","until":"2026-12-01T00:00:00+00:00",'
                  '"memory_nodes":[')
        for i, row in enumerate(body_rows(memories)):
            out.write(("," if i else "") + json.dumps(row, separators=(",", ":")))
        out.write('],"memory_edges":[]}')
    return path.stat().st_size


async def apply_only(root: Path, memories: int) -> Outcome:
    """``Outcome`` of ``Store.apply`` of the same rows in this process, ``SPOOL_ROWS`` at a
    time: what the store itself costs, without HTTP or JSON."""
    embedder = HashingEmbedder()
    async with await Store.open(root, embedder=embedder) as store:
        sqlite_highwater_mib(reset=True)
        before, spent = peak_rss_mib(), 0.0
        rows = body_rows(memories)
        while batch := [msgspec.convert(r, NodeRow) for r in itertools.islice(rows, SPOOL_ROWS)]:
            began = time.perf_counter()
            await store.replication.apply(batch, [], model=embedder.model_id)
            spent += time.perf_counter() - began
        growth = peak_rss_mib() - before
        breakdown = (0.0, sqlite_highwater_mib(), malloc_free_mib())
        recall = await first_recall(store, memories, before)
    return spent, growth, breakdown, *recall


@contextlib.asynccontextmanager
async def serving(body: Path) -> AsyncIterator[str]:
    async def changes(request: web.Request) -> web.StreamResponse:
        return web.FileResponse(body, headers={"Content-Type": "application/json"})

    async def settings(request: web.Request) -> web.Response:
        return web.json_response({"default_limit": 8})

    app = web.Application()
    app.router.add_get("/v1/agent/memory/changes", changes)
    app.router.add_get("/v1/agent/memory/settings", settings)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def one_pass(root: Path, url: str, spool_from: int, memories: int) -> Outcome:
    """``Outcome`` of one pass on a fresh laptop (in this process)."""
    embedder = HashingEmbedder()
    async with await Store.open(root, embedder=embedder) as store:
        client = PlaneClient(url, "token", timeout=300, spool_from=spool_from)
        engine = SyncEngine(store, client, SyncOptions(plane_model=embedder.model_id,
                                                       anti_entropy_secs=1e9))
        await engine.start()
        sqlite_highwater_mib(reset=True)
        before, first_apply = peak_rss_mib(), list[float]()
        watch_first_apply(store, before, first_apply)
        try:
            began = time.perf_counter()
            report = await engine.run_pass("bench")
            seconds = time.perf_counter() - began
        finally:
            await engine.close()
        if report.pulled_nodes != memories:
            raise RuntimeError(f"pulled {report.pulled_nodes} rows, expected {memories} "
                               f"({report.error})")
        growth = peak_rss_mib() - before
        if (client.spooled > 0) != (spool_from < 1 << 62):
            raise RuntimeError(f"spooled {client.spooled} bodies with spool_from {spool_from}")
        breakdown = (first_apply[0] if first_apply else None, sqlite_highwater_mib(),
                     malloc_free_mib())
        recall = await first_recall(store, memories, before)
    return seconds, growth, breakdown, *recall


async def in_child(root: Path, url: str, spool_from: int, memories: int) -> Outcome:
    """A pass in a process of its own; ``spool_from`` 0: ``apply_only`` instead."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--child", str(root), url, str(spool_from),
        "--memories", str(memories), stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"the pass failed (exit {proc.returncode})")
    seconds, growth, breakdown, recall_s, with_recall = json.loads(out)
    return (float(seconds), float(growth), tuple(breakdown),  # type: ignore[return-value]
            float(recall_s), float(with_recall))


async def main(memories: int) -> None:
    with tempfile.TemporaryDirectory(prefix="syncd-one-body-") as tmp:
        root = Path(tmp)
        size = await asyncio.to_thread(write_body, root / "changes.json", memories)
        async with serving(root / "changes.json") as url:
            spooled = await in_child(root / "spooled", url, min(SPOOL_FROM, size // 2),
                                     memories)
            whole = await in_child(root / "whole", url, 1 << 62, memories)
            applied = await in_child(root / "apply", url, 0, memories)
    index_mib = memories * DIM * 4 / 2**20
    print(f"one-body pull: {memories:,} memories with {DIM}-d vectors, a body of "
          f"{size / 2**20:,.0f} MiB (spooled from {min(SPOOL_FROM, size // 2) / 2**20:,.0f} MiB)")
    print()
    print(f"{'pull':<34}{'seconds':>9}{'rows/s':>10}{'peak RSS +MiB':>15}"
          f"{'1st recall s':>14}{'+MiB with it':>14}{'beyond index':>14}  target")
    passes = (("spooled (syncd now)", spooled), ("baseline: body decoded whole", whole),
              ("floor: Store.apply, no HTTP/JSON", applied))
    for name, (seconds, growth, _, recall_s, with_recall) in passes:
        target = f"<= {TARGET_MIB} MiB" if name.startswith("spooled") else ""
        print(f"{name:<34}{seconds:>9.1f}{memories / seconds:>10,.0f}{growth:>15,.0f}"
              f"{recall_s:>14.2f}{with_recall:>14,.0f}{with_recall - index_mib:>14,.0f}"
              f"  {target}")
    print()
    print(f"{'breakdown (MiB)':<34}{'peak + before rows':>20}{'SQLite heap max':>17}"
          f"{'malloc free at end':>20}")
    for name, (_, _, breakdown, _, _) in passes:
        print(f"{name:<34}" + "".join(f"{'–' if v is None else f'{v:,.0f}':>{w}}" for v, w in
                                      zip(breakdown, (20, 17, 20), strict=True)))
    print()
    print("note: the floor is the store's own apply of the same rows, 1,000 at a time, in a "
          "process of its own; the pull adds the difference")
    print(f"note: the vector index alone holds {index_mib:,.0f} MiB ({memories:,} × {DIM} × 4 "
          f"bytes); 'beyond index' is the growth with the first recall less that")
    print("note: 'peak RSS +MiB' is the pass alone; a pull with no room for its vectors drops "
          "the index and the first recall after it rebuilds it ('1st recall s', '+MiB with it')")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memories", type=int, default=100_000)
    parser.add_argument("--child", nargs=3, metavar=("DIR", "URL", "SPOOL_FROM"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        where, url, spool_from = args.child
        job = (apply_only(Path(where), args.memories) if int(spool_from) == 0
               else one_pass(Path(where), url, int(spool_from), args.memories))
        print(json.dumps(asyncio.run(job)))
    else:
        asyncio.run(main(args.memories))

"""A real hub (``create_hub_app`` over a real feed store, on a loopback port) and laptops
(a real store + ``SyncEngine``), optionally behind the fault-injecting proxy. No mocks."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from local_store import HashingEmbedder, Store
from syncd.config import HubConfig
from syncd.hub.app import create_hub_app
from syncd.hub.tokens import TokenBook, create_token
from syncd.sync.engine import PassReport, SyncEngine, SyncOptions
from syncd.sync.plane import PlaneClient

MODEL = HashingEmbedder().model_id
REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Hub:
    data_dir: Path
    cursor: str
    store: Store
    runner: web.AppRunner
    url: str
    token: str
    read_token: str

    async def close(self) -> None:
        await self.runner.cleanup()
        await self.store.close()


async def start_hub(data_dir: Path, cursor: str = "ingest", *, port: int = 0,
                    wall: Callable[[], int] | None = None) -> Hub:
    store = await Store.open(data_dir, embedder=HashingEmbedder(), feed=True,
                             **({"wall": wall} if wall else {}))
    token = await asyncio.to_thread(create_token, data_dir, role="write", name="laptops")
    read = await asyncio.to_thread(create_token, data_dir, role="read", name="reader")
    book = await asyncio.to_thread(TokenBook, data_dir)
    runner = web.AppRunner(create_hub_app(store, book, config=HubConfig(cursor=cursor)))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    bound = runner.addresses[0][1]
    return Hub(data_dir, cursor, store, runner, f"http://127.0.0.1:{bound}", token, read)


async def restart_hub(hub: Hub) -> Hub:
    """Same data dir, same port (clients keep their URL)."""
    port = int(hub.url.rsplit(":", 1)[1])
    await hub.close()
    store = await Store.open(hub.data_dir, embedder=HashingEmbedder(), feed=True)
    book = await asyncio.to_thread(TokenBook, hub.data_dir)
    runner = web.AppRunner(create_hub_app(store, book, config=HubConfig(cursor=hub.cursor)))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return Hub(hub.data_dir, hub.cursor, store, runner, hub.url, hub.token, hub.read_token)


@dataclass
class Laptop:
    name: str
    data_dir: Path
    store: Store
    engine: SyncEngine
    reports: list[PassReport] = field(default_factory=list)

    async def sync(self) -> PassReport:
        report = await self.engine.run_pass("test")
        self.reports.append(report)
        return report

    async def close(self) -> None:
        await self.engine.close()
        await self.store.close()


async def start_laptop(name: str, data_dir: Path, url: str, token: str, *,
                       wall: Callable[[], int] | None = None, overlap_secs: float = 120.0,
                       anti_entropy_secs: float = 3600.0, realm: str | None = None,
                       push_batch_bytes: int = 1_500_000, http_timeout: float = 5.0) -> Laptop:
    kwargs: dict[str, Any] = {"wall": wall} if wall else {}
    store = await Store.open(data_dir, embedder=HashingEmbedder(), **kwargs)
    options = SyncOptions(realm=realm, plane_model=MODEL, overlap_secs=overlap_secs,
                          push_batch_bytes=push_batch_bytes,
                          anti_entropy_secs=anti_entropy_secs)
    engine = SyncEngine(store, PlaneClient(url, token, timeout=http_timeout, **kwargs), options,
                        **kwargs)
    await engine.start()
    return Laptop(name, data_dir, store, engine)


@contextlib.asynccontextmanager
async def two_laptops(root: Path, url: str, token: str,
                      **options: Any) -> AsyncIterator[tuple[Laptop, Laptop]]:
    """Laptops ``a`` and ``b`` (data in ``root/a``, ``root/b``) on one plane, closed after."""
    a = await start_laptop("a", root / "a", url, token, **options)
    try:
        b = await start_laptop("b", root / "b", url, token, **options)
        try:
            yield a, b
        finally:
            await b.close()
    finally:
        await a.close()


async def live_contents(store: Store) -> dict[str, tuple[Any, ...]]:
    """What a replica holds, minus local bookkeeping: id → (content, title, tags, status,
    importance, invalid_at, superseded_by, deleted, updated_at, origin)."""
    out: dict[str, tuple[Any, ...]] = {}
    rows = await store._fetch(
        "SELECT id, content, title, tags, status, importance, invalid_at, superseded_by, "
        "deleted, updated_at, origin FROM memories ORDER BY id")
    for row in rows:
        out[row[0]] = tuple(row[1:])
    return out


async def edge_set(store: Store) -> dict[str, tuple[Any, ...]]:
    rows = await store._fetch(
        "SELECT id, deleted, updated_at, props FROM edges ORDER BY id")
    return {r[0]: tuple(r[1:]) for r in rows}


def _execute(db: Path, sql: str, params: tuple[object, ...]) -> int:
    conn = sqlite3.connect(db, timeout=10)
    try:
        with conn:
            return conn.execute(sql, params).rowcount
    finally:
        conn.close()


async def tamper(store: Store, sql: str, *params: object) -> None:
    """Write to the store's database file behind its back: a bug that bypassed the write path."""
    assert await asyncio.to_thread(_execute, store.db_path, sql, params) == 1


async def run_script(script: Path, *args: str, timeout_s: float = 120.0) -> tuple[int, str]:
    """Run a child script of this repo (a crash child) to its end; its exit code (negative: the
    signal that killed it) and its output. Past ``timeout_s`` it is killed and TimeoutError
    raised."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(script), *args, cwd=REPO_ROOT, env=env,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(timeout_s):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, (out + err).decode(errors="replace")

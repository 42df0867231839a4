"""Shared fixtures: real SQLite stores in tmp_path, an injectable wall clock, a throwaway
PostgreSQL server (tests/pgserver.py) with a fresh database per test."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiohttp import web
from blockbuster import blockbuster_ctx

from local_store import HashingEmbedder, Store
from tests.pgserver import PgServer, PgServerError, find_bindir


@contextlib.asynccontextmanager
async def serving_app(app: web.Application) -> AsyncIterator[str]:
    """``app`` served on a loopback port of the system's choosing; yields its URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


class FakeWall:
    """A wall clock tests move by hand (nanoseconds)."""

    def __init__(self, start_ns: int = 1_780_000_000_000_000_000) -> None:
        self.now_ns = start_ns

    def __call__(self) -> int:
        return self.now_ns

    def advance(self, seconds: float) -> None:
        self.now_ns += int(seconds * 1_000_000_000)


@pytest.fixture
def wall() -> FakeWall:
    return FakeWall()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    s = await Store.open(tmp_path / "data", embedder=HashingEmbedder())
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture(autouse=True)
def _no_blocking_in_event_loop(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail any async test whose event loop blocks (STYLE 11): blockbuster patches blocking calls
    and raises when one runs on the loop thread. Sync tests are unaffected."""
    if not asyncio.iscoroutinefunction(getattr(request.node, "function", None)):
        yield
        return
    with blockbuster_ctx(["local_store", "protocol", "syncd"]) as buster:
        # asyncpg stats ~/.pgpass and ~/.postgresql/*.crt when it opens a connection (a few
        # local metadata calls per new pooled connection, inside the library)
        for function in buster.functions.values():
            function.can_block_in("asyncpg/connect_utils.py", "_parse_connect_dsn_and_args")
        yield


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """One throwaway PostgreSQL server for the session (fsync off; stopped and deleted at the
    end). Skips without PostgreSQL binaries, except in CI, where .ci/run installs them."""
    if find_bindir() is None:
        if os.environ.get("CI") == "true":
            pytest.fail(
                "PostgreSQL binaries not found (no /usr/lib/postgresql/*/bin, pg_config or "
                "SYNCD_PG_BINDIR); .ci/run installs postgresql, so this should not happen in CI",
                pytrace=False,
            )
        pytest.skip("PostgreSQL binaries not found (install postgresql-15 or set SYNCD_PG_BINDIR)")
    server = PgServer.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_dsn(pg_server: PgServer, request: pytest.FixtureRequest) -> Iterator[str]:
    """DSN of a fresh, empty database on `pg_server`, named after the test; dropped afterwards
    (WITH (FORCE): connections the test left open are terminated)."""
    stem = re.sub(r"[^a-z0-9_]+", "_", request.node.name.lower())[:40].strip("_")
    name = f"t_{stem}_{uuid.uuid4().hex[:8]}"
    dsn = pg_server.create_database(name)
    try:
        yield dsn
    finally:
        try:
            pg_server.drop_database(name)
        except PgServerError:
            pass  # best effort: the server goes away with the session anyway

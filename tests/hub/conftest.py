"""Hub stores for the conformance suite: every test runs once on SQLite and once on a
throwaway PostgreSQL database (``tests/pgserver.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from local_store import HashingEmbedder, Store
from syncd.hub.store import HubStore, SqliteHubStore

Opener = Callable[[], Awaitable[HubStore]]


@pytest.fixture(params=["sqlite", "postgresql"])
async def open_hub(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Opener]:
    """Opens the same hub store again on each call (a restart: close the previous one first)."""
    opened: list[HubStore] = []
    if request.param == "sqlite":
        async def open_store() -> HubStore:
            store = await Store.open(tmp_path / "hub", embedder=HashingEmbedder(), feed=True)
            return SqliteHubStore(store)
    else:
        from syncd.hub.pg import PgHubStore
        dsn = request.getfixturevalue("pg_dsn")

        async def open_store() -> HubStore:
            return await PgHubStore.open(dsn, embedder=HashingEmbedder())

    async def tracked() -> HubStore:
        hub = await open_store()
        opened.append(hub)
        return hub

    yield tracked
    for hub in opened:
        await hub.close()  # closing twice is harmless for both stores


@pytest.fixture
async def hub_store(open_hub: Opener) -> HubStore:
    return await open_hub()

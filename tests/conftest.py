"""Shared fixtures: real SQLite stores in tmp_path, an injectable wall clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from blockbuster import blockbuster_ctx

from local_store import HashingEmbedder, Store


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
    with blockbuster_ctx(["local_store", "protocol", "syncd"]):
        yield

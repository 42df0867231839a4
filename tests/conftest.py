"""Shared fixtures: real SQLite stores in tmp_path, an injectable wall clock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

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

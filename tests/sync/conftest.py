"""The hub fixture shared by the replication tests: a real hub, once per cursor mode (a test
module that needs one mode only defines its own ``hub``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.sync.harness import Hub, start_hub


@pytest.fixture(params=["ingest", "origin"])
async def hub(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Hub]:
    h = await start_hub(tmp_path / "hub", request.param)
    try:
        yield h
    finally:
        await h.close()

"""A hub that signs entitlements, on a loopback port, for every entitlement test that asks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.entitlement.support import SigningHub, start_signing_hub


@pytest.fixture
async def hub(tmp_path: Path) -> AsyncIterator[SigningHub]:
    h = await start_signing_hub(tmp_path / "hub")
    try:
        yield h
    finally:
        await h.close()

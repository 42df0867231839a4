"""A real daemon app on a real loopback port, with a real store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from local_store import HashingEmbedder, Store
from syncd.http import create_app

TOKEN = "test-token-0123456789abcdef"


@dataclass
class Daemon:
    url: str
    port: int
    store: Store
    session: aiohttp.ClientSession

    def auth(self, **extra: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {TOKEN}", **extra}

    async def call(self, method: str, path: str, **kw: object) -> tuple[int, object, dict[str, str]]:
        headers = kw.pop("headers", None) or self.auth()
        async with self.session.request(method, self.url + path, headers=headers,  # type: ignore[arg-type]
                                        **kw) as resp:
            text = await resp.text()
            try:
                body: object = await resp.json(content_type=None) if text else None
            except ValueError:
                body = text
            return resp.status, body, dict(resp.headers)


@pytest.fixture
async def daemon(tmp_path: Path) -> AsyncIterator[Daemon]:
    store = await Store.open(tmp_path / "data", embedder=HashingEmbedder())
    app = create_app(store, token=TOKEN, max_body=64 * 1024)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    async with aiohttp.ClientSession() as session:
        try:
            yield Daemon(f"http://127.0.0.1:{port}", port, store, session)
        finally:
            await runner.cleanup()
            await store.close()

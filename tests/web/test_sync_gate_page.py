"""The Sync page with a licence that ends after the last date a browser can show
(``exp`` beyond 8.64e12 s): a real gate over a real signed licence, the daemon's app in
process, headless Chromium. ``new Date(exp * 1000).toISOString()`` threw there, and the
page stayed on "Loading…"."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from local_store import HashingEmbedder, Store
from syncd.config import EntitlementConfig
from syncd.entitlement.gate import LICENSE_FILENAME, Gate
from syncd.entitlement.keeper import Keeper
from syncd.entitlement.token import Claims, key_id, sign
from syncd.http.app import create_app

if TYPE_CHECKING:
    from playwright.async_api import Browser

TOKEN = "sync-gate-page-token-" + "x" * 22
FAR = 10**13  # seconds: year ~318,857


def write_licence(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)


async def test_the_sync_page_shows_a_licence_ending_past_the_last_date(
        browser: Browser, tmp_path: Path) -> None:
    from playwright.async_api import expect

    key = Ed25519PrivateKey.generate()
    async with await Store.open(tmp_path / "data", embedder=HashingEmbedder()) as store:
        now = int(time.time())
        licence = sign(key, Claims(sub="me", device_id=store.replica_id, plan="pro",
                                   features=["sync", "graph"], iat=now, nbf=now - 60,
                                   exp=FAR, seq=1))
        await asyncio.to_thread(write_licence, store.data_dir / LICENSE_FILENAME, licence)
        gate = Gate(store.data_dir, {key_id(key.public_key()): key.public_key()},
                    store.replica_id)
        keeper = Keeper(gate, None, EntitlementConfig(refresh_secs=3600))
        assert (await keeper.check(online=False)).entitled and gate.allows("sync") is None

        runner = web.AppRunner(create_app(store, token=TOKEN, mcp=False, keeper=keeper))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        context = await browser.new_context()
        try:
            async with aiohttp.ClientSession() as http, http.post(
                    url + "/ui/login-codes", json={},
                    headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
                assert resp.status == 200, await resp.text()
                login = (await resp.json())["url"]
            page = await context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            await page.goto(login)
            await expect(page.locator("#tabs")).to_be_visible()
            await page.evaluate("() => { location.hash = '#/sync'; }")
            await expect(page.locator("#sync-gate")).to_contain_text("entitled")
            await expect(page.locator("#sync-gate")).to_contain_text(str(FAR))
            assert not errors, errors
        finally:
            await context.close()
            await runner.cleanup()

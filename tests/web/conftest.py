"""The web page in a real browser: headless Chromium (Debian's, never a downloaded build) driven
by Playwright, against a real ``syncd run`` process synced to a real hub that signs
entitlements. No mocks.

  * ``browser``: Chromium, or a skip (a failure when ``CI=true``) when it or Playwright is
    missing. ``SYNCD_CHROMIUM`` names another binary.
  * ``stack``: the hub (in-process, port 0) and the daemon (a subprocess, port 0) configured
    like ``tests/syncd/test_sync_process.py``, entitled (so sync and graph expansion are on),
    with a bearer-token API client and ``login_url()`` from ``syncd open --no-browser``.
  * ``hub_page``: the hub app alone (``create_hub_app``), in-process on port 0, over a SQLite and
    then a PostgreSQL hub store (like ``tests/hub/conftest.py``'s ``open_hub``); its page signs
    in with a hub token.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest
from aiohttp import web

from local_store import HashingEmbedder, Store
from syncd.entitlement.token import public_key_text
from syncd.hub.app import create_hub_app
from syncd.hub.store import HubStore, SqliteHubStore
from tests.entitlement.support import SigningHub, start_signing_hub
from tests.syncd.processes import cli, spawn, wait_ready

if TYPE_CHECKING:
    from playwright.async_api import Browser

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]


def _missing(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; CI must run the browser tests", pytrace=False)
    pytest.skip(reason)


def chromium_path() -> str:
    path = os.environ.get("SYNCD_CHROMIUM") or CHROMIUM
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        _missing(f"no Chromium at {path} (apt-get install chromium, or set SYNCD_CHROMIUM)")
    return path


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    path = chromium_path()
    try:
        from playwright.async_api import async_playwright, expect
    except ImportError:
        _missing("the playwright package is not installed (pip install playwright; its "
                 "bundled browsers are not needed)")
        raise
    expect.set_options(timeout=10_000)  # a loaded CI machine is slower than a laptop
    async with async_playwright() as playwright:
        chromium = await playwright.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            await chromium.close()


@pytest.fixture
def screenshot_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``SYNCD_SCREENSHOT_DIR`` when set, else a pytest temporary directory."""
    chosen = os.environ.get("SYNCD_SCREENSHOT_DIR")
    path = Path(chosen) if chosen else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


# ---------------------------------------------------------------------- the daemon and its hub


@dataclass
class Stack:
    home: Path
    config: Path
    data_dir: Path
    url: str
    token: str
    hub: SigningHub
    http: aiohttp.ClientSession
    proc: asyncio.subprocess.Process
    logs: list[str] = field(default_factory=list)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """The daemon's API with its bearer token: (status, JSON body)."""
        headers = {"Authorization": f"Bearer {self.token}"}
        async with self.http.request(method, self.url + path, headers=headers,
                                     json=body) as resp:
            return resp.status, await resp.json(content_type=None)

    async def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, answer = await self.call(method, path, body)
        assert status == 200, (method, path, status, answer)
        return answer

    async def tool(self, name: str, **args: Any) -> Any:
        return await self.ok("POST", f"/v1/agent/memory/tools/{name}", args)

    async def memory(self, memory_id: str) -> dict[str, Any]:
        answer = await self.ok("GET", f"/v1/agent/memory/items/{memory_id}")
        assert isinstance(answer, dict)
        return answer

    async def login_url(self) -> str:
        """A one-time login URL, from ``syncd open --no-browser`` (a real CLI process)."""
        code, out, err = await cli(self.home, "--config", str(self.config), "--data-dir",
                                   str(self.data_dir), "open", "--no-browser")
        assert code == 0, err
        url = out.strip()
        assert url.startswith(f"{self.url}/ui/login?code="), (url, err)
        return url


async def _drain(stream: asyncio.StreamReader | None, sink: list[str]) -> None:
    """Keep reading a child's pipe, so its logging can never block on a full pipe."""
    if stream is None:
        return
    while line := await stream.readline():
        sink.append(line.decode(errors="replace"))


async def _write(path: Path, text: str) -> None:
    await asyncio.to_thread(path.parent.mkdir, parents=True, exist_ok=True)
    await asyncio.to_thread(path.write_text, text)


async def _wait_entitled(stack: Stack, deadline: float = 20.0) -> None:
    """The daemon fetches its first entitlement from the hub in the background."""
    async with asyncio.timeout(deadline):
        while True:
            status = await stack.ok("GET", "/v1/agent/status")
            entitlement = status.get("entitlement") or {}
            if entitlement.get("entitled"):
                return
            await asyncio.sleep(0.1)


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    hub = await start_signing_hub(tmp_path / "hub")
    config = tmp_path / "laptop.toml"
    data_dir = tmp_path / "laptop"
    await _write(tmp_path / "plane-token", hub.token)
    await _write(config, f'[control_plane]\nurl = "{hub.url}"\n'
                 f'token_file = "{tmp_path / "plane-token"}"\n'
                 f'embedding_model = "{HashingEmbedder().model_id}"\n'
                 '[sync]\ninterval_secs = 3600\n'
                 f'[entitlement]\npublic_keys = ["{public_key_text(hub.key.public_key())}"]\n')
    proc = await spawn(tmp_path, "--config", str(config), "--data-dir", str(data_dir), "run",
                       "--listen", "127.0.0.1:0")
    logs: list[str] = []
    drains: list[asyncio.Task[None]] = []
    try:
        url = await wait_ready(proc)
        drains = [asyncio.create_task(_drain(proc.stderr, logs)),
                  asyncio.create_task(_drain(proc.stdout, logs))]
        token = (await asyncio.to_thread((data_dir / "api-token").read_text)).strip()
        async with aiohttp.ClientSession() as http:
            stack = Stack(tmp_path, config, data_dir, url.rstrip("/"), token, hub, http, proc,
                          logs)
            await _wait_entitled(stack)
            yield stack
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(30):
                code = await proc.wait()
        except TimeoutError:
            proc.kill()
            code = await proc.wait()
        for task in drains:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await hub.close()
        assert code == 0, "".join(logs)


# ---------------------------------------------------------------------- the hub alone


@dataclass
class HubPage:
    url: str
    hub: HubStore
    store: str  # "sqlite" or "postgresql": what the page's Status view must report

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])


@pytest.fixture(params=["sqlite", "postgresql"])
async def hub_page(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[HubPage]:
    """The real hub app (``create_hub_app``) on 127.0.0.1, port 0, over a fresh hub store: a
    SQLite one, then a PostgreSQL one (``pg_dsn``: a throwaway database)."""
    hub: HubStore
    if request.param == "sqlite":
        store = await Store.open(tmp_path / "hub", embedder=HashingEmbedder(), feed=True)
        hub = SqliteHubStore(store)
    else:
        from syncd.hub.pg import PgHubStore
        hub = await PgHubStore.open(request.getfixturevalue("pg_dsn"),
                                    embedder=HashingEmbedder())
    runner = web.AppRunner(create_hub_app(hub))
    try:
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield HubPage(f"http://127.0.0.1:{runner.addresses[0][1]}", hub, request.param)
    finally:
        await runner.cleanup()
        await hub.close()

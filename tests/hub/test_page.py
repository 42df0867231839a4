"""The web page on the hub: it logs in with a hub token (no `syncd open` on a server), and the
session keeps the token's role; CSRF and own-origin rules as on the daemon. On both stores."""

from __future__ import annotations

from collections.abc import AsyncIterator
from http.cookies import SimpleCookie

import aiohttp
import pytest
from aiohttp import web

from syncd.hub.app import create_hub_app
from syncd.hub.store import HubStore
from tests.hub.conftest import Opener


@pytest.fixture
async def served(open_hub: Opener) -> AsyncIterator[tuple[str, HubStore]]:
    hub = await open_hub()
    runner = web.AppRunner(create_hub_app(hub))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", hub
    finally:
        await runner.cleanup()


async def page_login(http: aiohttp.ClientSession, url: str, token: str,
                     **headers: str) -> tuple[int, dict[str, str]]:
    """Status and, on success, the session's Cookie and CSRF headers."""
    async with http.post(f"{url}/ui/login", json={"token": token}, headers=headers) as resp:
        body = await resp.json()
        if resp.status != 200:
            return resp.status, {}
        jar = SimpleCookie(resp.headers["Set-Cookie"])
    (name,) = list(jar)
    assert jar[name]["httponly"] and jar[name]["samesite"] == "Strict"
    return 200, {"Cookie": f"{name}={jar[name].value}", "X-CSRF-Token": body["csrf"]}


async def test_the_hub_page_logs_in_with_a_token_and_keeps_its_role(
        served: tuple[str, HubStore]) -> None:
    url, hub = served
    reader = await hub.tokens.create(role="read", name="viewer")
    writer = await hub.tokens.create(role="write", name="editor")
    async with aiohttp.ClientSession() as http:
        async with http.get(url + "/") as resp:
            assert resp.status == 200 and "default-src 'self'" in resp.headers[
                "Content-Security-Policy"]
        assert (await page_login(http, url, "syncd_wrong"))[0] == 401
        for body in ({}, {"token": ""}, {"token": 5}, ["x"]):
            async with http.post(f"{url}/ui/login", json=body) as resp:
                error = (await resp.json())["error"]
                assert (resp.status, error["field"]) == (422, "token"), body
                assert "Set-Cookie" not in resp.headers
        async with http.post(f"{url}/ui/login", data="token=x",
                             headers={"Content-Type": "application/x-www-form-urlencoded"}) as resp:
            assert resp.status == 415 and "Set-Cookie" not in resp.headers
        assert (await page_login(http, url, writer, Origin="https://evil.test"))[0] == 403
        status, as_reader = await page_login(http, url, reader)
        assert status == 200
        async with http.get(url + "/ui/session", headers=as_reader) as resp:
            info = await resp.json()
            assert (info["kind"], info["role"]) == ("hub", "read")
        async with http.post(url + "/v1/agent/memory/query", json={"query": "x"},
                             headers=as_reader) as resp:
            assert resp.status == 200
        async with http.put(url + "/v1/agent/memory/settings", json={"w_keyword": 0.9},
                            headers=as_reader) as resp:
            assert resp.status == 403  # a read token's session cannot write
        _, as_writer = await page_login(http, url, writer)
        no_csrf = {"Cookie": as_writer["Cookie"]}
        async with http.put(url + "/v1/agent/memory/settings", json={"w_keyword": 0.9},
                            headers=no_csrf) as resp:
            assert resp.status == 403
        assert (await hub.settings()).w_keyword != 0.9
        async with http.put(url + "/v1/agent/memory/settings", json={"w_keyword": 0.9},
                            headers=as_writer) as resp:
            assert resp.status == 200
        assert (await hub.settings()).w_keyword == 0.9
        await hub.tokens.revoke("viewer")  # revoking the token ends its sessions
        async with http.post(url + "/v1/agent/memory/query", json={"query": "x"},
                             headers=as_reader) as resp:
            assert resp.status == 401
        async with http.post(url + "/ui/logout", json={}, headers=as_writer) as resp:
            assert resp.status == 200
        async with http.get(url + "/ui/session", headers=as_writer) as resp:
            assert resp.status == 401

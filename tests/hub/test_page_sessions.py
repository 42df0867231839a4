"""The hub page's sessions as deployed (``deploy/systemd/README.md``): several ``syncd hub``
processes over one PostgreSQL database behind a balancing proxy ("any instance can serve any
request") all know a browser's session, its logout and its token's revocation; and a token
signing in again and again ends only its own oldest sessions, never another token's. The
store keeps hashes only: neither the cookie's session id nor the token. The cookie alone is no
session: every request needs the session's key too, which only the sign-in answers."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator

import aiohttp
import asyncpg
import pytest
from aiohttp import web

from local_store import HashingEmbedder
from syncd.http.web import MAX_SESSIONS_PER_TOKEN
from syncd.hub.app import create_hub_app
from syncd.hub.store import HubStore
from tests.hub.conftest import Opener

HOST = "hub.example.com"
PROXIED = {"Host": HOST, "X-Forwarded-Proto": "https"}  # what the TLS proxy passes on
ORIGIN = f"https://{HOST}"


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


async def serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def sign_in(http: aiohttp.ClientSession, url: str, token: str,
                  **headers: str) -> tuple[dict[str, str], str]:
    """A new page session: its ``Cookie`` and ``X-CSRF-Token`` headers (the key, from the
    sign-in's answer) and the session id the cookie holds."""
    async with http.post(url + "/ui/login", json={"token": token}, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        ((name, morsel),) = resp.cookies.items()
        key = (await resp.json())["csrf"]
        return {"Cookie": f"{name}={morsel.value}", "X-CSRF-Token": key}, morsel.value


async def session_status(http: aiohttp.ClientSession, url: str, page: dict[str, str]) -> int:
    async with http.get(url + "/ui/session", headers=page) as resp:
        return resp.status


@pytest.fixture
async def instances(pg_dsn: str) -> AsyncIterator[tuple[list[HubStore], list[str]]]:
    """Two hub processes' stores and apps on one PostgreSQL database."""
    from syncd.hub.pg import PgHubStore
    hubs: list[HubStore] = []
    runners: list[web.AppRunner] = []
    urls: list[str] = []
    try:
        for _ in range(2):
            hubs.append(await PgHubStore.open(pg_dsn, embedder=HashingEmbedder()))
            runner, url = await serve(create_hub_app(hubs[-1]))
            runners.append(runner)
            urls.append(url)
        yield hubs, urls
    finally:
        for runner in runners:
            await runner.cleanup()
        for hub in hubs:
            await hub.close()


async def test_a_page_session_works_on_every_hub_instance(
        instances: tuple[list[HubStore], list[str]], pg_dsn: str) -> None:
    """Before, sessions lived in each process's memory: the proxy's next request to another
    instance found none (401), so the page signed out at random."""
    hubs, urls = instances
    token = await hubs[0].tokens.create(role="write", name="editor")
    # the proxy passes the browser's Host on, so both instances set one cookie name
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
        async with http.post(urls[0] + "/ui/login", json={"token": token},
                             headers={**PROXIED, "Origin": ORIGIN}) as resp:
            assert resp.status == 200, await resp.text()
            ((name, morsel),) = resp.cookies.items()
            csrf = (await resp.json())["csrf"]
        jar = {**PROXIED, "Cookie": f"{name}={morsel.value}", "X-CSRF-Token": csrf}
        for i, url in enumerate(urls):  # the proxy sends the next request to either instance
            async with http.get(url + "/ui/session", headers=jar) as resp:
                assert resp.status == 200, (f"instance {i}", await resp.text())
                assert (await resp.json())["role"] == "write"
            async with http.get(url + "/v1/agent/memory/settings", headers=jar) as resp:
                assert resp.status == 200, (f"instance {i}", await resp.text())
        async with http.put(urls[1] + "/v1/agent/memory/settings", json={"w_keyword": 0.9},
                            headers={**jar, "Origin": ORIGIN}) as resp:
            assert resp.status == 200, await resp.text()  # a write, CSRF checked on the other
        # only hashes are stored: the cookie's id and the token are nowhere in the table
        conn = await asyncpg.connect(pg_dsn)
        try:
            rows = [tuple(r) for r in await conn.fetch(
                "SELECT sid_sha256, token_sha256, csrf FROM page_sessions")]
        finally:
            await conn.close()
        assert rows == [(sha256(morsel.value), sha256(token), csrf)]
        # signed out through one instance: signed out on every one
        async with http.post(urls[1] + "/ui/logout", json={},
                             headers={**jar, "X-CSRF-Token": csrf}) as resp:
            assert resp.status == 200
        for i, url in enumerate(urls):
            async with http.get(url + "/ui/session", headers=jar) as resp:
                assert resp.status == 401, f"instance {i}"


async def test_revoking_a_token_through_one_instance_ends_its_sessions_on_every_one(
        instances: tuple[list[HubStore], list[str]]) -> None:
    hubs, urls = instances
    token = await hubs[0].tokens.create(role="read", name="viewer")
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
        page, sid = await sign_in(http, urls[0], token, **PROXIED)
        jar = {**PROXIED, **page}
        async with http.get(urls[1] + "/v1/agent/status", headers=jar) as resp:
            assert resp.status == 200
        assert await hubs[1].tokens.revoke("viewer")
        for url in urls:
            async with http.get(url + "/v1/agent/status", headers=jar) as resp:
                assert resp.status == 401
            async with http.get(url + "/ui/session", headers=jar) as resp:
                assert resp.status == 401
        assert await hubs[0].page_session(sha256(sid), now_ns=0) is None  # and it is gone


async def test_a_read_token_cannot_sign_everyone_else_out(open_hub: Opener) -> None:
    """Before, one pool of 32 sessions for every token: 40 sign-ins with any read token ended
    an admin's session. Now each token keeps its own newest ``MAX_SESSIONS_PER_TOKEN``."""
    hub = await open_hub()
    runner, url = await serve(create_hub_app(hub))
    try:
        admin = await hub.tokens.create(role="admin", name="admin")
        reader = await hub.tokens.create(role="read", name="intern")
        async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
            admin_page, _ = await sign_in(http, url, admin)
            readers = [(await sign_in(http, url, reader))[0]
                       for _ in range(MAX_SESSIONS_PER_TOKEN + 8)]
            assert await session_status(http, url, admin_page) == 200
            # the reader's own oldest ended; its newest are all still signed in
            assert [await session_status(http, url, c) for c in readers[:8]] == [401] * 8
            assert {await session_status(http, url, c) for c in readers[8:]} == {200}
    finally:
        await runner.cleanup()


async def test_a_hub_page_cookie_without_its_key_is_no_session(open_hub: Opener) -> None:
    """Cookies ignore ports: the hub's cookie also reaches other servers on the hub's host.
    Before, a replayed cookie got the key from ``GET /ui/session`` and then read and wrote as
    its token. Now only the sign-in hands the key out; the cookie alone reads nothing."""
    hub = await open_hub()
    runner, url = await serve(create_hub_app(hub))
    try:
        writer = await hub.tokens.create(role="write", name="editor")
        async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
            page, _ = await sign_in(http, url, writer)
            key = page["X-CSRF-Token"]
            async with http.get(url + "/ui/session") as resp:
                no_session = (resp.status, await resp.json())
            assert no_session[0] == 401 and no_session[1]["kind"] == "hub"
            for guess in ({}, {"X-CSRF-Token": ""}, {"X-CSRF-Token": key[:-1]}):
                cookie = {"Cookie": page["Cookie"], **guess}
                async with http.get(url + "/ui/session", headers=cookie) as resp:
                    assert (resp.status, await resp.json()) == no_session, guess
                for method, path in (("GET", "/v1/agent/memory/settings"),
                                     ("GET", "/v1/agent/status"),
                                     ("PUT", "/v1/agent/memory/settings")):
                    async with http.request(method, url + path, json={"w_keyword": 0.9},
                                            headers=cookie) as resp:
                        body = await resp.text()
                        assert resp.status == 403 and "w_keyword" not in body, (path, body)
            async with http.get(url + "/ui/session", headers=page) as resp:
                info = await resp.json()
                assert resp.status == 200 and info["role"] == "write"
                assert "csrf" not in info and key not in str(info)  # the page has it already
            assert (await hub.settings()).w_keyword != 0.9
    finally:
        await runner.cleanup()

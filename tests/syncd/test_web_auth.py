"""The web page's login and session rules (``syncd/http/web.py``) over a real socket, without a
browser: one-time codes, the cookie's attributes, the session's key (``X-CSRF-Token``) on every
session request and own-origin checks, that a leaked cookie alone is nothing, and that none of
it loosens L2–L7 (``tests/web/`` repeats the important ones in a real
browser)."""

from __future__ import annotations

import asyncio
from http.cookies import SimpleCookie

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

from syncd.http import web as web_pages
from tests.store_probe import dump_tables
from tests.syncd.conftest import Daemon

KEY_PREFIX = "/#key="


async def login(daemon: Daemon) -> tuple[str, str]:
    """Log a "browser" in; returns its Cookie header and the session's key (its CSRF token),
    which the login hands out in the redirect's fragment only."""
    status, code, _ = await daemon.call("POST", "/ui/login-codes")
    assert status == 200 and isinstance(code, dict)
    assert code["url"] == f"{daemon.url}/ui/login?code={code['code']}"
    async with daemon.session.get(code["url"], allow_redirects=False) as resp:
        location = resp.headers["Location"]
        assert resp.status == 303 and location.startswith(KEY_PREFIX), location
        assert resp.headers["Referrer-Policy"] == "no-referrer"
        jar = SimpleCookie(resp.headers["Set-Cookie"])
    key = location[len(KEY_PREFIX):]
    assert len(key) >= 32 and code["code"] not in location
    name = f"syncd_session_{daemon.port}"
    morsel = jar[name]
    assert morsel["httponly"] and morsel["samesite"] == "Strict" and morsel["path"] == "/"
    assert key not in morsel.value
    cookie = f"{name}={morsel.value}"
    status, info, _ = await daemon.call("GET", "/ui/session",
                                        headers={"Cookie": cookie, "X-CSRF-Token": key})
    assert status == 200 and isinstance(info, dict) and info["kind"] == "daemon", info
    assert "csrf" not in info and key not in str(info)  # the page has it already
    return cookie, key


async def saved(daemon: Daemon) -> str:
    status, body, _ = await daemon.call("POST", "/v1/agent/memory/tools/save_memory",
                                        json={"content": "the release checklist"})
    assert status == 200 and isinstance(body, dict)
    return str(body["node_id"])


async def test_the_page_and_its_files_need_no_credentials_and_carry_a_strict_csp(
        daemon: Daemon) -> None:
    async with daemon.session.get(daemon.url + "/") as resp:
        page = await resp.text()
        assert resp.status == 200 and resp.content_type == "text/html"
        assert "default-src 'self'" in resp.headers["Content-Security-Policy"]
        assert resp.headers["X-Frame-Options"] == "DENY"
        assert not [h for h in resp.headers if h.lower().startswith("access-control-")]
    assert "<script" in page and "http://" not in page and "https://" not in page  # no CDN
    for bad in ("..%2Fweb.py", "..%2F..%2Fhttp%2Fweb.py", ".hidden.js", "nope.js", "index.py"):
        url = URL(f"{daemon.url}/static/{bad}", encoded=True)  # sent as written
        async with daemon.session.get(url) as resp:
            assert resp.status == 404 and "import" not in await resp.text(), bad


async def test_a_login_code_works_once(daemon: Daemon) -> None:
    status, code, _ = await daemon.call("POST", "/ui/login-codes")
    assert status == 200
    assert isinstance(code, dict)
    async with daemon.session.get(code["url"], allow_redirects=False) as resp:
        assert resp.status == 303
    async with daemon.session.get(code["url"], allow_redirects=False) as resp:
        assert resp.status == 401 and "Set-Cookie" not in resp.headers
    for bad in ("", "x", code["code"][:-1]):
        async with daemon.session.get(f"{daemon.url}/ui/login", params={"code": bad},
                                      allow_redirects=False) as resp:
            assert resp.status == 401 and "Set-Cookie" not in resp.headers


async def test_an_expired_login_code_is_refused(daemon: Daemon,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(web_pages, "CODE_TTL_SECS", -1)
    _, code, _ = await daemon.call("POST", "/ui/login-codes")
    assert isinstance(code, dict)
    async with daemon.session.get(code["url"], allow_redirects=False) as resp:
        assert resp.status == 401


async def test_login_codes_are_for_the_bearer_token_only(daemon: Daemon) -> None:
    status, _, _ = await daemon.call("POST", "/ui/login-codes", headers={"X": "no token"})
    assert status == 401
    cookie, csrf = await login(daemon)
    status, body, _ = await daemon.call("POST", "/ui/login-codes", json={}, headers={
        "Cookie": cookie, "X-CSRF-Token": csrf})
    assert status == 403, body


async def test_a_session_reads_and_writes_with_its_csrf_token_only(daemon: Daemon) -> None:
    mid = await saved(daemon)
    cookie, csrf = await login(daemon)
    status, item, _ = await daemon.call("GET", f"/v1/agent/memory/items/{mid}",
                                        headers={"Cookie": cookie, "X-CSRF-Token": csrf})
    assert status == 200 and isinstance(item, dict) and item["status"] == "active"
    before = await dump_tables(daemon.store)
    archive = {"memory_id": mid, "status": "archived"}
    refused = [
        {"Cookie": cookie},  # no CSRF token
        {"Cookie": cookie, "X-CSRF-Token": "wrong"},
        {"Cookie": cookie, "X-CSRF-Token": csrf[:-1]},
        {"Cookie": cookie, "X-CSRF-Token": csrf, "Origin": "http://127.0.0.1:1"},  # other port
        {"Cookie": cookie, "X-CSRF-Token": csrf, "Sec-Fetch-Site": "same-site"},
    ]
    for headers in refused:
        status, body, _ = await daemon.call("POST", "/v1/agent/memory/tools/update_memory_status",
                                            json=archive, headers=headers)
        assert status == 403, (headers, body)
        for path in (f"/v1/agent/memory/items/{mid}", "/v1/agent/memory/settings"):
            status, body, _ = await daemon.call("GET", path, headers=headers)  # reads too
            assert status == 403 and "active" not in str(body), (path, headers, body)
    status, _, _ = await daemon.call("POST", "/v1/agent/memory/tools/update_memory_status",
                                     data="status=archived", headers={
                                         "Cookie": cookie, "X-CSRF-Token": csrf,
                                         "Content-Type": "text/plain"})
    assert status == 415
    assert await dump_tables(daemon.store) == before  # every refusal left the store as it was
    status, body, headers = await daemon.call(
        "POST", "/v1/agent/memory/tools/update_memory_status", json=archive, headers={
            "Cookie": cookie, "X-CSRF-Token": csrf, "Origin": daemon.url,
            "Sec-Fetch-Site": "same-origin"})
    assert status == 200, body
    assert not [h for h in headers if h.lower().startswith("access-control-")]
    status, item, _ = await daemon.call("GET", f"/v1/agent/memory/items/{mid}")
    assert isinstance(item, dict) and item["status"] == "archived"


async def test_a_session_read_from_another_origin_is_refused(daemon: Daemon) -> None:
    mid = await saved(daemon)
    cookie, csrf = await login(daemon)
    for headers in ({"Origin": "http://127.0.0.1:9"}, {"Origin": "null"},
                    {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"}):
        status, _, _ = await daemon.call("GET", f"/v1/agent/memory/items/{mid}", headers={
            "Cookie": cookie, "X-CSRF-Token": csrf, **headers})
        assert status == 403, headers


async def test_another_ports_cookie_and_a_logged_out_session_are_nothing(
        daemon: Daemon) -> None:
    cookie, csrf = await login(daemon)
    other = cookie.replace(f"syncd_session_{daemon.port}=", "syncd_session_1=")
    status, _, _ = await daemon.call("GET", "/v1/agent/status",
                                     headers={"Cookie": other, "X-CSRF-Token": csrf})
    assert status == 401
    status, _, _ = await daemon.call("POST", "/ui/logout", json={}, headers={
        "Cookie": cookie, "X-CSRF-Token": csrf})
    assert status == 200
    for path in ("/ui/session", "/v1/agent/status"):
        status, _, _ = await daemon.call("GET", path,
                                         headers={"Cookie": cookie, "X-CSRF-Token": csrf})
        assert status == 401, path


async def test_the_host_allow_list_still_guards_the_page_and_the_login(daemon: Daemon) -> None:
    _, code, _ = await daemon.call("POST", "/ui/login-codes")
    assert isinstance(code, dict)
    for path in ("/", f"/ui/login?code={code['code']}"):
        async with daemon.session.get(daemon.url + path, allow_redirects=False,
                                      headers={"Host": f"evil.test:{daemon.port}"}) as resp:
            assert resp.status == 421, path
    async with daemon.session.get(code["url"], allow_redirects=False) as resp:
        assert resp.status == 303  # the refused request did not spend the code


async def test_a_session_cookie_leaked_to_another_local_port_reads_and_writes_nothing(
        daemon: Daemon) -> None:
    """Cookies ignore ports (RFC 6265 §8.5): a browser that logged in sends the daemon's cookie
    to every other server on 127.0.0.1 too (a dev server, a container's port). Before, that
    server replayed it with no Origin: ``GET /ui/session`` handed over the CSRF token, and the
    session then read and wrote everything (the review changed the settings)."""
    seen: list[str] = []

    async def other_program(request: web.Request) -> web.Response:  # e.g. localhost:3000
        seen.append(request.headers.get("Cookie", ""))
        return web.Response(text="hello")

    other = web.Application()
    other.router.add_get("/", other_program)
    runner = web.AppRunner(other)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    settings_before = daemon.store.settings.current
    try:
        # the browser: a cookie jar that follows RFC 6265 (unsafe=True only allows IP hosts)
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
            status, code, _ = await daemon.call("POST", "/ui/login-codes")
            assert status == 200 and isinstance(code, dict)
            async with browser.get(code["url"], allow_redirects=False) as resp:
                assert resp.status == 303
                key = resp.headers["Location"][len(KEY_PREFIX):]
            async with browser.get(f"http://127.0.0.1:{runner.addresses[0][1]}/") as resp:
                assert resp.status == 200
    finally:
        await runner.cleanup()
    assert seen and f"syncd_session_{daemon.port}=" in seen[0]  # what a browser does
    stolen = seen[0]
    status, info, _ = await daemon.call("GET", "/ui/session", headers={"Cookie": stolen})
    assert status == 401 and isinstance(info, dict), info
    assert key and key not in stolen  # the key stayed in the page's fragment
    assert info["kind"] == "daemon" and "csrf" not in info and key not in str(info)
    status, no_session, _ = await daemon.call("GET", "/ui/session", headers={"X": "none"})
    assert (status, info) == (401, no_session)  # the same answer as no cookie at all
    for method, path in (("GET", "/v1/agent/memory/settings"), ("GET", "/v1/agent/status"),
                         ("PUT", "/v1/agent/memory/settings"), ("POST", "/ui/login-codes")):
        for guess in ({}, {"X-CSRF-Token": "guess"}, {"X-CSRF-Token": ""}):
            status, body, _ = await daemon.call(method, path, json={"w_keyword": 0.9},
                                                headers={"Cookie": stolen, **guess})
            assert status in (401, 403) and "w_keyword" not in str(body), (method, path, body)
    assert daemon.store.settings.current == settings_before
    # the browser's own page, which holds the key, still works
    status, _, _ = await daemon.call("PUT", "/v1/agent/memory/settings", json={
        "w_keyword": 0.9}, headers={"Cookie": stolen, "X-CSRF-Token": key})
    assert status == 200


def test_one_owner_signing_in_again_and_again_ends_only_its_own_oldest_sessions() -> None:
    """Before, one pool of 32 sessions for every owner: signing in 40 times as one ended
    everyone else's. (The daemon has one owner; the cap is per token, as on the hub.)"""
    sessions = web_pages.Sessions()
    admin, _ = sessions.start(owner="admin")
    readers = [sessions.start(owner="reader")[0]
               for _ in range(web_pages.MAX_SESSIONS_PER_TOKEN + 8)]
    assert sessions.find(admin) is not None
    assert [sessions.find(sid) for sid in readers[:8]] == [None] * 8
    assert None not in [sessions.find(sid) for sid in readers[8:]]


async def raw_request(url: str, head: bytes) -> int:
    """Sends ``head`` (request line and headers, as bytes) and returns the status: aiohttp's
    client would refuse to send the header bytes these tests need."""
    host, port = URL(url).host, URL(url).port
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(head + b"Connection: close\r\n\r\n")
        await writer.drain()
        answer = await reader.read()
    finally:
        writer.close()
    return int(answer.split(b" ", 2)[1])


async def test_credentials_holding_bytes_that_are_not_utf8_are_refused_not_a_500(
        daemon: Daemon) -> None:
    """A bearer token, a session cookie or a CSRF token with a byte that is not UTF-8 is a
    wrong credential (401/403), never an internal error."""
    cookie, csrf = await login(daemon)
    host = f"Host: 127.0.0.1:{daemon.port}\r\n".encode()
    get = b"GET /v1/agent/memory/settings HTTP/1.1\r\n" + host
    put = b"PUT /v1/agent/memory/settings HTTP/1.1\r\n" + host + (
        b"Content-Type: application/json\r\nContent-Length: 2\r\n")
    assert await raw_request(daemon.url, get + b"Authorization: Bearer tok\xffen\r\n") == 401
    name = f"syncd_session_{daemon.port}".encode()
    assert await raw_request(daemon.url, get + b"Cookie: " + name + b"=s\xffid\r\n") == 401
    status = await raw_request(daemon.url, put + f"Cookie: {cookie}\r\n".encode()
                               + b"X-CSRF-Token: " + csrf.encode()[:-1] + b"\xff\r\n")
    assert status == 403

"""What a review of the web page's serving found, each kept fixed: a bad static name or a bad
``Host`` port is a 4xx, never a 500 with a logged traceback (the daemon's ``/static/*`` is
public, and the hub answers anyone: each 500 was a traceback in the log, past ``RefusalLog``'s
flood limit), and a path cannot forge a log line. Real store, real aiohttp servers on port 0,
raw sockets where aiohttp's client would refuse to send the bytes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from local_store import HashingEmbedder, Store
from syncd.http import create_app
from syncd.http.security import host_name
from syncd.http.web import split_host
from syncd.hub.app import create_hub_app
from syncd.hub.store import SqliteHubStore
from tests.syncd.conftest import TOKEN


async def raw(port: int, head: bytes, body: bytes = b"") -> tuple[int, bytes]:
    """Sends ``head`` (request line and headers, as bytes) and ``body``: the answer's status
    and body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head + b"Connection: close\r\n\r\n" + body)
        await writer.drain()
        answer = await reader.read()
    finally:
        writer.close()
    return int(answer.split(b" ", 2)[1]), answer.split(b"\r\n\r\n", 1)[-1]


async def serve(app: web.Application) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, runner.addresses[0][1]


@pytest.fixture
async def daemon_port(tmp_path: Path) -> AsyncIterator[int]:
    store = await Store.open(tmp_path / "data", embedder=HashingEmbedder())
    runner, port = await serve(create_app(store, token=TOKEN))
    try:
        yield port
    finally:
        await runner.cleanup()
        await store.close()


@pytest.fixture
async def hub_port(tmp_path: Path) -> AsyncIterator[int]:
    store = await Store.open(tmp_path / "hub", embedder=HashingEmbedder())
    runner, port = await serve(create_hub_app(SqliteHubStore(store)))
    try:
        yield port
    finally:
        await runner.cleanup()
        await store.close()


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize(("header", "split"), [
    ("localhost:7777", ("localhost", 7777)),
    ("localhost", ("localhost", None)),
    ("[::1]:1", ("[::1]", 1)),
    ("127.0.0.1:65535", ("127.0.0.1", 65535)),
    ("localhost:99999", None),  # five digits, but no port
    ("localhost:65536", None),
    ("localhost:0", None),
    ("localhost:", None),
    ("hub.example:abc", None),
    ("[::1", None),
    ("[::1]evil.com", None),
    ("localhost:7777@evil.com", None),
])
def test_a_host_header_splits_into_a_name_and_a_port_1_to_65535_or_nothing(
        header: str, split: tuple[str, int | None] | None) -> None:
    assert host_name(header) == (split[0] if split else header)  # else it matches no name
    assert split_host(header) == split


async def test_a_static_name_with_nul_is_a_404_not_a_500(
        daemon_port: int, caplog: pytest.LogCaptureFixture) -> None:
    """Before: ``read_bytes`` raised ``ValueError: embedded null byte`` → 500 and a traceback,
    for anyone who could reach the port (``/static/*`` needs no credentials)."""
    caplog.set_level(logging.ERROR)
    host = f"Host: 127.0.0.1:{daemon_port}\r\n".encode()
    for name in (b"a%00.js", b"%00.js", b"app.js%00.js"):
        status, body = await raw(daemon_port, b"GET /static/" + name + b" HTTP/1.1\r\n" + host)
        assert status == 404 and b"not_found" in body, (name, body)
    assert not errors(caplog)


async def test_an_allowed_host_with_a_port_out_of_range_is_refused_not_a_500(
        daemon_port: int, caplog: pytest.LogCaptureFixture) -> None:
    """Before: ``Host: localhost:99999`` passed the allow-list, then the cookie's name came from
    ``request.url``, which raised ``Port out of range`` → 500 and a traceback on every route,
    with no credentials."""
    caplog.set_level(logging.ERROR)
    for host in (b"localhost:99999", b"127.0.0.1:65536", b"localhost:0"):
        for path in (b"/v1/agent/status", b"/ui/session", b"/", b"/ui/login?code=x"):
            status, body = await raw(daemon_port, b"GET " + path + b" HTTP/1.1\r\nHost: "
                                     + host + b"\r\n")
            assert status == 421, (host, path, status, body)
    assert not errors(caplog)


@pytest.mark.parametrize("host", [b"hub.example:99999", b"hub.example:abc", b"hub.example:0",
                                  b"[::1"])
async def test_a_hub_request_with_a_bad_host_port_is_refused_not_a_500(
        hub_port: int, caplog: pytest.LogCaptureFixture, host: bytes) -> None:
    """The hub (no Host allow-list) looks for the page's cookie on every request without
    ``Authorization``. Before: the cookie's name came from ``request.url`` → 500 and a logged
    traceback per request for ``Host: hub.example:99999`` or ``:abc``."""
    caplog.set_level(logging.ERROR)
    cookie = b"Cookie: syncd_session_99999=x; syncd_session_80=x\r\n"
    for path in (b"/v1/agent/status", b"/ui/session"):
        status, body = await raw(hub_port, b"GET " + path + b" HTTP/1.1\r\nHost: " + host
                                 + b"\r\n" + cookie)
        assert status == 401, (host, path, status, body)
    status, body = await raw(hub_port, b"POST /ui/logout HTTP/1.1\r\nHost: " + host + b"\r\n"
                             + cookie + b"Content-Type: application/json\r\n"
                             + b"Content-Length: 2\r\n", b"{}")
    assert status == 401, (host, status, body)
    assert not errors(caplog)


async def test_a_newline_in_the_path_cannot_forge_a_hub_log_line(
        hub_port: int, caplog: pytest.LogCaptureFixture) -> None:
    """Before: ``RefusalLog.note`` logged the decoded path as it was: ``%0a`` wrote a line of
    the caller's choosing into the hub's log."""
    caplog.set_level(logging.WARNING, logger="syncd.hub")
    forged = b"/v1/agent/status%0aWARNING%20syncd.hub:%20token%20admin%20revoked%0d%1b[2J"
    status, _ = await raw(hub_port, b"GET " + forged + b" HTTP/1.1\r\n"
                          + f"Host: 127.0.0.1:{hub_port}\r\n".encode())
    assert status == 401
    lines = [r.getMessage() for r in caplog.records if r.name == "syncd.hub"]
    assert len(lines) == 1, lines
    assert not any(c in lines[0] for c in "\n\r\x1b"), lines
    assert "status\\nWARNING syncd.hub: token admin revoked\\r\\x1b[2J" in lines[0], lines


async def test_a_newline_in_the_path_is_escaped_in_the_daemons_messages(
        daemon_port: int) -> None:
    """``shown_path`` is also what the daemon's error middleware logs and answers."""
    status, body = await raw(daemon_port, b"GET /nope%0aforged%00<private>secret</private> "
                             b"HTTP/1.1\r\nHost: 127.0.0.1:" + str(daemon_port).encode()
                             + b"\r\nAuthorization: Bearer " + TOKEN.encode() + b"\r\n")
    assert status == 404
    assert b"/nope\\\\nforged\\\\x00" in body and b"secret" not in body, body

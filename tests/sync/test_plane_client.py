"""The plane client's timeout bounds a silence, not a whole transfer: the control plane's
``changes`` is one unpaged body, so a laptop's first pull of a large plane over a slow link
takes as long as it takes while bytes keep coming; a server that goes quiet is still given up
on after ``timeout`` seconds. A whole request is bounded too, more loosely: a plane that stops
reading a push, or trickles an answer byte by byte, cannot hold the pass forever."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator

import msgspec
import pytest
from aiohttp import web

from syncd.sync.plane import SEND_LIMIT_FACTOR, PlaneClient, Transient

TIMEOUT = 0.5
ROWS = 8


def changes_chunks() -> list[bytes]:
    """A valid ``changes`` body cut into one piece per row."""
    nodes = [msgspec.json.encode({"id": f"memory:slow-{i}", "realm": "default",
                                  "memory_type": "fact", "content": f"row {i}",
                                  "created_at": "2026-01-01T00:00:00+00:00",
                                  "updated_at": "2026-01-01T00:00:00+00:00"})
             for i in range(ROWS)]
    head = b'{"since":"1970-01-01T00:00:00Z","until":"2026-01-02T00:00:00+00:00","memory_nodes":['
    return [head + nodes[0], *(b"," + n for n in nodes[1:]), b'],"memory_edges":[]}']


@pytest.fixture
async def slow_plane() -> AsyncIterator[tuple[str, dict[str, float]]]:
    """``/v1/agent/memory/changes`` sends its body a row at a time, ``pause`` seconds apart."""
    knobs = {"pause": 0.0}

    async def changes(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        for chunk in changes_chunks():
            await response.write(chunk)
            await asyncio.sleep(knobs["pause"])
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/v1/agent/memory/changes", changes)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", knobs
    finally:
        await runner.cleanup()


async def test_a_body_that_keeps_coming_is_read_to_its_end(
        slow_plane: tuple[str, dict[str, float]]) -> None:
    url, knobs = slow_plane
    knobs["pause"] = TIMEOUT / 3  # the whole body takes ~3 timeouts, no gap reaches one
    client = PlaneClient(url, None, timeout=TIMEOUT)
    try:
        started = time.monotonic()
        answer = await client.changes(None, None, None)
        assert time.monotonic() - started > 2 * TIMEOUT
    finally:
        await client.close()
    assert [n.id for n in answer.memory_nodes] == [f"memory:slow-{i}" for i in range(ROWS)]


async def test_a_server_gone_quiet_is_given_up_on_after_the_timeout(
        slow_plane: tuple[str, dict[str, float]]) -> None:
    url, knobs = slow_plane
    knobs["pause"] = 10 * TIMEOUT
    client = PlaneClient(url, None, timeout=TIMEOUT)
    try:
        started = time.monotonic()
        with pytest.raises(Transient, match="changes"):
            await client.changes(None, None, None)
        assert time.monotonic() - started < 5 * TIMEOUT
    finally:
        await client.close()


@pytest.mark.filterwarnings("ignore:Sending a large body:ResourceWarning")
async def test_a_push_to_a_plane_that_stops_reading_is_given_up_on() -> None:
    """The plane accepts the connection and never reads the request: with no bound on the
    whole request the body's write waited for the peer's window forever."""
    stalled: list[asyncio.Transport] = []

    class Stall(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            assert isinstance(transport, asyncio.Transport)
            transport.pause_reading()
            stalled.append(transport)

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.bind(("127.0.0.1", 0))
    server = await asyncio.get_running_loop().create_server(Stall, sock=sock)
    client = PlaneClient(f"http://127.0.0.1:{sock.getsockname()[1]}", None, timeout=TIMEOUT)
    body = b'{"memory_nodes":[{"content":"' + b"x" * (32 * 1024 * 1024) + b'"}]}'
    started = time.monotonic()
    try:
        with pytest.raises(Transient, match="import"):
            async with asyncio.timeout(SEND_LIMIT_FACTOR * TIMEOUT + 5):
                await client.import_rows(body)
        assert time.monotonic() - started < SEND_LIMIT_FACTOR * TIMEOUT + 2
    finally:
        await client.close()
        for transport in stalled:
            transport.abort()
        server.close()


async def test_an_answer_that_trickles_is_given_up_on_at_the_fetch_limit(
        slow_plane: tuple[str, dict[str, float]]) -> None:
    """Each row comes before ``timeout`` runs out, so only the bound on the whole request ends
    a body that would take far longer (here 9 pieces 0.8 timeout apart, against a limit of 4)."""
    url, knobs = slow_plane
    knobs["pause"] = TIMEOUT * 0.8
    client = PlaneClient(url, None, timeout=TIMEOUT, fetch_limit=4 * TIMEOUT)
    try:
        started = time.monotonic()
        with pytest.raises(Transient, match="changes"):
            await client.changes(None, None, None)
        assert 4 * TIMEOUT <= time.monotonic() - started < 4 * TIMEOUT + 2
    finally:
        await client.close()

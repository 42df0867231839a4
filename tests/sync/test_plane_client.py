"""The plane client's timeout bounds a silence, not a whole transfer: the control plane's
``changes`` is one unpaged body, so a laptop's first pull of a large plane over a slow link
takes as long as it takes while bytes keep coming; a server that goes quiet is still given up
on after ``timeout`` seconds."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import msgspec
import pytest
from aiohttp import web

from syncd.sync.plane import PlaneClient, Transient

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

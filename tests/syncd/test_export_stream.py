"""The daemon's export and changes, streamed a page at a time, and `syncd export` copying it
as it comes: one valid body whatever the page count, the counts in headers, and a body cut
short never replacing the file."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import logging
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from local_store.exporting import ExportSnapshot
from protocol.rows import NodeRow
from syncd.client import Client, ClientError
from syncd.http.app import EXPORT_HINT
from syncd.transfer import export_file
from tests.conftest import serving_app
from tests.syncd.conftest import TOKEN, Daemon


async def test_an_export_of_many_pages_is_one_body_with_its_counts(daemon: Daemon) -> None:
    for start in range(0, 1200, 100):  # 1,200 memories: three pages of 500
        await daemon.store.memories.save_many([{"content": f"memory {i}", "realm": "r"}
                                      for i in range(start, start + 100)])
    await daemon.store.graph.link({"memory_id": (await daemon.store.feed.read())[0][0].id,
                             "target_node_id": "entity:x"})
    status, body, headers = await daemon.call("GET", "/v1/agent/memory/export")
    assert status == 200 and isinstance(body, dict)
    assert (headers["X-Syncd-Memories"], headers["X-Syncd-Edges"]) == ("1200", "1")
    nodes, edges = await daemon.store.feed.read()
    assert [n["id"] for n in body["memory_nodes"]] == [n.id for n in nodes]
    assert len(body["memory_nodes"][0]["embedding"]) == 384
    assert [e["id"] for e in body["memory_edges"]] == [e.id for e in edges]
    assert (body["hint"], body["store_id"]) == (EXPORT_HINT, daemon.store.store_id)
    status, empty, headers = await daemon.call("GET", "/v1/agent/memory/export?realm=none")
    assert isinstance(empty, dict) and empty["memory_nodes"] == []
    assert len(empty["memory_edges"]) == 1  # edges are not filtered by realm (as the plane)
    assert (headers["X-Syncd-Memories"], headers["X-Syncd-Edges"]) == ("0", "1")



async def test_changes_of_many_pages_are_one_body_with_since_and_until(daemon: Daemon) -> None:
    """``changes?since=`` streams like export: the versions after ``since`` over three pages,
    ``since`` echoed, ``until`` read before them (so a pull from it sees later writes), the
    counts in headers."""
    for start in range(0, 1300, 100):
        await daemon.store.memories.save_many([{"content": f"memory {i}", "realm": "r"}
                                      for i in range(start, start + 100)])
    nodes, _ = await daemon.store.feed.read(since="", include_deleted=True)
    since = nodes[99].updated_at
    status, body, headers = await daemon.call("GET", "/v1/agent/memory/changes",
                                              params={"since": since})
    assert status == 200 and isinstance(body, dict)
    assert (headers["X-Syncd-Memories"], headers["X-Syncd-Edges"]) == ("1200", "0")
    assert [n["id"] for n in body["memory_nodes"]] == [n.id for n in nodes[100:]]
    assert (body["since"], body["store_id"]) == (since, daemon.store.store_id)
    assert body["memory_edges"] == []
    saved = await daemon.store.memories.save({"content": "after the pull"})
    status, later, _ = await daemon.call("GET", "/v1/agent/memory/changes",
                                         params={"since": body["until"]})
    assert isinstance(later, dict)
    assert [n["id"] for n in later["memory_nodes"]] == ["memory:" + saved["id"]]


@pytest.fixture
async def cut_short() -> AsyncIterator[str]:
    """A server whose export answer stops halfway: headers, part of the body, then a reset."""
    async def export(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json",
                                               "X-Syncd-Memories": "2", "X-Syncd-Edges": "0"})
        await response.prepare(request)
        await response.write(b'{"memory_nodes":[{"id":"memory:a"},')
        await asyncio.sleep(0.05)
        assert request.transport is not None
        request.transport.abort()
        return response

    app = web.Application()
    app.router.add_get("/v1/agent/memory/export", export)
    async with serving_app(app) as url:
        yield url


async def test_a_body_cut_short_is_an_error_and_never_replaces_the_file(
        cut_short: str, tmp_path: Path) -> None:
    client = Client(cut_short, TOKEN, timeout=10)
    with pytest.raises(ClientError, match="cut short"):
        await asyncio.to_thread(client.download, "/v1/agent/memory/export", io.BytesIO())
    kept = tmp_path / "export.json"
    await asyncio.to_thread(kept.write_text, '{"memory_nodes": [], "memory_edges": []}')
    args = argparse.Namespace(realm=None, output=kept)
    with pytest.raises(ClientError, match="cut short"):
        await asyncio.to_thread(export_file, client, args)
    assert json.loads(await asyncio.to_thread(kept.read_text)) == {
        "memory_nodes": [], "memory_edges": []}  # the earlier export, whole
    left = await asyncio.to_thread(lambda: sorted(p.name for p in tmp_path.iterdir()))
    assert left == ["export.json"]  # and no part of the cut one


@pytest.mark.parametrize("path", ["/v1/agent/memory/export",
                                  "/v1/agent/memory/changes?since="])
async def test_a_failure_mid_answer_cuts_the_body_and_the_daemon_keeps_serving(
        daemon: Daemon, monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    """Once the answer has begun, a failure cannot become an error answer: the connection is
    dropped, so the client sees a cut body (never a short valid one), and the next request
    is served as usual."""
    for start in range(0, 1200, 100):
        await daemon.store.memories.save_many([{"content": f"memory {i}"} for i in range(start, start + 100)])
    read = ExportSnapshot._node_page
    calls: list[int] = []

    def failing(self: ExportSnapshot, after: int) -> tuple[list[NodeRow], int]:
        calls.append(after)
        if len(calls) == 2:
            raise sqlite3.OperationalError("disk I/O error")
        return read(self, after)

    monkeypatch.setattr(ExportSnapshot, "_node_page", failing)
    client = Client(daemon.url, TOKEN, timeout=10)
    with pytest.raises(ClientError, match="cut short"):
        await asyncio.to_thread(client.download, path, io.BytesIO())
    status, body, _ = await daemon.call("GET", path)
    assert status == 200 and isinstance(body, dict) and len(body["memory_nodes"]) == 1200


async def test_a_client_hanging_up_mid_export_is_not_an_error_in_the_log(
        daemon: Daemon, caplog: pytest.LogCaptureFixture) -> None:
    """``curl … | head -c 10``: the client goes away; that is no failure of the daemon's."""
    for start in range(0, 3000, 500):  # ~5 MB of rows: more than the socket buffers hold
        await daemon.store.memories.save_many([{"content": f"memory {i} " + "x" * 200, "realm": "r"}
                                      for i in range(start, start + 500)])
    host, port = "127.0.0.1", daemon.port
    with caplog.at_level(logging.DEBUG, logger="syncd"):
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(f"GET /v1/agent/memory/export HTTP/1.1\r\nHost: {host}:{port}\r\n"
                     f"Authorization: Bearer {TOKEN}\r\n\r\n".encode())
        await writer.drain()
        assert (await reader.read(10)).startswith(b"HTTP/1.1 2")
        writer.transport.abort()  # hang up, unread bytes and all
        status, _, _ = await daemon.call("GET", "/healthz")  # still serving; the stream ended
        assert status == 200
        for _ in range(100):  # the answer's task notices the hang-up within a write or two
            if any("went away" in r.getMessage() for r in caplog.records):
                break
            await asyncio.sleep(0.02)
    assert any("went away" in r.getMessage() for r in caplog.records)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []

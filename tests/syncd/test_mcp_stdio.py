"""``syncd mcp`` (the stdio bridge) against a real daemon app on a real port: driven by the
official MCP client, by a raw subprocess with nothing listening, and in-process for the edges."""

from __future__ import annotations

import asyncio
import io
import json
import os
import socket
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import anyio
import pytest
from aiohttp import web
from mcp import ClientSession, MCPError, StdioServerParameters, stdio_client

from local_store import HashingEmbedder, Store
from syncd.http import create_app
from syncd.mcp import McpServer
from syncd.mcp_stdio import not_running_message, run_stdio_bridge, token_from_file
from syncd.tools import TOOLS, Surfacer

TOKEN = "stdio-test-token-0123456789"
REPO = Path(__file__).resolve().parents[2]
DEADLINE = 60.0


@dataclass
class Daemon:
    url: str
    store: Store
    token_file: Path


@pytest.fixture
async def daemon(tmp_path: Path) -> AsyncIterator[Daemon]:
    """The daemon's real app (``syncd.http.create_app``) with the MCP route, on port 0."""
    store = await Store.open(tmp_path / "data", embedder=HashingEmbedder())
    app = create_app(store, token=TOKEN, mcp=McpServer(store, Surfacer()))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    token_file = tmp_path / "api-token"
    token_file.write_text(TOKEN + "\n")
    try:
        yield Daemon(f"http://127.0.0.1:{port}", store, token_file)
    finally:
        await runner.cleanup()
        await store.close()


def free_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def bridge_argv(url: str, token_file: Path, *extra: str) -> list[str]:
    return ["-m", "syncd.mcp_stdio", "--url", url, "--token-file", str(token_file), *extra]


# ---------------------------------------------------------------------- the official client


async def test_official_mcp_client_round_trip(daemon: Daemon, tmp_path: Path) -> None:
    params = StdioServerParameters(command=sys.executable,
                                   args=bridge_argv(daemon.url, daemon.token_file), cwd=REPO)
    with (tmp_path / "bridge.stderr").open("w+") as errlog:
        with anyio.fail_after(DEADLINE):
            async with stdio_client(params, errlog=errlog) as (read, write), \
                    ClientSession(read, write, read_timeout_seconds=30) as session:
                init = await session.initialize()
                assert init.server_info.name == "syncd"
                assert init.protocol_version == "2025-11-25"
                assert init.instructions and "memory_search" in init.instructions
                assert init.capabilities.tools is not None

                listed = await session.list_tools()
                assert [t.name for t in listed.tools] == list(TOOLS)
                schemas = {t.name: t.input_schema for t in listed.tools}
                assert schemas["save_memory"]["required"] == ["content"]

                saved = await session.call_tool("save_memory", {
                    "content": "the staging database is reset every Monday at 06:00 UTC",
                    "title": "Staging reset", "memory_type": "fact", "realm": "proj",
                    "conversationId": "agent-1"})
                assert saved.is_error is False
                body = saved.structured_content
                assert isinstance(body, dict) and body["saved"] is True
                assert body["conversationId"] == "agent-1"
                assert json.loads(_text(saved.content)) == body

                found = await session.call_tool("memory_search", {
                    "query": "when is staging reset", "realms": ["proj"],
                    "conversationId": "agent-1"})
                assert found.is_error is False
                hits = found.structured_content
                assert isinstance(hits, dict)
                assert hits["memories"][0]["id"] == body["node_id"]
                assert hits["memories"][0]["content_preview"].startswith("the staging database")
                assert hits["relevant_memories"][0]["id"] == body["node_id"]

                bad = await session.call_tool("save_memory", {"content": 42})
                assert bad.is_error is True
                assert json.loads(_text(bad.content))["error"]["field"] == "content"

                with pytest.raises(MCPError) as unknown:
                    await session.call_tool("no_such_tool", {})
                assert unknown.value.error.code == -32602

                await session.send_ping()
        errlog.seek(0)
        assert errlog.read() == ""  # nothing went wrong, so nothing was said
    stored = await daemon.store.memories.list_memories({"realm": "proj"})
    assert stored["row_count"] == 1


def _text(content: list[Any]) -> str:
    [block] = content
    assert block.type == "text"
    text: str = block.text
    return text


# ---------------------------------------------------------------------- no daemon


async def test_without_a_daemon_requests_get_an_error_and_eof_exits_0(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    token_file = tmp_path / "api-token"
    token_file.write_text("whatever")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *bridge_argv(url, token_file, "--initialize-wait", "1.5"), cwd=REPO,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    loop = asyncio.get_running_loop()
    try:
        lines = [
            {"jsonrpc": "2.0", "id": 1, "method": "initialize",
             "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                        "clientInfo": {"name": "t", "version": "0"}}},
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "id": "two", "method": "tools/list"},
        ]
        proc.stdin.write(b"".join(json.dumps(m).encode() + b"\n" for m in lines))
        await proc.stdin.drain()
        sent = loop.time()
        first = json.loads(await asyncio.wait_for(proc.stdout.readline(), DEADLINE))
        assert loop.time() - sent >= 1.5  # initialize waited for a daemon to come up
        second = json.loads(await asyncio.wait_for(proc.stdout.readline(), DEADLINE))
        for answer, request_id in ((first, 1), (second, "two")):
            assert answer["jsonrpc"] == "2.0" and answer["id"] == request_id
            assert answer["error"]["code"] == -32000
            assert answer["error"]["message"] == not_running_message(url)
            assert "syncd run" in answer["error"]["message"]
        # An id UTF-8 cannot carry (a lone surrogate, which JSON can spell) comes back as it
        # was spelled; before, failing to encode it was taken for a closed stdout.
        proc.stdin.write(b'{"jsonrpc":"2.0","id":"\\ud800","method":"ping"}\n')
        await proc.stdin.drain()
        odd = await asyncio.wait_for(proc.stdout.readline(), DEADLINE)
        assert b'"id":"\\ud800"' in odd and json.loads(odd)["error"]["code"] == -32000
        # Still going after the failures: one more request, then EOF.
        proc.stdin.write(b'{"jsonrpc":"2.0","id":3,"method":"ping"}\n')
        await proc.stdin.drain()
        third = json.loads(await asyncio.wait_for(proc.stdout.readline(), DEADLINE))
        assert third["id"] == 3 and third["error"]["code"] == -32000
        proc.stdin.close()
        rest = await asyncio.wait_for(proc.stdout.read(), DEADLINE)
        code = await asyncio.wait_for(proc.wait(), DEADLINE)
        assert proc.stderr is not None
        stderr = (await proc.stderr.read()).decode()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert code == 0
    assert rest == b""  # the notification got no answer, and nothing but JSON-RPC on stdout
    assert "not running" in stderr  # diagnostics go to stderr
    assert stderr.count("waiting up to") == 1


async def test_initialize_waits_for_a_daemon_that_is_starting(tmp_path: Path) -> None:
    """An agent launched at login, before the daemon is up and has written its token: the
    handshake waits and succeeds once it is, instead of leaving the session without tools."""
    port = free_port()
    token_file = tmp_path / "api-token"  # not there yet: the daemon writes it on first start
    stdin = io.BytesIO(json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                    "clientInfo": {"name": "t", "version": "0"}}}).encode() + b"\n"
        + b'{"jsonrpc":"2.0","id":2,"method":"tools/list"}\n')
    stdout = io.BytesIO()
    bridging = asyncio.create_task(run_stdio_bridge(
        f"http://127.0.0.1:{port}", token_from_file(token_file), stdin=stdin, stdout=stdout,
        initialize_wait=DEADLINE))
    await asyncio.sleep(1.2)
    assert stdout.getvalue() == b"" and not bridging.done()  # still waiting, nothing said
    store = await Store.open(tmp_path / "data", embedder=HashingEmbedder())
    runner = web.AppRunner(create_app(store, token=TOKEN, mcp=McpServer(store, Surfacer())))
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.to_thread(token_file.write_text, TOKEN + "\n")
        assert await asyncio.wait_for(bridging, DEADLINE) == 0
    finally:
        await runner.cleanup()
        await store.close()
    init, listed = (json.loads(line) for line in stdout.getvalue().splitlines())
    assert init["id"] == 1 and init["result"]["serverInfo"]["name"] == "syncd"
    assert listed["id"] == 2 and len(listed["result"]["tools"]) == len(TOOLS)


# ---------------------------------------------------------------------- in-process edges


async def bridge(url: str, token: Any, messages: list[bytes]) -> list[Any]:
    """Run the bridge over in-memory stdin/stdout; the decoded stdout lines."""
    stdin = io.BytesIO(b"".join(m + b"\n" for m in messages))
    stdout = io.BytesIO()
    code = await asyncio.wait_for(run_stdio_bridge(url, token, stdin=stdin, stdout=stdout),
                                  DEADLINE)
    assert code == 0
    raw = stdout.getvalue()
    assert raw == b"" or raw.endswith(b"\n")
    return [json.loads(line) for line in raw.splitlines()]


async def test_bridge_forwards_requests_batches_and_drops_notification_answers(
        daemon: Daemon) -> None:
    out = await bridge(daemon.url, TOKEN, [
        b'{"jsonrpc":"2.0","id":1,"method":"ping"}',
        b"",
        b'{"jsonrpc":"2.0","method":"notifications/initialized"}',
        b'[{"jsonrpc":"2.0","id":2,"method":"tools/list"},'
        b'{"jsonrpc":"2.0","method":"notifications/initialized"}]',
        b'[{"jsonrpc":"2.0","method":"notifications/initialized"}]',
        b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"save_memory",'
        b'"arguments":{"content":"line one\\nline two \xe2\x9c\x93"}}}',
        b"{not json",
        b"[]",
    ])
    assert out[0] == {"jsonrpc": "2.0", "id": 1, "result": {}}
    assert isinstance(out[1], list) and [a["id"] for a in out[1]] == [2]
    assert len(out[1][0]["result"]["tools"]) == len(TOOLS)
    assert out[2]["id"] == 3 and out[2]["result"]["structuredContent"]["saved"] is True
    assert out[3] == {"jsonrpc": "2.0", "id": None,
                      "error": {"code": -32700, "message": "Parse error: not JSON"}}
    assert out[4]["id"] is None and out[4]["error"]["code"] == -32600
    assert len(out) == 5
    rows = (await daemon.store.memories.list_memories({}))["rows"]
    assert rows[0]["content_preview"] == "line one\nline two ✓"


async def test_bridge_reports_a_refused_token(daemon: Daemon) -> None:
    out = await bridge(daemon.url, "wrong-token", [
        b'{"jsonrpc":"2.0","id":1,"method":"ping"}',
        b'{"jsonrpc":"2.0","method":"notifications/initialized"}',
        b'[{"jsonrpc":"2.0","id":2,"method":"ping"},{"jsonrpc":"2.0","method":"x"}]',
    ])
    assert len(out) == 2
    assert out[0]["id"] == 1 and out[0]["error"]["code"] == -32000
    assert "refused the API token (HTTP 401" in out[0]["error"]["message"]
    assert isinstance(out[1], list) and [a["id"] for a in out[1]] == [2]


async def test_bridge_rereads_the_token_file(daemon: Daemon, tmp_path: Path) -> None:
    token_file = tmp_path / "late-token"
    tokens = token_from_file(token_file)
    out = await bridge(daemon.url, tokens, [b'{"jsonrpc":"2.0","id":1,"method":"ping"}'])
    assert out[0]["error"]["code"] == -32000 and "no API token" in out[0]["error"]["message"]
    token_file.write_text("stale")
    out = await bridge(daemon.url, tokens, [b'{"jsonrpc":"2.0","id":2,"method":"ping"}'])
    assert "refused the API token" in out[0]["error"]["message"]
    token_file.write_text(TOKEN)  # rotated: the next refusal re-reads it and succeeds
    out = await bridge(daemon.url, tokens, [b'{"jsonrpc":"2.0","id":3,"method":"ping"}'])
    assert out == [{"jsonrpc": "2.0", "id": 3, "result": {}}]


async def serve(store: Store, port: int = 0) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(create_app(store, token=TOKEN, mcp=McpServer(store, Surfacer())))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    bound: int = runner.addresses[0][1]
    return runner, bound


async def test_bridge_survives_a_daemon_restart(store: Store) -> None:
    """Down mid-session: requests get -32000 and the bridge goes on; back up: answers again
    (the kept-alive connection to the old daemon is dropped, not reported)."""
    first, port = await serve(store)
    url = f"http://127.0.0.1:{port}"
    in_read, in_write = _pipe()
    out_read, out_write = _pipe()
    task = asyncio.create_task(run_stdio_bridge(url, TOKEN, stdin=in_read, stdout=out_write))
    second: web.AppRunner | None = None
    answers: list[Any] = []

    async def ask(request_id: int) -> None:
        line = b'{"jsonrpc":"2.0","id":%d,"method":"ping"}\n' % request_id
        await asyncio.to_thread(in_write.write, line)
        answer = await asyncio.wait_for(asyncio.to_thread(out_read.readline), DEADLINE)
        answers.append(json.loads(answer))

    try:
        await ask(1)
        await first.cleanup()
        await ask(2)
        second, _ = await serve(store, port)
        await ask(3)
    finally:
        in_write.close()
        code = await asyncio.wait_for(task, DEADLINE)
        for end in (in_read, out_read, out_write):
            end.close()
        await first.cleanup()
        if second is not None:
            await second.cleanup()
    assert code == 0
    assert answers[0] == {"jsonrpc": "2.0", "id": 1, "result": {}}
    assert answers[1]["id"] == 2 and answers[1]["error"] == {
        "code": -32000, "message": not_running_message(url)}
    assert answers[2] == {"jsonrpc": "2.0", "id": 3, "result": {}}


def _pipe() -> tuple[BinaryIO, BinaryIO]:
    r, w = os.pipe()
    return open(r, "rb", buffering=0), open(w, "wb", buffering=0)

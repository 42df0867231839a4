"""Review fixes in the MCP and HTTP layer: bodies too deep to decode, valid JSON msgspec refuses,
the ``MCP-Protocol-Version`` header, an unknown tool route, the ``conversationId`` cap, field
names in msgspec errors, and no ``<private>`` text echoed in an error or a log line (P7).

Real stores, real aiohttp servers on port 0, a real ``syncd mcp`` subprocess; no mocks.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from local_store import HashingEmbedder, Store, ValidationError
from local_store.records import MAX_KEY_CHARS
from syncd.http.app import errors_middleware
from syncd.hub.app import create_hub_app
from syncd.hub.store import SqliteHubStore
from syncd.mcp import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    PARSE_ERROR,
    SUPPORTED_PROTOCOL_VERSIONS,
    McpServer,
    encode_message,
)
from syncd.mcp_stdio import _safe_json
from syncd.tools import Surfacer
from tests.syncd.conftest import TOKEN, Daemon

REPO = Path(__file__).resolve().parents[2]
DEADLINE = 60.0
CANARY = "CANARY-7f3e9c"
PRIVATE = f"x<private>{CANARY}</private>"
UNCLOSED = f"x<private>{CANARY}"  # private to the end; no "/", so it fits one path segment
DEEP = b"[" * 5000 + b"]" * 5000  # valid JSON; past every decoder's recursion limit


@pytest.fixture
def server(store: Store) -> McpServer:
    return McpServer(store, Surfacer())


async def post(daemon: Daemon, path: str, body: bytes, **headers: str) -> tuple[int, Any]:
    status, answer, _ = await daemon.call(
        "POST", path, data=body, headers=daemon.auth(**{"Content-Type": "application/json",
                                                         **headers}))
    return status, answer


def rpc(request_id: object, method: str, params: object = None) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return json.dumps(message).encode()


async def tool_result(server: McpServer, name: str, arguments: object) -> dict[str, Any]:
    answer = await server.handle({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                  "params": {"name": name, "arguments": arguments}})
    assert isinstance(answer, dict) and answer["id"] == 1 and "result" in answer, answer
    result: dict[str, Any] = answer["result"]
    return result


async def save_error(server: McpServer, request_id: int, arguments: bytes) -> dict[str, Any]:
    """The tool error of a raw ``save_memory`` call (its arguments as raw JSON text)."""
    raw = await server.handle_bytes(
        b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"save_memory",'
        b'"arguments":%s}}' % (request_id, arguments))
    assert raw is not None
    answer = json.loads(raw)
    assert answer["id"] == request_id and answer["result"]["isError"] is True, answer
    error: dict[str, Any] = answer["result"]["structuredContent"]["error"]
    return error


# ---------------------------------------------------------------------- bodies too deep


async def test_http_body_nested_too_deeply_is_400_bad_json(daemon: Daemon) -> None:
    """json.loads raises RecursionError (not ValueError) past its depth: that was a 500."""
    before = await daemon.store.dump()
    for path, body in (("/v1/agent/memory/query", b'{"query":' + DEEP + b"}"),
                       ("/v1/agent/memory/tools/save_memory", b'{"content":' + DEEP + b"}"),
                       ("/v1/agent/memory/import", DEEP)):
        status, answer = await post(daemon, path, body)
        assert status == 400, (path, status, answer)
        assert answer["error"]["code"] == "bad_json"
        assert "nested too deeply" in answer["error"]["message"]
    assert await daemon.store.dump() == before


async def test_mcp_body_nested_too_deeply_is_a_json_rpc_parse_error(daemon: Daemon) -> None:
    """msgspec raises RecursionError past its depth: that was a REST-shaped 500 on /mcp/v1."""
    raw = await McpServer(daemon.store, Surfacer()).handle_bytes(DEEP)
    assert raw is not None
    assert json.loads(raw) == {"jsonrpc": "2.0", "id": None, "error": {
        "code": PARSE_ERROR, "message": "Parse error: JSON nested too deeply"}}
    status, answer = await post(daemon, "/mcp/v1", DEEP)
    assert status == 200 and answer["id"] is None and answer["error"]["code"] == PARSE_ERROR
    status, answer = await post(daemon, "/mcp/v1", rpc(2, "ping"))  # and it keeps serving
    assert (status, answer["result"]) == (200, {})


async def test_stdio_bridge_answers_a_line_nested_too_deeply_and_keeps_serving(
        daemon: Daemon, tmp_path: Path) -> None:
    """The bridge died on such a line: RecursionError in ``forward``, then again in the
    catch-all's ``_safe_json``, outside any handler."""
    token_file = tmp_path / "api-token"
    token_file.write_text(TOKEN + "\n")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "syncd.mcp_stdio", "--url", daemon.url, "--token-file",
        str(token_file), "--initialize-wait", "0", cwd=REPO, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(DEEP + b"\n" + rpc(2, "ping") + b"\n")
        await proc.stdin.drain()
        proc.stdin.close()
        out = await asyncio.wait_for(proc.stdout.read(), DEADLINE)
        code = await asyncio.wait_for(proc.wait(), DEADLINE)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert code == 0
    assert [json.loads(line) for line in out.splitlines()] == [
        {"jsonrpc": "2.0", "id": None,
         "error": {"code": PARSE_ERROR, "message": "Parse error: JSON nested too deeply"}},
        {"jsonrpc": "2.0", "id": 2, "result": {}}]
    assert _safe_json(DEEP) is None  # the catch-all's own decode cannot fail either


# ---------------------------------------------------------------------- valid JSON msgspec refuses


async def test_valid_json_msgspec_refuses_keeps_its_id(server: McpServer) -> None:
    """A number beyond double range and an escaped lone surrogate are valid JSON (the stdlib,
    the bridge and the REST routes read them) but msgspec refuses them: that was -32700 with
    id null, so the client could not match the answer to its request."""
    error = await save_error(server, 7, b'{"content":"x","importance":1e400}')
    assert error["field"] == "importance"

    raw = await server.handle_bytes(b'{"jsonrpc":"2.0","id":"\\ud800","method":"ping"}')
    assert raw == b'{"jsonrpc":"2.0","id":"\\ud800","result":{}}'  # escaped, as it came


async def test_what_is_not_json_stays_a_parse_error(server: McpServer) -> None:
    """The stdlib fallback still refuses NaN and Infinity (not JSON) and text that is not
    UTF-8; an id it reads as infinity cannot be echoed, so it is an Invalid Request."""
    for body in (b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":NaN}}',
                 b'{"jsonrpc":"2.0","id":-Infinity,"method":"ping"}',
                 b'{"jsonrpc":"2.0","id":1,"method":"p\xffing"}'):
        raw = await server.handle_bytes(body)
        assert raw is not None and json.loads(raw) == {"jsonrpc": "2.0", "id": None, "error": {
            "code": PARSE_ERROR, "message": "Parse error: not JSON"}}, body
    raw = await server.handle_bytes(b'{"jsonrpc":"2.0","id":1e400,"method":"ping"}')
    assert raw is not None
    answer = json.loads(raw)
    assert answer["id"] is None and answer["error"]["code"] == INVALID_REQUEST


def test_an_answer_that_cannot_be_json_is_an_internal_error() -> None:
    assert encode_message({"id": "\ud800", "n": 1.5}) == b'{"id":"\\ud800","n":1.5}'
    answer = json.loads(encode_message({"id": "\ud800", "n": float("inf")}))
    assert answer["id"] is None and answer["error"]["code"] == INTERNAL_ERROR


async def test_http_mcp_echoes_a_lone_surrogate_id(daemon: Daemon) -> None:
    status, answer = await post(daemon, "/mcp/v1",
                                b'{"jsonrpc":"2.0","id":"\\ud800","method":"ping"}')
    assert status == 200 and answer == {"jsonrpc": "2.0", "id": "\ud800", "result": {}}


async def test_a_lone_surrogate_in_arguments_is_refused_naming_the_field(
        server: McpServer, store: Store) -> None:
    """No UTF-8 text (nor SQLite) can hold a lone surrogate: read as valid JSON, it reached
    the write and failed it as an internal error."""
    before = await store.dump()
    error = await save_error(server, 3, b'{"content":"a\\ud800 b"}')
    assert error["field"] == "content"
    assert await store.dump() == before


async def test_a_lone_surrogate_in_a_rest_body_is_400_bad_json(daemon: Daemon) -> None:
    """It was a 500 (the write, or recall's keyword query, failed on it). A proper pair (an
    emoji spelled as two escapes) is text like any other."""
    before = await daemon.store.dump()
    for path, body in (("/v1/agent/memory/query", b'{"query":"x\\udc00"}'),
                       ("/v1/agent/memory/tools/save_memory", b'{"content":"x\\ud800"}'),
                       ("/v1/agent/memory/tools/save_memory", b'{"con\\ud800":"x"}')):
        status, answer = await post(daemon, path, body)
        assert status == 400 and answer["error"]["code"] == "bad_json", (path, body, answer)
        assert "surrogate" in answer["error"]["message"]
    # not as an escape: its raw (CESU) bytes, or a UTF-16 body; JSON over HTTP is UTF-8
    stamp = "2026-01-01T00:00:00+00:00"
    for body in (b'{"memory_nodes":[{"id":"memory:u1","content":"be\xed\xa0\x80ta",'
                 b'"updated_at":"' + stamp.encode() + b'"}]}',
                 ('{"memory_nodes":[{"id":"memory:u2","content":"be\\ud800ta","updated_at":"'
                  + stamp + '"}]}').encode("utf-16-le")):
        status, answer = await post(daemon, "/v1/agent/memory/import", body)
        assert status == 400 and answer["error"]["code"] == "bad_json", (body[:40], answer)
    assert await daemon.store.dump() == before
    status, answer = await post(daemon, "/v1/agent/memory/tools/save_memory",
                                b'{"content":"ship it \\ud83d\\ude80"}')
    assert status == 200, answer
    assert (await daemon.store.get(answer["node_id"]))["content"] == "ship it \U0001f680"


# ---------------------------------------------------------------------- HTTP transport


async def test_http_mcp_refuses_an_unsupported_protocol_version_header(daemon: Daemon) -> None:
    """Streamable HTTP: an unsupported ``MCP-Protocol-Version`` MUST get 400; it was ignored."""
    status, answer = await post(daemon, "/mcp/v1", rpc(1, "ping"),
                                **{"MCP-Protocol-Version": "1999-01-01"})
    assert status == 400 and answer["id"] is None
    assert answer["error"]["code"] == INVALID_REQUEST
    assert all(v in answer["error"]["message"] for v in SUPPORTED_PROTOCOL_VERSIONS)
    status, answer = await post(daemon, "/mcp/v1", rpc(2, "ping"),
                                **{"MCP-Protocol-Version": PRIVATE})
    assert status == 400 and CANARY not in json.dumps(answer)
    for version in SUPPORTED_PROTOCOL_VERSIONS:
        status, answer = await post(daemon, "/mcp/v1", rpc(3, "ping"),
                                    **{"MCP-Protocol-Version": version})
        assert (status, answer["result"]) == (200, {}), version
    status, answer = await post(daemon, "/mcp/v1", rpc(4, "ping"))  # no header: before 2025-06
    assert (status, answer["result"]) == (200, {})
    # ``initialize`` negotiates: a client newer than this server is answered with its version
    status, answer = await post(daemon, "/mcp/v1", rpc(5, "initialize", {
        "protocolVersion": "2999-01-01", "capabilities": {},
        "clientInfo": {"name": "future", "version": "1"}}),
        **{"MCP-Protocol-Version": "2999-01-01"})
    assert status == 200 and answer["result"]["protocolVersion"] in SUPPORTED_PROTOCOL_VERSIONS


async def test_http_unknown_tool_route_is_404(daemon: Daemon) -> None:
    """It was 422 "invalid" naming the field "name", which is not in the body."""
    for body in (b"{}", b"{not json"):  # the route does not exist: its body is not read
        status, answer = await post(daemon, "/v1/agent/memory/tools/drop_tables", body)
        assert status == 404 and answer["error"]["code"] == "not_found", (status, answer)
        assert "drop_tables" in answer["error"]["message"]


async def test_http_msgspec_error_names_the_missing_field(daemon: Daemon) -> None:
    """msgspec's "Object missing required field `query`" has no `$.` path: it named "body"."""
    status, answer = await post(daemon, "/v1/agent/memory/query", b'{"limit":3}')
    assert status == 422 and answer["error"]["field"] == "query", answer
    status, answer = await post(daemon, "/v1/agent/memory/query", b'{"query":"x","limit":"a"}')
    assert status == 422 and answer["error"]["field"] == "limit", answer


# ---------------------------------------------------------------------- conversationId


async def test_conversation_id_is_capped_at_the_key_limit(daemon: Daemon) -> None:
    """It had no limit: a multi-megabyte id was kept as a key (up to 1000 conversations) and
    echoed in every result."""
    server = McpServer(daemon.store, Surfacer())
    result = await tool_result(server, "list_memories",
                               {"conversationId": "c" * (MAX_KEY_CHARS + 1)})
    assert result["isError"] is True
    error = result["structuredContent"]["error"]
    assert (error["code"], error["field"]) == ("invalid", "conversationId"), error
    longest = "c" * MAX_KEY_CHARS
    result = await tool_result(server, "list_memories", {"conversationId": longest})
    assert result["isError"] is False and result["structuredContent"]["conversationId"] == longest
    status, answer = await post(daemon, "/v1/agent/memory/tools/list_memories",
                                json.dumps({"conversationId": "c" * 10_000}).encode())
    assert status == 422 and answer["error"]["field"] == "conversationId", answer


# ---------------------------------------------------------------------- no private text echoed


class _Exploding(Surfacer):
    async def call(self, store: Store, name: str, args: Mapping[str, Any]) -> Any:
        raise RuntimeError("boom")


async def test_internal_error_log_redacts_argument_keys(
        store: Store, caplog: pytest.LogCaptureFixture) -> None:
    server = McpServer(store, _Exploding())
    with caplog.at_level(logging.ERROR, logger="syncd.mcp"):
        result = await tool_result(server, "save_memory", {"content": "x", PRIVATE: "v"})
    assert result["structuredContent"]["error"]["code"] == "internal"
    assert CANARY not in caplog.text
    assert "argument keys: content, x[redacted]" in caplog.text


async def test_mcp_unknown_tool_and_method_do_not_echo_private_text(
        server: McpServer, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="syncd"):
        answers = [await server.handle({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                        "params": {"name": PRIVATE, "arguments": {}}}),
                   await server.handle({"jsonrpc": "2.0", "id": 2, "method": PRIVATE})]
        with pytest.raises(ValidationError) as refused:
            await Surfacer().call(server.store, PRIVATE, {})
    text = json.dumps(answers) + str(refused.value)
    assert CANARY not in text and CANARY not in caplog.text, text
    assert text.count("x[redacted]") == 3


async def test_http_errors_do_not_echo_a_private_path(
        daemon: Daemon, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        for method, path in (("GET", f"/v1/agent/{PRIVATE}"),  # no route
                             ("POST", f"/v1/agent/memory/tools/{PRIVATE}"),
                             ("POST", f"/v1/agent/memory/tools/{UNCLOSED}"),  # no tool
                             ("GET", f"/static/{UNCLOSED}.js")):  # no such file
            status, answer, _ = await daemon.call(
                method, path, data=b"{}", headers=daemon.auth(
                    **{"Content-Type": "application/json"}))
            assert status == 404 and isinstance(answer, dict), (path, status, answer)
            assert answer["error"]["code"] == "not_found"
            assert CANARY not in json.dumps(answer) and "[redacted]" in json.dumps(answer)
    # the daemon runs without aiohttp's access log (daemon.py): its own log lines only
    assert not [r for r in caplog.records if r.name.startswith("syncd") and CANARY in r.message]


async def test_an_unexpected_failure_logs_the_path_redacted(
        caplog: pytest.LogCaptureFixture) -> None:
    async def broken(request: web.Request) -> web.Response:
        raise RuntimeError("a bug")

    app = web.Application(middlewares=[errors_middleware])
    app.router.add_get("/broken/{rest:.*}", broken)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/broken/{PRIVATE}"
        async with aiohttp.ClientSession() as session, session.get(url) as resp:
            assert resp.status == 500
    finally:
        await runner.cleanup()
    assert "GET /broken/x[redacted] failed" in caplog.text
    assert not [r for r in caplog.records if r.name.startswith("syncd") and CANARY in r.message]


async def test_hub_refusal_log_does_not_echo_a_private_path(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = await Store.open(tmp_path / "hub", embedder=HashingEmbedder(), feed=True)
    runner = web.AppRunner(create_hub_app(SqliteHubStore(store)))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1/agent/{PRIVATE}"
    try:
        with caplog.at_level(logging.WARNING, logger="syncd.hub"):
            async with aiohttp.ClientSession() as session, session.get(
                    url, headers={"Authorization": "Bearer not-a-token"}) as resp:
                assert resp.status == 401
    finally:
        await runner.cleanup()
        await store.close()
    assert "refused GET /v1/agent/x[redacted]" in caplog.text
    assert CANARY not in caplog.text

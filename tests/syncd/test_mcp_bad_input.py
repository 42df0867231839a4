"""Review fixes in the MCP and HTTP layer: bodies too deep to decode, valid JSON msgspec refuses,
the ``MCP-Protocol-Version`` header, an unknown tool route, the ``conversationId`` cap, field
names in msgspec errors, no ``<private>`` text echoed in an error or a log line (P7); then a
lone surrogate in any tool argument, surfaced memories read again (and not lost to parallel
calls), strict JSON through the stdio bridge, recall on a closed store, null ids, and the
field of a not-found error.

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
from tests.store_probe import dump_tables
from tests.syncd.conftest import TOKEN, Daemon
from tests.syncd.test_mcp_stdio import bridge_argv, free_port

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
    before = await dump_tables(daemon.store)
    for path, body in (("/v1/agent/memory/query", b'{"query":' + DEEP + b"}"),
                       ("/v1/agent/memory/tools/save_memory", b'{"content":' + DEEP + b"}"),
                       ("/v1/agent/memory/import", DEEP)):
        status, answer = await post(daemon, path, body)
        assert status == 400, (path, status, answer)
        assert answer["error"]["code"] == "bad_json"
        assert "nested too deeply" in answer["error"]["message"]
    assert await dump_tables(daemon.store) == before


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
    before = await dump_tables(store)
    error = await save_error(server, 3, b'{"content":"a\\ud800 b"}')
    assert error["field"] == "content"
    assert await dump_tables(store) == before


async def test_a_lone_surrogate_in_a_rest_body_is_400_bad_json(daemon: Daemon) -> None:
    """It was a 500 (the write, or recall's keyword query, failed on it). A proper pair (an
    emoji spelled as two escapes) is text like any other."""
    before = await dump_tables(daemon.store)
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
    assert await dump_tables(daemon.store) == before
    status, answer = await post(daemon, "/v1/agent/memory/tools/save_memory",
                                b'{"content":"ship it \\ud83d\\ude80"}')
    assert status == 200, answer
    assert (await daemon.store.memories.get(answer["node_id"]))["content"] == "ship it \U0001f680"


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


# ---------------------------------------------------------------------- every argument is text


@pytest.mark.parametrize(("name", "arguments", "field"), [
    ("save_memory", b'{"content":"kept out","conversationId":"c\\ud800"}', "conversationId"),
    ("update_memory_status", b'{"memory_id":"a\\ud800","status":"active"}', "memory_id"),
    ("memory_search", b'{"query":"x","realms":["r\\ud800"]}', "realms"),
    ("list_memories", b'{"memoryContext":"\\udc00"}', "memoryContext"),
])
async def test_a_lone_surrogate_in_any_argument_is_refused_before_the_tool_runs(
        server: McpServer, store: Store, name: str, arguments: bytes, field: str) -> None:
    """Arguments the store does not read strictly reached the handler: a conversationId was
    saved with, then failed encoding the result (-32603, the memory written); an id or a realm
    failed in SQLite as an ``internal`` tool error with no field."""
    await store.memories.save({"content": "already here"})
    before = await dump_tables(store)
    raw = await server.handle_bytes(
        b'{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"%s","arguments":%s}}'
        % (name.encode(), arguments))
    assert raw is not None
    answer = json.loads(raw)
    assert answer["id"] == 9 and answer["result"]["isError"] is True, answer
    error = answer["result"]["structuredContent"]["error"]
    assert (error["code"], error["field"]) == ("invalid", field), error
    assert "surrogate" in error["message"]
    assert await dump_tables(store) == before


async def test_http_mcp_refuses_a_lone_surrogate_conversation_id_writing_nothing(
        daemon: Daemon) -> None:
    status, answer = await post(daemon, "/mcp/v1", (
        b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"save_memory",'
        b'"arguments":{"content":"written anyway","conversationId":"\\udc00"}}}'))
    assert status == 200 and answer["id"] == 7 and answer["result"]["isError"] is True, answer
    assert answer["result"]["structuredContent"]["error"]["field"] == "conversationId"
    assert (await daemon.store.memories.list_memories({}))["rows"] == []


# ---------------------------------------------------------------------- surfaced memories


async def surfaced_in(server: McpServer, conversation: str, **extra: str) -> list[Any]:
    result = await tool_result(server, "list_memories", {"conversationId": conversation,
                                                         **extra})
    assert result["isError"] is False, result
    surfaced: list[Any] = result["structuredContent"].get("relevant_memories", [])
    return surfaced


async def test_surfaced_memories_are_repeated_only_while_active_and_as_stored_now(
        server: McpServer, store: Store) -> None:
    """The conversation's cache was repeated as it was: a hard-deleted memory's purged text,
    an archived or a superseded memory kept being surfaced, an edited one with its old text."""
    texts = ["zebra-canary-4411 launch codes", "zebra archive plan", "zebra rollout plan v1",
             "zebra on-call rota: Ann"]
    purged, archived, superseded, edited = [
        await store.memories.save({"content": text, "topic_key": f"t{i}"}) for i, text in enumerate(texts)]
    for memory, text in zip((purged, archived, superseded, edited), texts, strict=True):
        found = await tool_result(server, "memory_search", {
            "query": text, "conversationId": memory["node_id"]})
        assert found["structuredContent"]["relevant_memories"][0]["id"] == memory["node_id"]

    await store.memories.delete(purged["node_id"], hard=True)
    await store.memories.update_status(archived["node_id"], "archived")
    newer = await store.memories.save({"content": "zebra rollout plan v2"})
    await store.graph.judge(newer["node_id"], superseded["node_id"], "supersedes")
    await store.memories.save({"content": "zebra on-call rota: Bo", "topic_key": "t3"})

    for memory in (purged, archived, superseded):
        later = await surfaced_in(server, memory["node_id"])
        assert memory["node_id"] not in {m["id"] for m in later}, later
        assert "zebra-canary-4411" not in json.dumps(later)
    [rota] = await surfaced_in(server, edited["node_id"])
    assert rota["id"] == edited["node_id"] and rota["summary"] == "zebra on-call rota: Bo"


async def test_parallel_calls_of_one_conversation_keep_what_was_surfaced(
        server: McpServer) -> None:
    """``_surface`` popped the conversation's list, awaited a recall, then wrote it back: a
    call of the same conversation meanwhile answered without the surfaced memories, and one of
    the two writes was lost."""
    await tool_result(server, "save_memory", {"content": "alpha deploy uses blue green rollout"})
    first = await tool_result(server, "memory_search", {"query": "alpha deploy rollout",
                                                        "conversationId": "conv-p"})
    surfaced = {m["id"] for m in first["structuredContent"]["relevant_memories"]}
    assert surfaced
    for _ in range(20):
        answers = await asyncio.gather(
            surfaced_in(server, "conv-p", memoryContext="alpha deploy rollout"),
            surfaced_in(server, "conv-p"))
        for answer in answers:
            assert surfaced <= {m["id"] for m in answer}, answer


# ---------------------------------------------------------------------- stdio: JSON only


async def test_stdio_bridge_writes_only_json_for_non_finite_ids_without_a_daemon(
        tmp_path: Path) -> None:
    """The bridge read lines with a plain ``json.loads`` (NaN accepted) and echoed the id into
    its -32000 error: ``"id":NaN`` (or ``Infinity`` for 1e400) on stdout is not JSON."""
    token_file = tmp_path / "api-token"
    token_file.write_text(TOKEN + "\n")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *bridge_argv(f"http://127.0.0.1:{free_port()}", token_file,
                                     "--initialize-wait", "0"),
        cwd=REPO, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(
            b'{"jsonrpc":"2.0","id":NaN,"method":"ping"}\n'
            b'{"jsonrpc":"2.0","id":1e400,"method":"ping"}\n'
            b'{"jsonrpc":"2.0","id":3,"method":"ping"}\n'), DEADLINE)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0

    def strict(name: str) -> object:
        raise AssertionError(f"{name} on stdout: not JSON")

    answers = [json.loads(line, parse_constant=strict) for line in out.splitlines()]
    assert [(a["id"], a["error"]["code"]) for a in answers] == [
        (None, PARSE_ERROR), (None, -32000), (3, -32000)], answers


# ---------------------------------------------------------------------- closed store


async def test_recall_tools_on_a_closed_store_answer_store_closed(store: Store) -> None:
    """Recall ran on the closed store's shut-down thread pool: RuntimeError "cannot schedule
    new futures after shutdown", an ``internal`` error where every other tool says
    ``store_closed``."""
    server = McpServer(store, Surfacer())
    await store.memories.save({"content": "hello world"})
    await store.close()
    for name, arguments in (("memory_search", {"query": "hello"}),
                            ("recall_memory", {"query": "hello"}),
                            ("verify_memory", {"content": "hello world"}),
                            ("list_memories", {"memoryContext": "hello"})):
        result = await tool_result(server, name, arguments)
        error = result["structuredContent"]["error"]
        assert error["code"] == "store_closed", (name, error)


# ---------------------------------------------------------------------- ids and fields


async def test_a_request_with_a_null_id_is_an_invalid_request(
        server: McpServer, store: Store) -> None:
    """MCP: "Unlike base JSON-RPC, the ID MUST NOT be null." It was answered (and run) as any
    request, with an answer the client cannot match to it."""
    before = await dump_tables(store)
    for method, params in (("ping", None), ("tools/call", {
            "name": "save_memory", "arguments": {"content": "not saved"}})):
        raw = await server.handle_bytes(rpc(None, method, params))
        assert raw is not None
        answer = json.loads(raw)
        assert answer["id"] is None and answer["error"]["code"] == INVALID_REQUEST, answer
        assert "result" not in answer
    assert await dump_tables(store) == before


async def test_a_not_found_error_names_the_argument_that_named_the_id(
        server: McpServer, store: Store) -> None:
    """The field was null; the argument's name was only the message's prefix."""
    saved = await store.memories.save({"content": "judge me"})
    missing = "memory:nope"
    for name, arguments, field in (
            ("memory_judge", {"memory_id": saved["node_id"], "target_id": missing,
                              "verdict": "related"}, "target_id"),
            ("memory_judge", {"memory_id": missing, "target_id": saved["node_id"],
                              "verdict": "related"}, "memory_id"),
            ("get_memory", {"memory_id": missing}, "memory_id"),
            ("delete_memory", {"memory_id": missing}, "memory_id")):
        result = await tool_result(server, name, arguments)
        error = result["structuredContent"]["error"]
        assert (error["code"], error["field"]) == ("not_found", field), (name, error)

"""The MCP server (JSON-RPC 2.0), transport-free: a real store, every tool through tools/call,
the surfacing contract, and every protocol error."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import pytest

import syncd
from local_store import Store
from syncd.mcp import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    LATEST_PROTOCOL_VERSION,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    McpServer,
)
from syncd.tools import TOOLS, Surfacer
from tests.store_probe import dump_tables

_ids = iter(range(1, 1_000_000))


def request(method: str, params: object = None, request_id: object = "auto") -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    message["id"] = next(_ids) if request_id == "auto" else request_id
    if params is not None:
        message["params"] = params
    return message


def notification(method: str, params: object = None) -> dict[str, Any]:
    message = request(method, params)
    del message["id"]
    return message


async def rpc(server: McpServer, method: str, params: object = None) -> dict[str, Any]:
    """One request; returns the ``result`` after checking the envelope."""
    sent = request(method, params)
    answer = await server.handle(sent)
    assert isinstance(answer, dict), answer
    assert answer["jsonrpc"] == "2.0" and answer["id"] == sent["id"]
    assert "error" not in answer, answer
    json.dumps(answer, allow_nan=False)  # every answer is strict JSON
    result = answer["result"]
    assert isinstance(result, dict)
    return result


async def error_of(server: McpServer, message: object) -> dict[str, Any]:
    answer = await server.handle(message)
    assert isinstance(answer, dict) and "result" not in answer, answer
    error = answer["error"]
    assert isinstance(error, dict) and isinstance(error["message"], str)
    return answer


async def call(server: McpServer, name: str, arguments: object) -> dict[str, Any]:
    """tools/call that must succeed; returns the structured result (== the text, decoded)."""
    result = await rpc(server, "tools/call", {"name": name, "arguments": arguments})
    assert result["isError"] is False, result
    [content] = result["content"]
    assert content["type"] == "text"
    decoded = json.loads(content["text"])
    assert content["text"] == json.dumps(decoded, separators=(",", ":"),  # compact JSON
                                         ensure_ascii=False)
    assert result["structuredContent"] == decoded
    assert isinstance(decoded, dict)
    return decoded


async def tool_error(server: McpServer, name: str, arguments: object) -> dict[str, Any]:
    """tools/call that must fail as a tool result (isError); returns the error object."""
    result = await rpc(server, "tools/call", {"name": name, "arguments": arguments})
    assert result["isError"] is True, result
    [content] = result["content"]
    body = json.loads(content["text"])
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "field"}
    error = body["error"]
    assert isinstance(error, dict)
    return error


@pytest.fixture
def server(store: Store) -> McpServer:
    return McpServer(store, Surfacer())


# ---------------------------------------------------------------------- lifecycle


@pytest.mark.parametrize("asked", ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"])
async def test_initialize_echoes_a_supported_version(server: McpServer, asked: str) -> None:
    result = await rpc(server, "initialize", {
        "protocolVersion": asked, "capabilities": {},
        "clientInfo": {"name": "test", "version": "1"}})
    assert result["protocolVersion"] == asked
    assert result["capabilities"] == {"tools": {"listChanged": False}}
    assert result["serverInfo"] == {"name": "syncd", "version": syncd.__version__}
    text = result["instructions"]
    assert "memory_search" in text and "save_memory" in text and "<private>" in text


@pytest.mark.parametrize("params", [{"protocolVersion": "1999-01-01"}, {}, None])
async def test_initialize_offers_the_latest_for_anything_else(
        server: McpServer, params: object) -> None:
    result = await rpc(server, "initialize", params)
    assert result["protocolVersion"] == LATEST_PROTOCOL_VERSION == "2025-11-25"


async def test_server_name_and_version_are_settable(store: Store) -> None:
    named = McpServer(store, Surfacer(), server_name="mem", version="9.9")
    result = await rpc(named, "initialize", {"protocolVersion": "2025-06-18"})
    assert result["serverInfo"] == {"name": "mem", "version": "9.9"}


async def test_initialized_notification_and_ping(server: McpServer) -> None:
    assert await server.handle(notification("notifications/initialized")) is None
    assert await server.handle(notification("notifications/cancelled",
                                            {"requestId": 3})) is None
    assert await rpc(server, "ping") == {}


async def test_tools_list_has_every_tool_with_its_schema(server: McpServer) -> None:
    result = await rpc(server, "tools/list")
    listed = {t["name"]: t for t in result["tools"]}
    assert list(listed) == list(TOOLS)
    for name, entry in listed.items():
        assert entry["description"] == TOOLS[name].description and entry["description"]
        schema = entry["inputSchema"]
        assert schema == TOOLS[name].schema
        assert schema["type"] == "object"
        assert {"conversationId", "memoryContext"} <= set(schema["properties"])
        assert set(schema["required"]) <= set(schema["properties"])
        assert isinstance(entry["annotations"]["readOnlyHint"], bool)
    assert listed["memory_search"]["annotations"]["readOnlyHint"] is True
    assert listed["save_memory"]["annotations"]["readOnlyHint"] is False
    assert listed["delete_memory"]["annotations"]["destructiveHint"] is True


# ---------------------------------------------------------------------- every tool


async def test_every_tool_through_tools_call(server: McpServer, store: Store) -> None:
    called: set[str] = set()

    async def tool(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        called.add(name)
        result = await call(server, name, arguments)
        assert result["conversationId"].startswith("conv-")
        return result

    a = await tool("save_memory", {"content": "deploy with make release", "title": "Deploy",
                                   "memory_type": "decision", "realm": "p", "tags": ["ops"]})
    assert a["saved"] is True and a["node_id"] == f"memory:{a['id']}"
    b = await tool("save_memory", {"content": "release notes go in CHANGELOG.md", "realm": "p"})

    found = await tool("memory_search", {"query": "deploy release", "realms": ["p"],
                                         "expand_hops": 0})
    assert {"memories", "linked", "context", "took_ms"} <= set(found)
    assert found["memories"][0]["id"] == a["node_id"]
    assert "deploy with make release" in found["context"]

    recalled = await tool("recall_memory", {"query": "deploy", "realms": ["p"]})
    assert {"memories", "linked", "context", "took_ms"} <= set(recalled)
    assert recalled["memories"][0]["id"] == a["node_id"]

    listed = await tool("list_memories", {"realm": "p"})
    assert {"columns", "rows", "row_count", "truncated"} <= set(listed)
    assert [c["name"] for c in listed["columns"]][:2] == ["id", "memory_type"]
    assert listed["row_count"] == 2 and listed["truncated"] is False
    assert {r["id"] for r in listed["rows"]} == {a["node_id"], b["node_id"]}

    got = await tool("get_memory", {"memory_id": a["id"]})
    assert got["id"] == a["node_id"] and got["content"] == "deploy with make release"

    linked = await tool("link_memory_to_entity", {"memory_id": a["id"],
                                                  "target_node_id": "repo:syncd"})
    assert linked == {**linked, "linked": True, "src": a["node_id"], "dst": "repo:syncd",
                      "type": "REFERENCES"}

    entity = await tool("ingest_entity", {"name": "syncd", "kind": "repo",
                                          "properties": {"language": "python"}})
    assert entity["created"] is True and entity["topic_key"] == "entity/repo/syncd"
    again = await tool("ingest_entity", {"name": "syncd", "kind": "repo"})
    assert again["upserted"] is True and again["id"] == entity["id"]

    status = await tool("update_memory_status", {"memory_id": b["id"], "status": "background"})
    assert status["ok"] is True and status["status"] == "background"
    importance = await tool("update_memory_importance", {"memory_id": b["id"],
                                                         "importance": 0.9})
    assert importance["ok"] is True and importance["importance"] == pytest.approx(0.9)

    compared = await tool("memory_compare", {"memory_id": a["id"], "other_id": b["id"]})
    assert compared["a"]["id"] == a["node_id"] and compared["b"]["id"] == b["node_id"]
    assert "memory_judge" in compared["hint"]

    judged = await tool("memory_judge", {"memory_id": a["id"], "target_id": b["id"],
                                         "verdict": "Related", "reason": "same release"})
    assert judged == {**judged, "ok": True, "verdict": "related", "src": a["node_id"],
                      "dst": b["node_id"]}

    summary = await tool("memory_session_summary", {"goal": "ship the MCP layer",
                                                    "accomplished": "server and bridge"})
    assert summary["saved"] is True
    assert (await store.memories.get(summary["id"]))["memory_type"] == "summary"

    verified = await tool("verify_memory", {"content": "deploy with make release"})
    assert verified["recommendation"] == "noop"
    assert verified["related"][0]["id"] == a["node_id"]

    note = await tool("memory_note", {"type": "service", "name": "billing",
                                      "summary": "Bills users monthly.",
                                      "edges": [{"to": "postgres", "type": "uses"}]})
    assert note["saved"] is True and note["name"] == "billing"
    assert note["edges"][0]["type"] == "USES"
    renote = await tool("memory_note", {"type": "service", "name": "Billing",
                                        "summary": "Bills users weekly."})
    assert renote["id"] == note["id"]  # merged on type + normalised name

    learned = await tool("record_learning", {"content": "run mypy before committing"})
    assert learned["saved"] is True
    assert (await store.memories.get(learned["id"]))["memory_type"] == "learning"

    many = await tool("save_memories", {"memories": [{"content": "one"}, {"content": "two"},
                                                     {"title": "no content"}]})
    assert many["saved"] is True and many["count"] == 2
    assert many["ids"][2] is None and many["errors"][0].startswith("#2: ")

    deleted = await tool("delete_memory", {"memory_id": b["id"], "hard": True})
    assert deleted == {**deleted, "ok": True, "deleted": True, "hard": True}
    gone = await tool_error(server, "get_memory", {"memory_id": b["id"]})
    assert gone["code"] == "not_found"

    assert called == set(TOOLS), f"untested tools: {set(TOOLS) - called}"


# ---------------------------------------------------------------------- surfacing


async def test_conversation_id_is_generated_or_echoed(server: McpServer) -> None:
    first = await call(server, "list_memories", {})
    second = await call(server, "list_memories", {})
    assert first["conversationId"].startswith("conv-")
    assert first["conversationId"] != second["conversationId"]
    given = await call(server, "list_memories", {"conversationId": "agent-conv-7"})
    assert given["conversationId"] == "agent-conv-7"


async def test_relevant_memories_surface_and_repeat(server: McpServer) -> None:
    saved = await call(server, "save_memory", {"content": "the billing service runs on "
                                               "postgres 16", "title": "Billing DB"})
    plain = await call(server, "list_memories", {"conversationId": "c1"})
    assert "relevant_memories" not in plain

    hinted = await call(server, "list_memories", {"conversationId": "c1",
                                                  "memoryContext": "billing postgres upgrade"})
    surfaced = hinted["relevant_memories"]
    assert surfaced[0] == {"id": saved["node_id"], "subject": "Billing DB",
                           "summary": "the billing service runs on postgres 16"}

    later = await call(server, "get_memory", {"memory_id": saved["id"],
                                              "conversationId": "c1"})
    assert later["relevant_memories"] == surfaced  # repeated, with no context this time
    other = await call(server, "get_memory", {"memory_id": saved["id"],
                                              "conversationId": "c2"})
    assert "relevant_memories" not in other

    searched = await call(server, "memory_search", {"query": "billing postgres"})
    assert searched["relevant_memories"][0]["id"] == saved["node_id"]  # the query is a hint


async def test_a_write_never_surfaces_what_it_wrote(server: McpServer) -> None:
    """``save_memory`` with a context matching its own content listed the memory it had just
    saved as relevant; other matches are still listed, and a later read shows it."""
    old = await call(server, "save_memory", {"content": "the billing service runs on "
                                             "postgres 16", "conversationId": "w1"})
    new = await call(server, "save_memory", {
        "content": "the billing service moves to postgres 17 in May", "conversationId": "w1",
        "memoryContext": "billing service postgres"})
    assert new["node_id"] not in {m["id"] for m in new.get("relevant_memories", [])}
    assert old["node_id"] in {m["id"] for m in new["relevant_memories"]}
    noted = await call(server, "memory_note", {
        "type": "service", "name": "billing", "summary": "runs on postgres",
        "edges": [{"to": "postgres", "type": "USES", "to_type": "tool"}],
        "memoryContext": "billing postgres", "conversationId": "w2"})
    written = {noted["node_id"]} | {e["node_id"] for e in noted["edges"]}
    assert not written & {m["id"] for m in noted.get("relevant_memories", [])}
    read = await call(server, "memory_search", {"query": "billing service postgres 17",
                                                "conversationId": "w1"})
    assert new["node_id"] in {m["id"] for m in read["relevant_memories"]}


# ---------------------------------------------------------------------- tool errors


async def test_bad_arguments_are_tool_errors_naming_the_field(
        server: McpServer, store: Store) -> None:
    before = await dump_tables(store)
    cases: list[tuple[str, object, str]] = [
        ("save_memory", {"content": 5}, "content"),
        ("save_memory", {}, "content"),
        ("update_memory_status", {"memory_id": "x", "status": "bogus"}, "status"),
        ("delete_memory", {"memory_id": "x", "hard": "yes"}, "hard"),
        ("memory_search", {"query": "q", "conversationId": 5}, "conversationId"),
        ("memory_search", {"query": "q", "memoryContext": ["a"]}, "memoryContext"),
        ("save_memory", ["not", "an", "object"], "arguments"),
        ("save_memory", "text", "arguments"),
    ]
    for name, arguments, field in cases:
        error = await tool_error(server, name, arguments)
        assert error["code"] == "invalid" and error["field"] == field, (name, error)
        assert error["message"]
    missing = await tool_error(server, "update_memory_importance",
                               {"memory_id": "00000000-0000-4000-8000-000000000000",
                                "importance": 0.5})
    assert missing["code"] == "not_found"
    assert await dump_tables(store) == before  # nothing was written by a refused call


async def test_missing_arguments_mean_an_empty_object(server: McpServer) -> None:
    result = await rpc(server, "tools/call", {"name": "list_memories"})
    assert result["isError"] is False
    assert result["structuredContent"]["row_count"] == 0


class _Exploding(Surfacer):
    """A surfacer whose tool raises an unexpected exception (a bug, not bad input)."""

    async def call(self, store: Store, name: str, args: Mapping[str, Any]) -> Any:
        raise RuntimeError("boom")


async def test_an_unexpected_exception_is_an_internal_tool_error_and_logs_no_values(
        store: Store, caplog: pytest.LogCaptureFixture) -> None:
    server = McpServer(store, _Exploding())
    with caplog.at_level(logging.ERROR, logger="syncd.mcp"):
        error = await tool_error(server, "save_memory", {"content": "SECRET-VALUE-42",
                                                         "title": "t"})
    assert error["code"] == "internal" and "save_memory" in error["message"]
    assert "SECRET-VALUE-42" not in caplog.text and "SECRET-VALUE-42" not in error["message"]
    assert "save_memory" in caplog.text and "content, title" in caplog.text
    assert caplog.records[0].exc_info is not None  # logged with the traceback


# ---------------------------------------------------------------------- protocol errors


async def test_unknown_tool_is_invalid_params(server: McpServer) -> None:
    answer = await error_of(server, request("tools/call", {"name": "drop_tables",
                                                           "arguments": {}}, 7))
    assert answer["id"] == 7 and answer["error"]["code"] == INVALID_PARAMS == -32602
    assert "drop_tables" in answer["error"]["message"]
    params: object
    for params in ({"arguments": {}}, {"name": 5}, ["save_memory"]):
        answer = await error_of(server, request("tools/call", params, 8))
        assert answer["error"]["code"] == INVALID_PARAMS


async def test_unknown_method(server: McpServer) -> None:
    answer = await error_of(server, request("resources/list", {}, "r-1"))
    assert answer["id"] == "r-1" and answer["error"]["code"] == METHOD_NOT_FOUND == -32601
    assert "resources/list" in answer["error"]["message"]


async def test_notifications_never_get_an_answer(server: McpServer, store: Store) -> None:
    assert await server.handle(notification("no/such/method")) is None
    assert await server.handle(notification("tools/call", {"name": "nope"})) is None
    assert await server.handle(notification("tools/list")) is None
    # A notification still runs: the client just does not want the answer.
    assert await server.handle(notification("tools/call", {
        "name": "save_memory", "arguments": {"content": "fire and forget"}})) is None
    assert (await store.memories.list_memories({}))["row_count"] == 1


async def test_a_batch_answers_only_its_requests(server: McpServer) -> None:
    answer = await server.handle([
        request("ping", None, 1),
        notification("notifications/initialized"),
        request("tools/list", None, "two"),
        notification("no/such/method"),
        request("no/such/method", None, 3),
        request("tools/call", {"name": "save_memory", "arguments": {"content": "batched"}}, 4),
    ])
    assert isinstance(answer, list)
    by_id = {a["id"]: a for a in answer}
    assert list(by_id) == [1, "two", 3, 4]
    assert by_id[1]["result"] == {}
    assert len(by_id["two"]["result"]["tools"]) == len(TOOLS)
    assert by_id[3]["error"]["code"] == METHOD_NOT_FOUND
    assert by_id[4]["result"]["structuredContent"]["saved"] is True


async def test_batch_edge_cases(server: McpServer) -> None:
    assert await server.handle([notification("notifications/initialized"),
                                notification("ping")]) is None
    empty = await error_of(server, [])
    assert empty["id"] is None and empty["error"]["code"] == INVALID_REQUEST
    answer = await server.handle([1, request("ping", None, 2)])
    assert isinstance(answer, list)
    assert [(a["id"], a.get("error", {}).get("code")) for a in answer] == [
        (None, INVALID_REQUEST), (2, None)]


@pytest.mark.parametrize(("message", "reply_id"), [
    (5, None),
    ("ping", None),
    (None, None),
    ({"id": 1, "method": "ping"}, 1),  # no "jsonrpc"
    ({"jsonrpc": "1.0", "id": 1, "method": "ping"}, 1),
    ({"jsonrpc": "2.0", "id": 1}, 1),  # no method
    ({"jsonrpc": "2.0", "id": 1, "method": 7}, 1),
    ({"jsonrpc": "2.0", "method": ""}, None),
    ({"jsonrpc": "2.0", "id": {"x": 1}, "method": "ping"}, None),  # id of a bad type
    ({"jsonrpc": "2.0", "id": True, "method": "ping"}, None),
])
async def test_not_json_rpc_is_invalid_request(server: McpServer, message: object,
                                               reply_id: object) -> None:
    answer = await error_of(server, message)
    assert answer["jsonrpc"] == "2.0" and answer["id"] == reply_id
    assert answer["error"]["code"] == INVALID_REQUEST == -32600


async def test_params_must_be_an_object(server: McpServer) -> None:
    answer = await error_of(server, request("tools/list", [1, 2], 5))
    assert answer["id"] == 5 and answer["error"]["code"] == INVALID_PARAMS


async def test_responses_from_the_client_are_ignored(server: McpServer) -> None:
    assert await server.handle({"jsonrpc": "2.0", "id": 1, "result": {}}) is None
    assert await server.handle({"jsonrpc": "2.0", "id": 1,
                                "error": {"code": 1, "message": "x"}}) is None


async def test_handle_bytes(server: McpServer) -> None:
    assert await server.handle_bytes(b'{"jsonrpc":"2.0","method":"notifications/initialized"}'
                                     ) is None
    raw = await server.handle_bytes(b'{"jsonrpc":"2.0","id":1,"method":"ping"}')
    assert raw is not None and json.loads(raw) == {"jsonrpc": "2.0", "id": 1, "result": {}}
    bad = await server.handle_bytes(b"{not json")
    assert bad is not None and json.loads(bad)["error"]["code"] == PARSE_ERROR == -32700

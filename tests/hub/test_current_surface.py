"""The hub speaks the current plane (issue 31, point 5; docs/kyma-current-surface.md), against
real ``syncd hub`` processes on SQLite and on PostgreSQL:

  * MCP needs only ``read``; a ``read`` token lists and calls only the read-only tools, and a
    write tool answers a JSON-RPC error naming it and the ``write`` role, with nothing run. On
    both stores (a PostgreSQL hub serves it from a working copy, ``syncd/hub/workcopy.py``).
  * ``flush_memory``, ``reinforce_memory`` and ``list_memory_usage`` with the plane's arguments
    and answers; searches (MCP and ``query``) count hits.
  * Settings carry the plane's newer blocks with its defaults, and ``dreaming``'s
    ``data_source_read_*`` (the old ``connector_read_*`` read as aliases, never written).
  * ``query`` answers carry ``precedent`` (null) and a string ``realm``.
  * ``PUT settings`` with a bearer token needs ``write`` (the plane lets ``read``; the hub
    keeps ``read`` read-only), replaces and answers ``{"ok": true}``; the page's sessions keep
    their patch.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from protocol.settings import DEFAULT_SETTINGS
from syncd.mcp import INVALID_PARAMS, READ_ONLY_TOOLS
from syncd.tools import HUB_TOOLS, PLANE_TOOLS
from tests.hub.test_page import page_login
from tests.hub.test_pg_processes import HubProcess, store_file
from tests.syncd.processes import cli, spawn, wait_ready

SETTINGS = "/v1/agent/memory/settings"


@dataclass
class Hub:
    url: str
    kind: str
    read: str
    write: str
    http: aiohttp.ClientSession

    async def call(self, method: str, path: str, token: str | None,
                   body: object = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with self.http.request(method, self.url + path, json=body,
                                     headers=headers) as resp:
            return resp.status, await resp.json(content_type=None)

    async def rpc(self, token: str, method: str, params: dict[str, Any] | None = None) -> Any:
        status, answer = await self.call("POST", "/mcp/v1", token, {
            "jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}})
        assert status == 200, answer
        return answer

    async def tool(self, token: str, name: str, **arguments: Any) -> dict[str, Any]:
        """A tool's structured result (``isError`` answers included)."""
        answer = await self.rpc(token, "tools/call", {"name": name, "arguments": arguments})
        assert "result" in answer, answer
        result: dict[str, Any] = answer["result"]["structuredContent"]
        assert ("error" in result) is answer["result"]["isError"], answer
        return result


async def new_token(home: Path, where: tuple[str, ...], role: str) -> str:
    code, out, err = await cli(home, "hub", "token", "create", *where, "--role", role,
                               "--name", f"{role}-{uuid.uuid4().hex[:6]}")
    assert code == 0, err
    return out.strip()


@contextlib.asynccontextmanager
async def running_hub(home: Path, kind: str, where: tuple[str, ...]) -> AsyncIterator[Hub]:
    """A ``syncd hub`` process on ``where``'s store, with a read and a write token."""
    read, write = await new_token(home, where, "read"), await new_token(home, where, "write")
    proc = await spawn(home, "hub", *where, "--listen", "127.0.0.1:0")
    try:
        process = HubProcess(proc, await wait_ready(proc))
    except BaseException:
        proc.kill()
        await proc.wait()
        raise
    try:
        async with aiohttp.ClientSession() as http:
            yield Hub(process.url, kind, read, write, http)
    finally:
        await process.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
async def hub(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Hub]:
    if request.param == "sqlite":
        where: tuple[str, ...] = ("--data-dir", str(tmp_path / "hub"))
    else:
        where = ("--store-file", str(await store_file(tmp_path, request.getfixturevalue(
            "pg_dsn"))))
    async with running_hub(tmp_path, request.param, where) as running:
        yield running


async def save(hub: Hub, content: str, realm: str = "p") -> str:
    saved = await hub.tool(hub.write, "save_memory", content=content, realm=realm)
    assert saved["saved"] is True, saved
    return str(saved["node_id"])


# ---------------------------------------------------------------------- 1. MCP at read

async def test_a_read_token_lists_and_calls_only_the_read_only_tools(hub: Hub) -> None:
    assert (await hub.rpc(hub.read, "initialize"))["result"]["serverInfo"]["name"] == "syncd"
    listed = (await hub.rpc(hub.read, "tools/list"))["result"]["tools"]
    assert {t["name"] for t in listed} == READ_ONLY_TOOLS
    assert all(t["annotations"]["readOnlyHint"] for t in listed)
    for name, arguments in (("save_memory", {"content": "read tokens do not write"}),
                            ("reinforce_memory", {"memory_id": "memory:x",
                                                  "outcome": "helpful"}),
                            ("delete_memory", {"memory_id": "memory:x"})):
        answer = await hub.rpc(hub.read, "tools/call", {"name": name, "arguments": arguments})
        assert answer["error"]["code"] == INVALID_PARAMS, answer
        assert f"'{name}'" in answer["error"]["message"]
        assert "needs the write role" in answer["error"]["message"]
    assert (await hub.tool(hub.read, "list_memories"))["rows"] == []  # nothing was saved
    assert (await hub.tool(hub.read, "list_memory_usage"))["memories"] == []
    found = await hub.tool(hub.read, "memory_search", query="anything")
    assert found["memories"] == [] and found["precedent"] is None


async def test_a_write_token_gets_every_tool(hub: Hub) -> None:
    listed = (await hub.rpc(hub.write, "tools/list"))["result"]["tools"]
    assert [t["name"] for t in listed] == list(HUB_TOOLS)
    assert set(PLANE_TOOLS) <= {t["name"] for t in listed}
    by_name = {t["name"]: t for t in listed}
    assert by_name["reinforce_memory"]["annotations"]["readOnlyHint"] is False
    assert by_name["reinforce_memory"]["inputSchema"]["required"] == ["memory_id", "outcome"]
    mid = await save(hub, "the deploy runs from make release")
    found = await hub.tool(hub.read, "recall_memory", query="deploy release")
    assert [m["id"] for m in found["memories"]] == [mid]


async def test_a_batch_from_a_read_token_refuses_only_its_write_calls(hub: Hub) -> None:
    status, answers = await hub.call("POST", "/mcp/v1", hub.read, [
        {"jsonrpc": "2.0", "id": "list", "method": "tools/list"},
        {"jsonrpc": "2.0", "id": "save", "method": "tools/call",
         "params": {"name": "save_memory", "arguments": {"content": "x"}}}])
    assert status == 200
    by_id = {a["id"]: a for a in answers}
    assert "result" in by_id["list"] and by_id["save"]["error"]["code"] == INVALID_PARAMS


async def test_mcp_needs_a_token(hub: Hub) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    assert (await hub.call("POST", "/mcp/v1", None, body))[0] == 401
    status, answer = await hub.call("POST", "/mcp/v1", hub.read, body)
    assert status == 200 and answer["result"]["tools"]


# ---------------------------------------------------------------------- 2. the plane's tools

async def test_searches_count_hits_and_reinforce_takes_a_memory_off_the_worklist(
        hub: Hub) -> None:
    deploy = await save(hub, "deploys run from make release on the build host")
    backup = await save(hub, "backups of the build host run nightly at three")
    await save(hub, "a memory in another realm about the build host", realm="q")
    assert (await hub.tool(hub.read, "list_memory_usage"))["memories"] == []
    found = await hub.tool(hub.read, "memory_search", query="build host", realms=["p"])
    assert {m["id"] for m in found["memories"]} == {deploy, backup}
    status, answer = await hub.call("POST", "/v1/agent/memory/query", hub.read,
                                    {"query": "make release deploys", "realms": ["p"],
                                     "limit": 1})
    assert status == 200 and [m["id"] for m in answer["memories"]] == [deploy]

    usage = (await hub.tool(hub.read, "list_memory_usage", realm="p"))["memories"]
    assert [(u["memory_id"], u["hit_count"]) for u in usage] == [(deploy, 2), (backup, 1)]
    assert all(u["reinforced_count"] == u["miss_count"] == 0 for u in usage)
    assert all(isinstance(u["last_surfaced_at"], str) and u["last_reinforced_at"] is None
               for u in usage)
    assert (await hub.tool(hub.read, "list_memory_usage", realm="p", limit=1))["memories"] == [
        usage[0]]
    assert (await hub.tool(hub.read, "list_memory_usage", realm="q"))["memories"] == []

    verdict = await hub.tool(hub.write, "reinforce_memory", memory_id=deploy.split(":", 1)[1],
                             outcome="helpful", reason="it was right")
    assert {k: v for k, v in verdict.items() if k != "conversationId"} == {
        "ok": True, "memory_id": deploy, "hit_count": 2, "reinforced_count": 1, "miss_count": 0}
    missed = await hub.tool(hub.write, "reinforce_memory", memory_id=backup,
                            outcome="not_helpful")
    assert (missed["reinforced_count"], missed["miss_count"]) == (0, 1)
    assert (await hub.tool(hub.read, "list_memory_usage"))["memories"] == []


async def test_the_plane_tools_refuse_bad_arguments_by_field(hub: Hub) -> None:
    mid = await save(hub, "the release train leaves on Tuesdays")
    for name, arguments, field in (
            ("reinforce_memory", {"memory_id": mid, "outcome": "maybe"}, "outcome"),
            ("reinforce_memory", {"outcome": "helpful"}, "memory_id"),
            ("list_memory_usage", {"limit": -1}, "limit"),
            ("list_memory_usage", {"realm": 3}, "realm"),
            ("flush_memory", {"realms": "p"}, "realms")):
        result = await hub.tool(hub.write, name, **arguments)
        assert result["error"]["field"] == field, (name, result)
    assert (await hub.tool(hub.read, "flush_memory"))["flushed"] is True
    assert (await hub.tool(hub.read, "flush_memory", realms=["p"]))["flushed"] is True


async def test_reinforcing_a_memory_that_cannot_be_read_is_still_counted(
        hub: Hub) -> None:
    """As the plane: the verdict is recorded under the default realm."""
    ghost = f"memory:{uuid.uuid4()}"
    verdict = await hub.tool(hub.write, "reinforce_memory", memory_id=ghost,
                             outcome="not_helpful")
    assert (verdict["ok"], verdict["memory_id"], verdict["hit_count"],
            verdict["miss_count"]) == (True, ghost, 0, 1)


# ---------------------------------------------------------------------- 3. and 5. settings

PLANE_BLOCKS = {
    "reinforcement": {"enabled": False, "hit_weight": 0.3, "miss_penalty": 0.3,
                      "half_life_days": 30.0},
    "precedent": {"enabled": True, "max_distance": 0.15, "memory_limit": 20},
    "mmr": {"enabled": False, "lambda": 0.7, "pool_multiplier": 3},
    "validity_gate": {"enabled": False, "llm_escalation_enabled": False,
                      "min_confidence": 0.35, "min_content_chars": 12},
    "schema_induction": {"enabled": False, "min_examples": 3, "interval_days": 7},
    "default_visibility": "public",
}


async def test_settings_have_the_plane_blocks_and_data_source_names(hub: Hub) -> None:
    status, settings = await hub.call("GET", SETTINGS, hub.read)
    assert status == 200
    assert {key: settings[key] for key in PLANE_BLOCKS} == PLANE_BLOCKS
    assert settings["w_reinforcement"] == 0.0
    dreaming = settings["dreaming"]
    assert (dreaming["data_source_read_budget"], dreaming["data_source_read_max_bytes"]) == (
        25, 4194304)
    assert not any(key.startswith("connector_") for key in dreaming)


async def test_a_bearer_put_needs_write_replaces_and_answers_ok(hub: Hub) -> None:
    status, settings = await hub.call("GET", SETTINGS, hub.read)
    assert status == 200
    status, refused = await hub.call("PUT", SETTINGS, hub.read, settings)
    assert (status, refused["error"]["code"]) == (403, "forbidden")
    changed = {**settings, "w_graph": 0.7, "default_visibility": "private",
               "mmr": {**settings["mmr"], "enabled": True, "lambda": 0.5},
               "reinforcement": {**settings["reinforcement"], "enabled": True},
               "dreaming": {**settings["dreaming"], "data_source_read_budget": 9}}
    assert await hub.call("PUT", SETTINGS, hub.write, changed) == (200, {"ok": True})
    assert await hub.call("GET", SETTINGS, hub.read) == (200, changed)  # round trip

    # a replace: what the body leaves out takes the plane's default, not the value before
    partial = {"dreaming": {"connector_read_budget": 7, "connector_read_max_bytes": 1024}}
    assert await hub.call("PUT", SETTINGS, hub.write, partial) == (200, {"ok": True})
    status, after = await hub.call("GET", SETTINGS, hub.read)
    assert status == 200
    assert (after["w_graph"], after["default_visibility"], after["mmr"]["lambda"]) == (
        DEFAULT_SETTINGS.w_graph, "public", 0.7)
    assert (after["dreaming"]["data_source_read_budget"],
            after["dreaming"]["data_source_read_max_bytes"]) == (7, 1024)
    assert "connector_read_budget" not in after["dreaming"]

    both = {"dreaming": {"connector_read_budget": 1, "data_source_read_budget": 2}}
    assert await hub.call("PUT", SETTINGS, hub.write, both) == (200, {"ok": True})
    assert (await hub.call("GET", SETTINGS, hub.read))[1]["dreaming"][
        "data_source_read_budget"] == 2  # the new name wins


async def test_a_bearer_put_refuses_a_bad_value_by_field_and_changes_nothing(hub: Hub) -> None:
    before = await hub.call("GET", SETTINGS, hub.read)
    for body, field in (({"default_visibility": "team"}, "default_visibility"),
                        ({"mmr": {"lambda": "high"}}, "mmr.lambda"),
                        ({"precedent": {"memory_limit": -1}}, "precedent.memory_limit"),
                        ({"dreaming": {"connector_read_budget": "x"}},
                         "dreaming.connector_read_budget")):
        status, err = await hub.call("PUT", SETTINGS, hub.write, body)
        assert (status, err["error"]["field"]) == (422, field), (body, err)
    assert (await hub.call("PUT", SETTINGS, None, {}))[0] == 401
    assert await hub.call("GET", SETTINGS, hub.read) == before


async def test_the_page_keeps_its_patch(hub: Hub) -> None:
    """The page sends only the keys changed (syncd/web/static/app.js): a page session's PUT
    still patches, needs write and answers the whole settings."""
    assert await hub.call("PUT", SETTINGS, hub.write, {"w_graph": 0.7}) == (200, {"ok": True})
    status, as_reader = await page_login(hub.http, hub.url, hub.read)
    assert status == 200
    async with hub.http.put(hub.url + SETTINGS, json={"w_keyword": 0.9},
                            headers=as_reader) as resp:
        assert resp.status == 403
    _, as_writer = await page_login(hub.http, hub.url, hub.write)
    async with hub.http.put(hub.url + SETTINGS, json={"w_keyword": 0.9},
                            headers=as_writer) as resp:
        answer = await resp.json()
        assert resp.status == 200, answer
    assert (answer["w_keyword"], answer["w_graph"]) == (0.9, 0.7)
    assert answer["precedent"] == PLANE_BLOCKS["precedent"]


# ---------------------------------------------------------------------- 4. the query answer

async def test_a_query_answer_has_precedent_and_string_realms(hub: Hub) -> None:
    rows = {"memory_nodes": [
        {"id": f"memory:{uuid.uuid4()}", "content": f"the queue {i} belongs to the payments "
         "team", "realm": realm, "updated_at": "2026-01-01T00:00:00+00:00"}
        for i, realm in enumerate(("payments", "default"))]}
    status, result = await hub.call("POST", "/v1/agent/memory/import", hub.write, rows)
    assert status == 200 and result["applied_nodes"] == 2, result
    status, answer = await hub.call("POST", "/v1/agent/memory/query", hub.read,
                                    {"query": "which team owns the queue"})
    assert status == 200
    assert "precedent" in answer and answer["precedent"] is None
    assert {m["realm"] for m in answer["memories"]} == {"payments", "default"}
    status, empty = await hub.call("POST", "/v1/agent/memory/query", hub.read,
                                   {"query": "nothing", "realms": ["nowhere"]})
    assert status == 200 and empty["memories"] == [] and empty["precedent"] is None

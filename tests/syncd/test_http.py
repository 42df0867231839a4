"""The local API over a real socket: every route, the one error shape, and RELIABILITY L2–L7."""

from __future__ import annotations

import json
import re
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from syncd.http import create_app
from syncd.http.app import errors_middleware
from syncd.http.security import _public
from syncd.report import status_lines
from syncd.tools import TOOLS
from tests.local_store.test_embedder_failure import FlakyEmbedder
from tests.store_probe import dump_tables
from tests.syncd.conftest import TOKEN, Daemon


async def test_health_needs_no_token_and_says_nothing(daemon: Daemon) -> None:
    status, body, _ = await daemon.call("GET", "/healthz", headers={"X": "y"})
    assert (status, body) == (200, {"ok": True})


async def test_save_query_get_delete_round_trip(daemon: Daemon) -> None:
    status, saved, _ = await daemon.call("POST", "/v1/agent/memory/tools/save_memory",
                                         json={"content": "deploy with make release",
                                               "realm": "p"})
    assert status == 200 and isinstance(saved, dict) and saved["saved"] is True
    assert saved["conversationId"].startswith("conv-")
    status, found, _ = await daemon.call("POST", "/v1/agent/memory/query",
                                         json={"query": "deploy release", "realms": ["p"]})
    assert status == 200 and isinstance(found, dict)
    assert set(found) >= {"memories", "linked", "context", "took_ms"}
    assert found["memories"][0]["id"] == saved["node_id"]
    assert found["context"].startswith("Relevant memories:\n- [fact] deploy with make release")
    status, item, _ = await daemon.call("GET", f"/v1/agent/memory/items/{saved['id']}")
    assert status == 200 and isinstance(item, dict) and item["content"].startswith("deploy")
    status, gone, _ = await daemon.call("DELETE",
                                        f"/v1/agent/memory/items/{saved['id']}?hard=true")
    assert status == 200 and isinstance(gone, dict) and gone["hard"] is True
    status, err, _ = await daemon.call("GET", f"/v1/agent/memory/items/{saved['id']}")
    assert status == 404 and isinstance(err, dict) and err["error"]["code"] == "not_found"


async def test_a_rest_not_found_names_the_argument_that_named_the_id(daemon: Daemon) -> None:
    """As MCP's tool errors do: the field was null, the argument only the message's prefix."""
    status, saved, _ = await daemon.call("POST", "/v1/agent/memory/tools/save_memory",
                                         json={"content": "judge me"})
    assert status == 200 and isinstance(saved, dict)
    status, err, _ = await daemon.call("POST", "/v1/agent/memory/tools/memory_judge", json={
        "memory_id": saved["node_id"], "target_id": "memory:nope", "verdict": "related"})
    assert status == 404 and isinstance(err, dict), err
    assert (err["error"]["code"], err["error"]["field"]) == ("not_found", "target_id")


async def test_export_changes_import(daemon: Daemon) -> None:
    await daemon.call("POST", "/v1/agent/memory/tools/save_memory",
                      json={"content": "one", "realm": "a"})
    status, body, _ = await daemon.call("GET", "/v1/agent/memory/export?realm=a")
    assert status == 200 and isinstance(body, dict)
    assert [n["content"] for n in body["memory_nodes"]] == ["one"]
    assert "title" not in body["memory_nodes"][0]  # null keys omitted, as the plane does
    status, empty, _ = await daemon.call("GET", "/v1/agent/memory/export?realm=")
    assert isinstance(empty, dict) and empty["memory_nodes"] == []
    status, ch, _ = await daemon.call("GET", "/v1/agent/memory/changes?since=")
    assert status == 200 and isinstance(ch, dict) and len(ch["memory_nodes"]) == 1
    status, later, _ = await daemon.call("GET", "/v1/agent/memory/changes",
                                         params={"since": ch["until"]})
    assert isinstance(later, dict) and later["memory_nodes"] == []
    row = {"id": "memory:imported", "content": "from a file", "updated_at":
           "2026-01-01T00:00:00Z", "embedding": [0.1] * 384}
    status, res, _ = await daemon.call("POST", "/v1/agent/memory/import", json={
        "memory_nodes": [row, {"id": "memory:bad"}], "memory_edges": []})
    assert status == 200 and isinstance(res, dict)
    assert res["applied_nodes"] == 1 and res["errors"] == ["nodes[1].updated_at: is required"]


async def test_settings_get_and_patch(daemon: Daemon) -> None:
    status, settings, _ = await daemon.call("GET", "/v1/agent/memory/settings")
    assert status == 200 and isinstance(settings, dict) and settings["w_graph"] == 0.5
    status, patched, _ = await daemon.call("PUT", "/v1/agent/memory/settings",
                                           json={"w_graph": 0.7})
    assert isinstance(patched, dict) and patched["w_graph"] == 0.7
    assert patched["w_recency"] == 0.3  # a patch, not the plane's replace
    for body in (b'{"w_rrf": NaN}', b'{"rrf_k": -Infinity}'):  # Python reads them; JSON has none
        status, err, _ = await daemon.call(
            "PUT", "/v1/agent/memory/settings", data=body,
            headers=daemon.auth(**{"Content-Type": "application/json"}))
        assert status == 400 and isinstance(err, dict) and err["error"]["code"] == "bad_json"
        assert "is not a JSON value" in err["error"]["message"]
    status, err, _ = await daemon.call("PUT", "/v1/agent/memory/settings", json={"rrf_k": 0})
    assert status == 422 and isinstance(err, dict) and err["error"]["field"] == "rrf_k"
    status, err, _ = await daemon.call("PUT", "/v1/agent/memory/settings",
                                       json={"w_graph": 0.9, "w_keywrd": 0.5})  # a typo
    assert status == 422 and isinstance(err, dict) and err["error"]["field"] == "w_keywrd"
    assert "did you mean w_keyword?" in err["error"]["message"]
    status, after, _ = await daemon.call("GET", "/v1/agent/memory/settings")
    assert after == patched  # neither key stored


async def test_every_tool_is_a_route(daemon: Daemon) -> None:
    status, listed, _ = await daemon.call("POST", "/v1/agent/memory/tools/list_memories",
                                          json={})
    assert status == 200 and isinstance(listed, dict) and "columns" in listed
    for name in TOOLS:
        status, body, _ = await daemon.call("POST", f"/v1/agent/memory/tools/{name}", json={
            "memory_id": 5})
        assert status in (200, 404, 422), (name, status, body)
        if status != 200:
            assert isinstance(body, dict) and set(body["error"]) <= {"code", "message", "field"}
    status, body, _ = await daemon.call("POST", "/v1/agent/memory/tools/nope", json={})
    assert status == 404 and isinstance(body, dict) and body["error"]["code"] == "not_found"


async def test_metrics(daemon: Daemon) -> None:
    await daemon.call("GET", "/v1/agent/memory/settings")
    status, text, _ = await daemon.call("GET", "/metrics")
    assert status == 200 and isinstance(text, str)
    assert 'syncd_http_requests_total{route="/v1/agent/memory/settings",method="GET",' \
           'status="200"} 1' in text
    assert "syncd_outbox_depth 0" in text and "syncd_store_bytes" in text


# ---------------------------------------------------------------------- L2–L7

BAD_HOSTS = ["evil.test:{port}", "localhost.evil.com:{port}", "", "127.0.0.2:{port}",
             # a loopback name with something after it is not that name (nor is a port of
             # letters): the allow-list is exact
             "[::1]evil.com", "[::1].evil.com:{port}", "localhost:{port}@evil.com",
             "127.0.0.1:not-a-port", "localhost:{port}:{port}"]
GOOD_HOSTS = ["localhost:{port}", "127.0.0.1:{port}", "[::1]:{port}", "LOCALHOST", "[::1]"]


@pytest.mark.parametrize("host", BAD_HOSTS)
async def test_foreign_host_is_refused_before_any_handler(daemon: Daemon, host: str) -> None:
    before = await dump_tables(daemon.store)
    status, body, _ = await daemon.call(
        "POST", "/v1/agent/memory/tools/save_memory", json={"content": "x"},
        headers=daemon.auth(Host=host.format(port=daemon.port)))
    assert status == 421 and isinstance(body, dict)
    assert body["error"]["code"] == "misdirected_host"
    assert await dump_tables(daemon.store) == before


@pytest.mark.parametrize("host", GOOD_HOSTS)
async def test_loopback_hosts_are_served(daemon: Daemon, host: str) -> None:
    status, _, _ = await daemon.call("GET", "/v1/agent/memory/settings",
                                     headers=daemon.auth(Host=host.format(port=daemon.port)))
    assert status == 200


@pytest.mark.parametrize("headers", [
    {"Origin": "https://evil.test"}, {"Origin": "null"}, {"Origin": "http://localhost.evil.com"},
    {"Sec-Fetch-Site": "cross-site"},
    # Another local port is another origin: a page served by another local program.
    {"Origin": "http://127.0.0.1:1"}, {"Origin": "http://localhost:3000"},
    {"Origin": "http://[::1]:8080"},
])
async def test_cross_site_requests_are_refused(daemon: Daemon, headers: dict[str, str]) -> None:
    before = await dump_tables(daemon.store)
    status, body, _ = await daemon.call("POST", "/v1/agent/memory/tools/save_memory",
                                        json={"content": "x"}, headers=daemon.auth(**headers))
    assert status == 403 and isinstance(body, dict)
    assert await dump_tables(daemon.store) == before


async def test_same_origin_is_served(daemon: Daemon) -> None:
    status, _, _ = await daemon.call("GET", "/v1/agent/memory/settings", headers=daemon.auth(
        Origin=f"http://127.0.0.1:{daemon.port}", **{"Sec-Fetch-Site": "same-origin"}))
    assert status == 200
    status, _, _ = await daemon.call("POST", "/v1/agent/memory/tools/save_memory",
                                     json={"content": "from the page"}, headers=daemon.auth(
        Host=f"localhost:{daemon.port}", Origin=f"http://LOCALHOST:{daemon.port}"))
    assert status == 200  # an origin's host is case-insensitive


async def test_writes_must_be_json(daemon: Daemon) -> None:
    before = await dump_tables(daemon.store)
    status, body, _ = await daemon.call(
        "POST", "/v1/agent/memory/tools/save_memory", data='{"content": "x"}',
        headers=daemon.auth(**{"Content-Type": "text/plain"}))
    assert status == 415 and isinstance(body, dict)
    status, _, _ = await daemon.call(
        "POST", "/v1/agent/memory/tools/save_memory", data="content=x",
        headers=daemon.auth(**{"Content-Type": "application/x-www-form-urlencoded"}))
    assert status == 415
    assert await dump_tables(daemon.store) == before


async def test_no_cors_headers_anywhere(daemon: Daemon) -> None:
    responses = [
        await daemon.call("OPTIONS", "/v1/agent/memory/query", headers={
            "Origin": "https://evil.test", "Access-Control-Request-Method": "POST"}),
        await daemon.call("GET", "/healthz"),
        await daemon.call("POST", "/v1/agent/memory/query", json={"query": "x"}),
        await daemon.call("GET", "/nope"),
    ]
    for _, _, headers in responses:
        assert not [h for h in headers if h.lower().startswith("access-control-")]


@pytest.mark.parametrize(("headers", "params"), [
    ({}, {}),
    ({"Authorization": "Bearer wrong"}, {}),
    ({"Authorization": f"bearer {TOKEN}"}, {}),
    ({"Authorization": TOKEN}, {}),
    ({}, {"token": TOKEN}),
    ({"Authorization": f"Bearer {TOKEN}"}, {"access_token": TOKEN}),
])
async def test_token_required_in_the_header(daemon: Daemon, headers: dict[str, str],
                                            params: dict[str, str]) -> None:
    for path in ("/v1/agent/memory/settings", "/metrics", "/v1/agent/memory/export"):
        status, body, resp_headers = await daemon.call("GET", path, headers=headers or {"X": "1"},
                                                       params=params)
        assert status == 401 and isinstance(body, dict)
        assert body["error"]["code"] == "unauthorized"
        assert resp_headers["WWW-Authenticate"].startswith("Bearer")


async def test_oversized_body_is_413(daemon: Daemon) -> None:
    before = await dump_tables(daemon.store)
    status, body, _ = await daemon.call("POST", "/v1/agent/memory/tools/save_memory",
                                        json={"content": "x" * (128 * 1024)})
    assert status == 413 and isinstance(body, dict) and body["error"]["code"] == "too_large"
    assert await dump_tables(daemon.store) == before


BAD_INPUT: list[tuple[str, str, Any, int, str | None]] = [
    ("POST", "/v1/agent/memory/query", "{not json", 400, None),
    ("POST", "/v1/agent/memory/query", {"limit": 3}, 422, "query"),
    ("POST", "/v1/agent/memory/query", {"query": "x", "limit": "ten"}, 422, "limit"),
    ("POST", "/v1/agent/memory/query", {"query": "x", "as_of": "yesterday"}, 422, "as_of"),
    ("POST", "/v1/agent/memory/query", [], 422, None),
    ("POST", "/v1/agent/memory/import", {"memory_nodes": "x"}, 422, "memory_nodes"),
    ("POST", "/v1/agent/memory/import", {"memory_nodes": [{"tags": ["a"]}]}, 422,
     "memory_nodes[0].tags"),
    # neither list (the wrong file, a misspelt key): before, 200 with nothing applied
    ("POST", "/v1/agent/memory/import", {}, 422, "memory_nodes, memory_edges"),
    ("POST", "/v1/agent/memory/import", {"nodes": [], "edges": []}, 422,
     "memory_nodes, memory_edges"),
    ("PUT", "/v1/agent/memory/settings", {"w_graph": "high"}, 422, "w_graph"),
    ("PUT", "/v1/agent/memory/settings", [1], 422, "body"),
    ("POST", "/v1/agent/memory/tools/save_memory", {"content": 5}, 422, "content"),
    ("POST", "/v1/agent/memory/tools/save_memory", {"content": "x", "tags": "a"}, 422, "tags"),
    ("POST", "/v1/agent/memory/tools/save_memory", "", 400, None),
    ("POST", "/v1/agent/memory/tools/update_memory_status",
     {"memory_id": "memory:x", "status": "gone"}, 422, "status"),
    ("POST", "/v1/agent/memory/tools/memory_judge", {"memory_id": "a", "target_id": "a",
                                                     "verdict": "x"}, 422, "target_id"),
    ("GET", "/v1/agent/memory/items/memory:missing", None, 404, None),
    ("DELETE", "/v1/agent/memory/items/memory:missing", None, 404, None),
    ("DELETE", "/v1/agent/memory/items/memory:x?hard=maybe", None, 422, "hard"),
    ("GET", "/v1/agent/memory/changes?since=garbage", None, 422, "since"),
    ("PATCH", "/v1/agent/memory/settings", {}, 405, None),
]


@pytest.mark.parametrize(("method", "path", "body", "status", "field"), BAD_INPUT)
async def test_every_route_rejects_bad_input_in_one_shape_and_changes_nothing(
        daemon: Daemon, method: str, path: str, body: Any, status: int,
        field: str | None) -> None:
    await daemon.call("POST", "/v1/agent/memory/tools/save_memory", json={"content": "seed"})
    before = await dump_tables(daemon.store)
    kw: dict[str, Any] = {}
    if isinstance(body, str):
        kw["data"] = body
        kw["headers"] = daemon.auth(**{"Content-Type": "application/json"})
    elif body is not None:
        kw["data"] = json.dumps(body)
        kw["headers"] = daemon.auth(**{"Content-Type": "application/json"})
    got, answer, _ = await daemon.call(method, path, **kw)
    assert got == status, answer
    assert isinstance(answer, dict) and set(answer) == {"error"}
    assert set(answer["error"]) <= {"code", "message", "field"}
    assert answer["error"]["code"] and answer["error"]["message"]
    if field is not None:
        assert answer["error"].get("field") == field
    assert await dump_tables(daemon.store) == before


async def test_status(daemon: Daemon) -> None:
    await daemon.call("POST", "/v1/agent/memory/tools/save_memory", json={"content": "x"})
    status, body, _ = await daemon.call("GET", "/v1/agent/status")
    assert status == 200 and isinstance(body, dict)
    assert body["memories"] == 1 and body["outbox"] == 1 and body["indexed_vectors"] == 1
    assert body["store_id"] == daemon.store.store_id


async def test_a_failing_embedder_shows_in_status_and_loses_no_save(daemon: Daemon) -> None:
    daemon.store.embedder = FlakyEmbedder()
    status, saved, _ = await daemon.call("POST", "/v1/agent/memory/tools/save_memory",
                                         json={"content": "deploy with make release"})
    assert status == 200 and isinstance(saved, dict) and saved["saved"] is True
    status, body, _ = await daemon.call("GET", "/v1/agent/status")
    assert status == 200 and isinstance(body, dict)
    assert body["memories"] == 1 and body["indexed_vectors"] == 0
    assert body["embedder_error"] == "RuntimeError: model.onnx: No such file or directory"
    lines = status_lines(body)
    assert lines[3].startswith("  embedder         hashing-384 — failing (RuntimeError: ")
    assert lines[3].endswith("recall is keyword-only until it works")


async def test_a_full_disk_is_507_in_the_one_error_shape(daemon: Daemon) -> None:
    conn = daemon.store._writer.conn
    conn.execute(f"PRAGMA max_page_count = {conn.execute('PRAGMA page_count').fetchone()[0]}")
    status, body, _ = await daemon.call("POST", "/v1/agent/memory/tools/save_memories", json={
        "memories": [{"content": f"note {i} " + "x" * 2000} for i in range(20)]})
    assert status == 507 and isinstance(body, dict)
    assert body["error"]["code"] == "disk_full"
    assert "is full: nothing was written" in body["error"]["message"]


async def test_an_unexpected_failure_is_500_in_the_one_error_shape(
        caplog: pytest.LogCaptureFixture) -> None:
    async def broken(request: web.Request) -> web.Response:
        raise RuntimeError("a bug with a secret in it")

    app = web.Application(middlewares=[errors_middleware])
    app.router.add_get("/broken", broken)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/broken"
        async with aiohttp.ClientSession() as session, session.get(url) as resp:
            assert resp.status == 500
            assert await resp.json() == {"error": {
                "code": "internal", "message": "internal error; the daemon's log has the details"}}
    finally:
        await runner.cleanup()
    assert "GET /broken failed" in caplog.text and "a bug with a secret in it" in caplog.text


async def test_mcp_over_http_answers_a_body_that_is_not_json_in_json_rpc(
        daemon: Daemon) -> None:
    """JSON-RPC's own Parse error (-32700, id null), as on stdio — not the REST error shape an
    MCP client cannot read; a good request still gets its answer."""
    for body in (b"{not json", b""):
        status, answer, _ = await daemon.call(
            "POST", "/mcp/v1", data=body,
            headers=daemon.auth(**{"Content-Type": "application/json"}))
        assert status == 200 and isinstance(answer, dict), (status, answer)
        assert (answer["jsonrpc"], answer["id"], answer["error"]["code"]) == ("2.0", None, -32700)
    status, answer, _ = await daemon.call("POST", "/mcp/v1", json={
        "jsonrpc": "2.0", "id": 7, "method": "tools/list"})
    assert status == 200 and isinstance(answer, dict) and answer["id"] == 7
    assert any(t["name"] == "save_memory" for t in answer["result"]["tools"])


async def test_every_route_but_the_public_ones_needs_the_token(daemon: Daemon) -> None:
    """L5 over the whole route table: no token, a wrong one, or the right one in the query
    string is a 401 on every route that is not public, and nothing is written."""
    before = await dump_tables(daemon.store)
    checked = []
    for route in create_app(daemon.store, token=TOKEN).router.routes():
        info = route.resource.get_info() if route.resource else {}
        path = info.get("path") or re.sub(r"\{[^}]+\}", "x", info.get("formatter", ""))
        if route.method == "HEAD" or _public(path):
            continue
        for headers, params in (({}, {}), ({"Authorization": "Bearer nope"}, {}),
                                ({}, {"token": TOKEN})):
            kw: dict[str, object] = {"headers": {**headers, "X-Probe": "1"}, "params": params}
            if route.method in ("POST", "PUT", "PATCH"):
                kw.update(data=b"{}", headers={**headers, "Content-Type": "application/json"})
            status, body, _ = await daemon.call(route.method, path, **kw)
            assert status == 401, (route.method, path, headers, params, status, body)
        checked.append((route.method, path))
    assert len(checked) >= 15, checked
    assert await dump_tables(daemon.store) == before


async def test_a_write_without_a_content_type_is_415_on_every_kind_of_write(
        daemon: Daemon) -> None:
    before = await dump_tables(daemon.store)
    for method, path in (("POST", "/v1/agent/memory/tools/save_memory"),
                         ("POST", "/v1/agent/memory/import"),
                         ("PUT", "/v1/agent/memory/settings"), ("POST", "/mcp/v1")):
        status, body, _ = await daemon.call(method, path, data=b'{"content": "x"}',
                                            headers=daemon.auth(**{"Content-Type": ""}))
        assert status == 415, (path, status, body)
    assert await dump_tables(daemon.store) == before


async def test_refusals_carry_no_cors_headers(daemon: Daemon) -> None:
    """L4 on the answers a browser sees first: 421, 403 and 401, and preflights."""
    for headers in ({"Host": "evil.test", "Origin": "https://evil.test"},
                    {"Origin": "https://evil.test"}, {"X-Probe": "1"}):
        for method in ("OPTIONS", "GET", "POST"):
            _, _, got = await daemon.call(method, "/v1/agent/memory/query", headers=headers)
            assert not [h for h in got if h.lower().startswith("access-control-")], got

"""The hub's wire surface: roles, the ingest feed's paging and `until`, paged export, settings
naming the model, and the verbatim cursor (R19)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from protocol.rows import NodeRow
from protocol.timestamp import format_ns
from syncd.hub.app import RefusalLog
from syncd.hub.tokens import Unauthorized
from tests.store_probe import dump_tables
from tests.sync.harness import MODEL, Hub, start_hub, start_laptop


@pytest.fixture
async def hub(tmp_path: Path) -> AsyncIterator[Hub]:
    h = await start_hub(tmp_path / "hub", "ingest")
    try:
        yield h
    finally:
        await h.close()


async def call(hub: Hub, method: str, path: str, token: str | None,
               **kw: Any) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as s, s.request(method, hub.url + path,
                                                       headers=headers, **kw) as resp:
        return resp.status, await resp.json(content_type=None)


def node(i: int) -> dict[str, Any]:
    return {"id": f"memory:00000000-0000-4000-8000-{i:012d}", "content": f"row {i}",
            "updated_at": f"2026-01-01T00:00:{i % 60:02d}.{i:06d}+00:00",
            "embedding": [0.0] * 384}


async def test_roles_gate_import_and_settings(hub: Hub) -> None:
    """read < write: a read token can pull but not import or change settings; none → 401."""
    body = {"memory_nodes": [node(1)]}
    status, err = await call(hub, "POST", "/v1/agent/memory/import", hub.read_token, json=body)
    assert status == 403 and err["error"]["code"] == "forbidden"
    status, err = await call(hub, "PUT", "/v1/agent/memory/settings", hub.read_token,
                             json={"w_graph": 0.7})
    assert status == 403
    status, _ = await call(hub, "GET", "/v1/agent/memory/changes", None)
    assert status == 401
    status, _ = await call(hub, "GET", "/v1/agent/memory/changes", "syncd_wrong")
    assert status == 401
    assert (await hub.store.maintenance.stats())["memories"] == 0
    status, result = await call(hub, "POST", "/v1/agent/memory/import", hub.token, json=body)
    assert status == 200 and result["applied_nodes"] == 1 and result["errors"] == []
    status, settings = await call(hub, "GET", "/v1/agent/memory/settings", hub.read_token)
    assert status == 200 and settings["embedding_model"] == MODEL


async def test_import_reports_each_bad_row_and_applies_the_rest(hub: Hub) -> None:
    """Per-row import errors name the row and field; good rows land."""
    bad = {"content": "no id", "updated_at": "2026-01-01T00:00:00+00:00"}
    status, result = await call(hub, "POST", "/v1/agent/memory/import", hub.token,
                                json={"memory_nodes": [node(1), bad, node(2)]})
    assert status == 200 and result["applied_nodes"] == 2
    assert result["row_errors"] == [{"kind": "node", "index": 1, "id": None, "field": "id",
                                     "message": "is required and must be a non-empty string"}]


async def test_feed_pages_on_import_boundaries_and_never_skips_a_late_row(hub: Hub) -> None:
    """Ingest order: rows stamped long ago but imported later still follow the cursor."""
    for batch in range(3):
        rows = [node(batch * 10 + i) for i in range(5)]
        status, _ = await call(hub, "POST", "/v1/agent/memory/import", hub.token,
                               json={"memory_nodes": rows})
        assert status == 200
    seen: list[str] = []
    since = ""
    while True:
        status, page = await call(hub, "GET", "/v1/agent/memory/changes", hub.read_token,
                                  params={"since": since, "limit": "3"})
        assert status == 200 and page["feed"] == "ingest"
        assert len(page["memory_nodes"]) in (5, 0)  # one whole import per page
        seen += [n["id"] for n in page["memory_nodes"]]
        since = page["until"]
        if not page["has_more"]:
            break
    assert len(seen) == len(set(seen)) == 15
    late = node(99) | {"updated_at": "2001-01-01T00:00:00+00:00"}  # an old offline edit
    await call(hub, "POST", "/v1/agent/memory/import", hub.token, json={"memory_nodes": [late]})
    status, page = await call(hub, "GET", "/v1/agent/memory/changes", hub.read_token,
                              params={"since": since})
    assert [n["id"] for n in page["memory_nodes"]] == [late["id"]]
    status, idle = await call(hub, "GET", "/v1/agent/memory/changes", hub.read_token,
                              params={"since": page["until"]})
    assert idle["memory_nodes"] == [] and idle["until"] == page["until"]


async def test_export_pages_include_tombstones(hub: Hub) -> None:
    """Paged export (limit/next_cursor) returns every row once, deletes included."""
    await call(hub, "POST", "/v1/agent/memory/import", hub.token,
               json={"memory_nodes": [node(i) for i in range(7)]})
    await hub.store.memories.delete(node(3)["id"])
    ids: list[str] = []
    cursor = None
    while True:
        params = {"limit": "3", **({"cursor": cursor} if cursor else {})}
        status, page = await call(hub, "GET", "/v1/agent/memory/export", hub.read_token,
                                  params=params)
        assert status == 200 and page["store_id"] == hub.store.store_id
        ids += [n["id"] for n in page["memory_nodes"]]
        if any(n.get("deleted") for n in page["memory_nodes"]):
            assert node(3)["id"] in [n["id"] for n in page["memory_nodes"] if n.get("deleted")]
        if not page["has_more"]:
            break
        cursor = page["next_cursor"]
    assert sorted(ids) == sorted(node(i)["id"] for i in range(7))
    status, err = await call(hub, "GET", "/v1/agent/memory/export", hub.read_token,
                             params={"limit": "0"})
    assert status == 422 and err["error"]["field"] == "limit"
    # without a limit, everything in one body (streamed a page at a time), tombstones too
    status, whole = await call(hub, "GET", "/v1/agent/memory/export", hub.read_token)
    assert status == 200 and whole["store_id"] == hub.store.store_id
    assert sorted(n["id"] for n in whole["memory_nodes"]) == sorted(ids)
    assert [n["id"] for n in whole["memory_nodes"] if n.get("deleted")] == [node(3)["id"]]


@pytest.mark.parametrize("cursor", ["ingest", "origin"])
async def test_the_cursor_is_the_planes_until_byte_for_byte(tmp_path: Path,
                                                            cursor: str) -> None:
    """R19: `until` is stored verbatim, whatever its form."""
    hub = await start_hub(tmp_path / "hub", cursor)
    laptop = await start_laptop("a", tmp_path / "a", hub.url, hub.token)
    try:
        await hub.store.replication.apply([NodeRow(**node(1))], [], model=MODEL)
        report = await laptop.sync()
        assert report.ok, report.error
        state = await laptop.store.replication.sync_state()
        async with aiohttp.ClientSession() as s, s.get(
                hub.url + "/v1/agent/memory/changes", params={"since": state["cursor"]},
                headers={"Authorization": f"Bearer {hub.token}"}) as resp:
            page = await resp.json()
        assert state["cursor"].endswith("+00:00") and "Z" not in state["cursor"]
        if cursor == "ingest":
            assert page["until"] == state["cursor"]
    finally:
        await laptop.close()
        await hub.close()



async def test_origin_mode_changes_stream_with_until_read_after_the_rows(tmp_path: Path) -> None:
    """Origin mode answers the plane's unpaged ``changes`` streamed a page at a time: one body
    with ``since`` echoed, the rows after it (tombstones too), the counts in headers, and
    ``until`` read once the rows are out; a bad ``since`` is a 422 naming it."""
    hub = await start_hub(tmp_path / "hub", "origin")
    try:
        rows = [node(i) for i in range(1, 1201)]  # three pages of 500
        for start in range(0, len(rows), 400):
            await call(hub, "POST", "/v1/agent/memory/import", hub.token,
                       json={"memory_nodes": rows[start:start + 400]})
        await call(hub, "POST", "/v1/agent/memory/import", hub.token,
                   json={"memory_nodes": [node(7) | {"deleted": True,
                                                     "updated_at": "2026-02-01T00:00:00Z"}]})
        since = rows[99]["updated_at"]
        before = format_ns(hub.store.clock.physical_ns())
        async with aiohttp.ClientSession() as s, s.get(
                hub.url + "/v1/agent/memory/changes", params={"since": since},
                headers={"Authorization": f"Bearer {hub.read_token}"}) as resp:
            counted = resp.headers["X-Syncd-Memories"], resp.headers["X-Syncd-Edges"]
            page = await resp.json()
        expected = {r["id"] for r in rows if r["updated_at"] > since} | {node(7)["id"]}
        assert counted == (str(len(expected)), "0")
        assert sorted(n["id"] for n in page["memory_nodes"]) == sorted(expected)
        assert [n["id"] for n in page["memory_nodes"] if n.get("deleted")] == [node(7)["id"]]
        assert page["since"] == since and page["store_id"] == hub.store.store_id
        assert page["until"] > before and "has_more" not in page
        status, err = await call(hub, "GET", "/v1/agent/memory/changes", hub.read_token,
                                 params={"since": "soon"})
        assert status == 422 and err["error"]["field"] == "since"
    finally:
        await hub.close()


async def test_feed_leaves_out_the_callers_own_versions_on_request(hub: Hub) -> None:
    """`exclude_origin` drops the caller's echo from `changes`; others still see it."""
    mine = node(1) | {"origin": "replica-a"}
    theirs = node(2) | {"origin": "replica-b"}
    await call(hub, "POST", "/v1/agent/memory/import", hub.token,
               json={"memory_nodes": [mine, theirs]})
    status, page = await call(hub, "GET", "/v1/agent/memory/changes", hub.read_token,
                              params={"since": "", "exclude_origin": "replica-a"})
    assert status == 200 and [n["id"] for n in page["memory_nodes"]] == [theirs["id"]]
    status, full = await call(hub, "GET", "/v1/agent/memory/changes", hub.read_token,
                              params={"since": ""})
    assert {n["id"] for n in full["memory_nodes"]} == {mine["id"], theirs["id"]}
    assert full["until"] == page["until"]


@pytest.mark.parametrize(("path", "params", "field"), [
    ("/v1/agent/memory/changes", {"limit": "ten"}, "limit"),
    ("/v1/agent/memory/changes", {"limit": "0"}, "limit"),
    ("/v1/agent/memory/changes", {"limit": "100000"}, "limit"),
    ("/v1/agent/memory/changes", {"since": "yesterday"}, "since"),
    ("/v1/agent/memory/export", {"limit": "5", "cursor": "abc"}, "cursor"),
    ("/v1/agent/memory/export", {"limit": "-1"}, "limit"),
])
async def test_bad_query_parameters_name_the_field_and_change_nothing(
        hub: Hub, path: str, params: dict[str, str], field: str) -> None:
    """One error shape naming the parameter; the hub's store is exactly as before."""
    await call(hub, "POST", "/v1/agent/memory/import", hub.token,
               json={"memory_nodes": [node(1)]})
    before = await dump_tables(hub.store)
    status, body = await call(hub, "GET", path, hub.read_token, params=params)
    assert status == 422 and body["error"]["field"] == field, body
    assert await dump_tables(hub.store) == before


async def test_refused_requests_are_logged_once_per_address_and_reason_a_minute(
        hub: Hub, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="syncd.hub")
    for _ in range(3):
        assert (await call(hub, "GET", "/v1/agent/memory/changes", "syncd_wrong"))[0] == 401
    assert (await call(hub, "POST", "/v1/agent/memory/import", hub.read_token,
                       json={"memory_nodes": []}))[0] == 403
    lines = [r.getMessage() for r in caplog.records if r.name == "syncd.hub"]
    assert lines == [
        "refused GET /v1/agent/memory/changes from 127.0.0.1: 401 unknown token",
        "refused POST /v1/agent/memory/import from 127.0.0.1: 403 token role `read` below "
        "required `write`"]
    assert "syncd_wrong" not in caplog.text  # a token, even a wrong one, is never logged


async def test_a_browsers_favicon_is_refused_without_a_warning(
        hub: Hub, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="syncd.hub")
    async with aiohttp.ClientSession() as s, s.get(hub.url + "/favicon.ico") as resp:
        assert resp.status == 401
    assert (await call(hub, "GET", "/v1/agent/memory/changes", None))[0] == 401
    assert [r.getMessage() for r in caplog.records if r.name == "syncd.hub"] == [
        "refused GET /v1/agent/memory/changes from 127.0.0.1: 401 missing Authorization: "
        "Bearer <token>"]


def test_the_refusal_log_speaks_again_after_its_interval(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="syncd.hub")
    now = [1000.0]
    refusals = RefusalLog(every=60.0, clock=lambda: now[0])
    unknown = Unauthorized("unknown token")
    for moment, remote in ((1000.0, "10.0.0.1"), (1059.0, "10.0.0.1"), (1059.0, "10.0.0.2"),
                           (1060.0, "10.0.0.1")):
        now[0] = moment
        refusals.note("GET", "/v1/agent/memory/changes", remote, unknown)
    assert [r.getMessage().split(" from ")[1] for r in caplog.records] == [
        "10.0.0.1: 401 unknown token", "10.0.0.2: 401 unknown token",
        "10.0.0.1: 401 unknown token"]

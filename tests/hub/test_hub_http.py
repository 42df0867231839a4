"""The hub's HTTP surface on both stores (SQLite and PostgreSQL): input PostgreSQL cannot hold
(U+0000) or count (a stamp beyond a 64-bit nanosecond count) is a 4xx naming the field or a
refused row, never a 500, and the web page's session can ask for an entitlement."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp import web
from yarl import URL

from syncd.hub.app import create_hub_app
from syncd.hub.store import HubStore
from tests.hub.test_conformance import node


@dataclass
class Served:
    url: str
    write: str
    read: str
    hub: HubStore


@pytest.fixture
async def served(hub_store: HubStore) -> AsyncIterator[Served]:
    """A hub app over the parametrized store, on port 0, issuing entitlements."""
    write = await hub_store.tokens.create(role="write", name="w")
    read = await hub_store.tokens.create(role="read", name="r")
    runner = web.AppRunner(create_hub_app(hub_store, signing_key=await hub_store.signing_key()))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield Served(f"http://127.0.0.1:{runner.addresses[0][1]}", write, read, hub_store)
    finally:
        await runner.cleanup()


async def call(served: Served, method: str, path: str, body: object = None,
               token: str | None = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token or served.read}",
               "Content-Type": "application/json"}
    data = None if body is None else msgspec.json.encode(body)
    async with aiohttp.ClientSession() as s, s.request(method, served.url + path, data=data,
                                                       headers=headers) as r:
        return r.status, await r.json(content_type=None)


async def test_a_row_holding_nul_is_refused_alone_never_the_whole_import(
        served: Served) -> None:
    """PostgreSQL text cannot hold U+0000: that row is refused naming its field and the rest
    of the import applies (before, a 500 for the whole batch, every pass: a laptop holding
    such a memory could push nothing more). SQLite stores it."""
    good = node("memory:good", "fine content", 1, vector=False)
    bad = node("memory:bad", "before\x00after", 1, vector=False)
    status, result = await call(served, "POST", "/v1/agent/memory/import",
                                {"memory_nodes": [good, bad]}, served.write)
    assert status == 200, result
    nodes, _ = await served.hub.export()
    held = {n.id for n in nodes}
    assert "memory:good" in held
    if served.hub.kind == "postgresql":
        assert "memory:bad" not in held
        assert [(e["index"], e["field"]) for e in result["row_errors"]] == [(1, "content")]
    else:
        assert "memory:bad" in held and result["applied_nodes"] == 2


@pytest.mark.parametrize("body", [{}, {"nodes": [], "edges": []}])
async def test_an_import_with_neither_list_is_a_422_naming_both(
        served: Served, body: dict[str, Any]) -> None:
    """As the daemon's import: a body holding neither ``memory_nodes`` nor ``memory_edges``
    applied nothing and answered 200; one list alone, even empty, is still an import."""
    status, answer = await call(served, "POST", "/v1/agent/memory/import", body, served.write)
    assert status == 422, answer
    assert answer["error"]["field"] == "memory_nodes, memory_edges"
    assert "memory_nodes" in answer["error"]["message"]
    assert "memory_edges" in answer["error"]["message"]
    for one in ({"memory_nodes": []}, {"memory_edges": []}):
        status, answer = await call(served, "POST", "/v1/agent/memory/import", one,
                                    served.write)
        assert status == 200 and answer["applied_nodes"] == 0, answer


@pytest.mark.parametrize(("path", "field"), [
    ("/v1/agent/memory/changes?realm=%00", "realm"),
    ("/v1/agent/memory/changes?exclude_origin=a%00b", "exclude_origin"),
    ("/v1/agent/memory/export?realm=%00", "realm"),
    ("/v1/agent/memory/export?limit=5&realm=x%00", "realm")])
async def test_a_parameter_holding_nul_is_a_422_naming_it(served: Served, path: str,
                                                          field: str) -> None:
    status, body = await call(served, "GET", path)
    assert status == 422 and body["error"]["field"] == field, (status, body)


@pytest.mark.parametrize(("body", "field"), [
    ({"query": "x", "realms": ["\x00"]}, "realms"), ({"query": "x", "tags": ["a\x00"]}, "tags"),
    ({"query": "x", "space_agent": "b\x00"}, "space_agent")])
async def test_a_query_holding_nul_is_a_422_naming_it(served: Served, body: dict[str, Any],
                                                      field: str) -> None:
    status, answer = await call(served, "POST", "/v1/agent/memory/query", body)
    assert status == 422 and answer["error"]["field"] == field, (status, answer)


@pytest.mark.parametrize("since", ["9999-12-31T23:59:59Z", "1600-01-01T00:00:00Z"])
async def test_a_since_beyond_64_bit_nanoseconds_is_answered(served: Served,
                                                             since: str) -> None:
    """Not a mark of this hub: no rows, and an ``until`` to go on from (as for any unknown
    mark), on both stores; before, PostgreSQL's bigint comparison made it a 500."""
    await served.hub.apply([node("memory:a", "a row", 1, vector=False)], [], model="x")
    status, body = await call(served, "GET", f"/v1/agent/memory/changes?since={since}")
    assert status == 200, body
    assert isinstance(body["until"], str) and "memory_nodes" in body


async def test_the_web_pages_session_can_ask_for_an_entitlement(served: Served) -> None:
    """The page signs in with a token and sends no Authorization header: the entitlement is
    issued for the session's token (before, 401 "unknown token")."""
    jar = aiohttp.CookieJar(unsafe=True)
    async with aiohttp.ClientSession(cookie_jar=jar) as s:
        async with s.post(served.url + "/ui/login", data=msgspec.json.encode(
                {"token": served.read}), headers={"Content-Type": "application/json"}) as r:
            assert r.status == 200
            key = (await r.json())["csrf"]  # the page sends its session's key on every request
        async with s.get(served.url + "/v1/agent/entitlement?device_id=d1",
                         headers={"X-CSRF-Token": key}) as r:
            body = await r.json()
            assert r.status == 200, body
    assert body["claims"]["sub"] == "r" and body["claims"]["device_id"] == "d1"


async def test_a_bearer_token_holding_a_byte_that_is_not_utf8_is_unknown_not_a_500(
        served: Served) -> None:
    """aiohttp hands such bytes on as surrogate escapes; hashing the token must not fail."""
    url = URL(served.url)
    reader, writer = await asyncio.open_connection(url.host, url.port)
    try:
        writer.write(b"GET /v1/agent/memory/settings HTTP/1.1\r\nHost: hub\r\n"
                     b"Authorization: Bearer tok\xffen\r\nConnection: close\r\n\r\n")
        await writer.drain()
        answer = await reader.read()
    finally:
        writer.close()
    assert answer.split(b" ", 2)[1] == b"401", answer[:200]


STATUS_KEYS = {"version", "role", "store", "store_id", "cursor", "embedding_model",
               "long_poll", "memories", "tombstones", "edges", "outbox", "indexed_vectors"}


async def test_the_status_has_one_shape_on_either_store(served: Served) -> None:
    """``GET /v1/agent/status`` names the same keys on SQLite and PostgreSQL; a count the store
    does not keep is null (SQLite: no per-process index count, PostgreSQL: no outbox)."""
    await call(served, "POST", "/v1/agent/memory/import",
               {"memory_nodes": [node("memory:one", "one row", 1, vector=False)]}, served.write)
    status, body = await call(served, "GET", "/v1/agent/status")
    assert status == 200 and set(body) == STATUS_KEYS
    assert (body["role"], body["store"], body["memories"]) == ("hub", served.hub.kind, 1)
    kept, absent = ("outbox", "indexed_vectors") if served.hub.kind == "sqlite" else (
        "indexed_vectors", "outbox")
    assert body[absent] is None
    assert all(isinstance(body[key], int) for key in ("tombstones", "edges", kept))

"""The hub's ``/metrics`` on both stores, read with Prometheus's own text parser: it needs a
``read`` token, values are exact, every metric has ``# HELP`` and ``# TYPE``, unknown methods
and paths add at most one label value each, and a refused request — no token, a wrong one, a
role too low — adds only to ``syncd_http_unauthorized_total``."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import msgspec
import pytest
from aiohttp import web

from syncd.hub.app import create_hub_app
from syncd.hub.store import HubStore, SqliteHubStore
from tests.hub.test_conformance import node
from tests.syncd.test_metrics import (
    EXTENSION_METHODS,
    UNAUTHORIZED,
    Series,
    help_and_type_lines,
    label_values,
    parse,
    unknown_methods,
    without_scrapes,
)


@dataclass
class Hub:
    url: str
    read: str
    write: str
    store: HubStore
    session: aiohttp.ClientSession

    async def call(self, method: str, path: str, token: str | None = None,
                   headers: dict[str, str] | None = None, **kw: object) -> int:
        headers = {**({"Authorization": f"Bearer {token}"} if token else {}), **(headers or {})}
        async with self.session.request(method, self.url + path, headers=headers,
                                        **kw) as resp:  # type: ignore[arg-type]
            await resp.read()
            return resp.status

    async def scrape(self) -> tuple[str, dict[str, Series]]:
        async with self.session.get(self.url + "/metrics", headers={
                "Authorization": f"Bearer {self.read}"}) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
            text = await resp.text()
        help_and_type_lines(text)
        return text, parse(text)


@pytest.fixture
async def hub(hub_store: HubStore) -> AsyncIterator[Hub]:
    read = await hub_store.tokens.create(role="read", name="prometheus")
    write = await hub_store.tokens.create(role="write", name="laptop")
    runner = web.AppRunner(create_hub_app(hub_store))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        async with aiohttp.ClientSession() as session:
            yield Hub(f"http://127.0.0.1:{runner.addresses[0][1]}", read, write, hub_store,
                      session)
    finally:
        await runner.cleanup()


async def test_the_page_needs_a_read_token(hub: Hub) -> None:
    assert await hub.call("GET", "/metrics") == 401
    assert await hub.call("GET", "/metrics", token="not-a-token") == 401
    assert await hub.call("GET", "/metrics", token=hub.read) == 200


async def test_the_page_counts_exactly_and_shows_the_store(hub: Hub) -> None:
    rows = msgspec.json.encode({"memory_nodes": [
        node(f"memory:{n}", f"row {n}", 1, vector=False) for n in range(3)]})
    assert await hub.call("POST", "/v1/agent/memory/import", hub.write, data=rows,
                          headers={"Content-Type": "application/json"}) == 200
    for _ in range(41):
        assert await hub.call("GET", "/v1/agent/memory/changes?since=", hub.read) == 200
    _, found = await hub.scrape()
    assert found["syncd_http_requests"][("syncd_http_requests_total", (
        ("method", "GET"), ("route", "/v1/agent/memory/changes"), ("status", "200")))] == 41
    assert found["syncd_http_request_duration_seconds"][(
        "syncd_http_request_duration_seconds_count",
        (("route", "/v1/agent/memory/import"),))] == 1
    stats = await hub.store.stats()
    for key in ("memories", "tombstones", "edges"):
        name = f"syncd_store_{key}"
        assert found[name] == {(name, ()): stats[key]}
    assert found["syncd_store_memories"] == {("syncd_store_memories", ()): 3}
    assert "syncd_outbox_depth" not in found  # a hub pushes nowhere
    if isinstance(hub.store, SqliteHubStore):
        await hub.store.store.maintenance.checkpoint()  # the WAL copied in now: the files keep their sizes
        _, found = await hub.scrape()
        assert found["syncd_store_bytes"] == {
            ("syncd_store_bytes", ()): await hub.store.store.maintenance.disk_bytes()}
    else:
        assert "syncd_store_bytes" not in found


async def test_unknown_methods_and_paths_add_at_most_one_label_value_each(hub: Hub) -> None:
    await hub.scrape()  # so the scrapes' own series are on the page before
    _, before = await hub.scrape()
    methods = unknown_methods(50, seed=3)
    for method in methods:
        assert await hub.call(method, "/v1/agent/memory/settings", hub.write) in (400, 405)
    for n in range(50):
        assert await hub.call("GET", f"/no/such/{n}/{random.random()}", hub.read) == 404
    _, after = await hub.scrape()
    assert label_values(after, "method") - label_values(before, "method") == {"other"}
    assert label_values(after, "route") - label_values(before, "route") == {"unmatched"}
    requests = after["syncd_http_requests"]
    other = sum(v for (_, labels), v in requests.items() if ("method", "other") in labels)
    assert other >= sum(m in EXTENSION_METHODS for m in methods)


async def test_a_refused_request_adds_only_the_unauthorized_count(hub: Hub) -> None:
    await hub.scrape()
    _, before = await hub.scrape()
    refused = 0
    attempts: list[tuple[str, str, str | None]] = [
        *((m, f"/v1/agent/memory/items/{n}", None)
          for n, m in enumerate(unknown_methods(50, seed=5))),
        *(("GET", f"/random/{n}", f"wrong-{n}") for n in range(20)),
        ("POST", "/v1/agent/memory/import", hub.read),  # a role too low: 403
        ("GET", "/v1/agent/status", None),
    ]
    for method, path, token in attempts:
        status = await hub.call(method, path, token)
        assert status in (400, 401, 403), (method, path, status)
        refused += status != 400  # 400: the C parser refused the method before the app
    _, after = await hub.scrape()
    assert refused >= 23
    count = UNAUTHORIZED.removesuffix("_total")
    assert after[count][(UNAUTHORIZED, ())] == before[count][(UNAUTHORIZED, ())] + refused
    assert without_scrapes(after) == without_scrapes(before)

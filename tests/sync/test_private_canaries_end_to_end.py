"""P7 end to end: canaries saved over HTTP (tool routes, MCP, import) in every malformed form,
then recall, export, changes, MCP calls, a sync push through a capturing proxy, DEBUG logs: no
canary byte in any response, captured request, log record, or file of the laptop or the hub."""
from __future__ import annotations

import json
import logging
import secrets
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from local_store import HashingEmbedder, Store
from syncd.http import create_app
from syncd.sync.engine import SyncEngine, SyncOptions
from syncd.sync.plane import PlaneClient
from tests.sync.harness import MODEL, start_hub
from tests.syncd.conftest import TOKEN
from tests.syncd.faultproxy import FaultProxy

FORMS = ["<private>{c}</private>", '<PRIVATE reason="x">{c}</PRIVATE>',
         "<private >{c}</private >", "<private>{c}", "{c}</private> rest",
         "<private>a<private>{c}</private>b</private>"]


def tails(canaries: list[str]) -> list[bytes]:
    out = []
    for c in canaries:
        t = c[-10:]
        out += [t.encode(), t.upper().encode(), t.encode("utf-16-le"), t.upper().encode("utf-16-le")]
    return out


def leaks(blob: bytes, canaries: list[str]) -> list[str]:
    return [c for c in canaries if any(t in blob for t in tails([c]))]


@pytest.mark.parametrize("mode", ["ingest", "origin"])
async def test_p7_no_canary_anywhere_end_to_end(tmp_path: Path, mode: str,
                                                caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    canaries: list[str] = []

    def c() -> str:
        value = "CANARY" + secrets.token_hex(8)
        canaries.append(value)
        return value

    hub = await start_hub(tmp_path / "hub", mode)
    proxy = FaultProxy(hub.url)
    await proxy.start()
    store = await Store.open(tmp_path / "laptop", embedder=HashingEmbedder())
    engine = SyncEngine(store, PlaneClient(proxy.url, hub.token, timeout=5),
                        SyncOptions(plane_model=MODEL))
    await engine.start()
    app = create_app(store, token=TOKEN)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    h = {"Authorization": f"Bearer {TOKEN}"}
    seen = b""
    try:
        async with aiohttp.ClientSession() as s:
            async def call(method: str, path: str, body: object = None) -> None:
                nonlocal seen
                async with s.request(method, url + path, headers=h, json=body) as r:
                    seen += await r.read() + repr(dict(r.headers)).encode()
            ids = []
            for form in FORMS:
                body = {"content": "keep " + form.format(c=c()), "title": form.format(c=c()),
                        "tags": ["t" + form.format(c=c())], "realm": "p",
                        "provenance": {"k": form.format(c=c())}}
                async with s.post(url + "/v1/agent/memory/tools/save_memory", headers=h,
                                  json=body) as r:
                    got = await r.json()
                    seen += json.dumps(got).encode()
                    assert r.status == 200, got
                    ids.append(got["node_id"])
                await call("POST", "/v1/agent/memory/tools/memory_note",
                           {"content": "note " + form.format(c=c()), "realm": "p"})
                await call("POST", "/mcp/v1", {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                               "params": {"name": "save_memory", "arguments": {
                                                   "content": "mcp " + form.format(c=c()),
                                                   "realm": "p"}}})
                await call("POST", "/v1/agent/memory/import", {"memory_nodes": [{
                    "id": f"memory:imp-{len(canaries)}", "content": "imp " + form.format(c=c()),
                    "realm": "p", "updated_at": "2026-01-01T00:00:00Z",
                    "embedding": [0.1] * 384}], "memory_edges": []})
                await call("POST", "/v1/agent/memory/query",
                           {"query": "keep " + form.format(c=c()), "realms": ["p"]})
            # JSON given as text, a literal closer in one string and an escaped span after it
            # (tests/sync/test_private_json_text.py has the store-level cases)
            escaped = '{"a":"x</private>","b":"\\u003cprivate>%s\\u003c/private>"}'
            async with s.post(url + "/v1/agent/memory/tools/save_memory", headers=h, json={
                    "content": "keep json text", "realm": "p", "provenance": escaped % c(),
                    "source_uris": "[" + escaped % c() + "]", "mentions": escaped % c()}) as r:
                got = await r.json()
                seen += json.dumps(got).encode()
                assert r.status == 200, got
                ids.append(got["node_id"])
            for mid in ids:
                await call("GET", f"/v1/agent/memory/items/{mid}")
            await call("GET", "/v1/agent/memory/export?realm=p")
            await call("GET", "/v1/agent/memory/changes?since=")
            await call("POST", "/mcp/v1", {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                                           "params": {"name": "memory_search",
                                                      "arguments": {"query": "keep"}}})
            report = await engine.run_pass("test")
            assert report.ok and report.pushed_nodes >= 3, report
    finally:
        await runner.cleanup()
        await engine.close()
        await store.close()
        await proxy.close()
        await hub.close()
    assert len(canaries) >= 40
    found = {}
    found["responses"] = leaks(seen, canaries)
    found["outbound"] = leaks(b"".join(r.body for r in proxy.requests), canaries)
    found["logs"] = leaks(caplog.text.encode(), canaries)
    for d in (tmp_path / "laptop", tmp_path / "hub"):
        for f in d.iterdir():
            if f.is_file():
                found[str(f.relative_to(tmp_path))] = leaks(f.read_bytes(), canaries)
    assert {k: v for k, v in found.items() if v} == {}
    assert b"[redacted]" in (tmp_path / "hub" / "memory.db").read_bytes()

"""P7: error messages that quote a caller's value quote it redacted.

1. The hub's ``limit`` and ``cursor`` query parameters: the 422 body quoted the raw value,
   private span included, where every store-side check (``parse_timestamp``,
   ``refuse_private_id``) never quotes one.
2. ``syncd import`` printed a refused row's raw ``id`` to stderr, where the daemon reports the
   same row's id through ``apply.safe_id`` (redacted).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
from pathlib import Path
from urllib.parse import quote

import aiohttp
import pytest
from aiohttp import web

from local_store import HashingEmbedder, Store
from syncd.client import Client
from syncd.http import create_app
from syncd.transfer import import_file
from tests.sync.harness import start_hub
from tests.syncd.conftest import TOKEN


def canary() -> str:
    return "CANARY" + secrets.token_hex(8)


@pytest.mark.parametrize("param", ["limit", "cursor"])
async def test_a_hub_query_parameter_error_quotes_it_redacted(tmp_path: Path, param: str) -> None:
    c = canary()
    hub = await start_hub(tmp_path / "hub", "ingest")
    try:
        value = quote(f"<private>{c}</private>")
        async with aiohttp.ClientSession() as s:
            extra = "&limit=10" if param == "cursor" else ""
            async with s.get(f"{hub.url}/v1/agent/memory/export?{param}={value}{extra}",
                             headers={"Authorization": f"Bearer {hub.token}"}) as r:
                body = await r.text()
                status = r.status
    finally:
        await hub.close()
    assert status == 422, body
    assert c not in body, body


async def test_syncd_import_names_a_refused_row_by_its_redacted_id(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    c = canary()
    store = await Store.open(tmp_path / "d", embedder=HashingEmbedder())
    runner = web.AppRunner(create_app(store, token=TOKEN))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    export = tmp_path / "export.json"
    export.write_text(json.dumps({"memory_nodes": [
        # ill-typed (title is a number): refused by the CLI before sending, labelled by its id
        {"id": f"memory:<private>{c}</private>", "title": 5, "content": "x",
         "updated_at": "2026-01-01T00:00:00Z"},
        {"id": "memory:00000000-0000-4000-8000-000000000001", "content": "fine",
         "updated_at": "2026-01-01T00:00:00Z"}], "memory_edges": []}))
    try:
        code = await asyncio.to_thread(
            import_file, Client(url, TOKEN), argparse.Namespace(file=export))
    finally:
        await runner.cleanup()
        await store.close()
    out = capsys.readouterr()
    assert code != 0  # one row refused
    assert c not in out.out + out.err, out.err

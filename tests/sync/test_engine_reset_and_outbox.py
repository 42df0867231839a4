"""Sync engine regressions: a reset keeps the learnt plane model and survives a failed pass
(R16), the egress guard judges ``<private`` as the redactor does (P2, P6), a row too large for
the plane does not block the outbox (R21), and a short pull re-stamps nothing (R12, R5). A real
hub, real laptops, the real fault proxy; no mocks."""

from __future__ import annotations

import asyncio
import gc
import json
import shutil
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from local_store import HashingEmbedder, Store
from syncd.entitlement.gate import TOKEN_FILENAME, Gate
from syncd.entitlement.token import sign
from syncd.hub.app import create_hub_app
from syncd.hub.tokens import TokenBook, create_token
from syncd.sync.engine import SyncEngine, SyncOptions
from syncd.sync.plane import PlaneClient
from syncd.sync.pull import BAD_ROW_PASSES
from syncd.sync.status import BACKOFF_CAP_SECS
from tests.entitlement.support import claims, pinned
from tests.store_probe import outbox_items
from tests.sync.harness import (
    MODEL,
    Hub,
    Laptop,
    live_contents,
    start_hub,
    start_laptop,
    tamper,
)
from tests.syncd.faultproxy import Fault, FaultProxy

CHANGES = "/v1/agent/memory/changes"
IMPORT = "/v1/agent/memory/import"
CONFIG_DEFAULT_MODEL = "bge-small-en-v1.5"  # control_plane.embedding_model's default
assert CONFIG_DEFAULT_MODEL != MODEL


async def save(store: Store, content: str) -> str:
    return str((await store.memories.save({"content": content}))["node_id"])


async def wipe(hub: Hub) -> Hub:
    """The hub loses its data (new store_id, new token) and comes back on the same port."""
    await hub.close()
    await asyncio.to_thread(shutil.rmtree, hub.data_dir)
    return await start_hub(hub.data_dir, hub.cursor, port=int(hub.url.rsplit(":", 1)[1]))


async def is_deleted(store: Store, memory_id: str) -> bool:
    rows = await store._fetch("SELECT deleted FROM memories WHERE id = ?", (memory_id,))
    return bool(rows[0][0])


# ---------------------------------------------------------------------- A: reset keeps the model

async def test_a_reset_keeps_the_learnt_plane_model(tmp_path: Path) -> None:
    """The full re-pull after a reset files vectors under the model the plane named, so a
    later push of the row sends its real embedding, not zeros over the plane's vector."""
    hub = await start_hub(tmp_path / "hub")
    async with FaultProxy(hub.url) as proxy:
        store = await Store.open(tmp_path / "a", embedder=HashingEmbedder())
        options = SyncOptions(plane_model=CONFIG_DEFAULT_MODEL)
        a = SyncEngine(store, PlaneClient(proxy.url, hub.token), options)
        c: Laptop | None = None
        try:
            assert (await a.run_pass()).ok
            assert (await store.replication.sync_state())["plane_model"] == MODEL  # learnt from settings

            hub = await wipe(hub)
            c = await start_laptop("c", tmp_path / "c", hub.url, hub.token)
            m = await save(c.store, "a: a memory with a real embedding")
            assert (await c.sync()).ok

            await a.close()
            a = SyncEngine(store, PlaneClient(proxy.url, hub.token), options)
            report = await a.run_pass()
            assert report.ok and report.reset == "store_id changed", report
            state = await store.replication.sync_state()
            assert state["plane_model"] == MODEL and state["feed"] == "ingest"
            models = [r[0] for r in await store._fetch(
                "SELECT model FROM vectors WHERE memory_id = ?", (m,))]
            assert models == [MODEL]

            await store.memories.update_importance(m, 0.9)
            assert (await a.run_pass()).ok
            sent = [n for r in proxy.requests if r.method == "POST" and r.path == IMPORT
                    for n in json.loads(r.body)["memory_nodes"] if n["id"] == m]
            assert sent and any(sent[-1]["embedding"]), "pushed back with a zero embedding"
        finally:
            await a.close()
            if c is not None:
                await c.close()
            await store.close()
            await hub.close()


# ---------------------------------------------------------------------- B: the egress guard

NOT_TAGS = ("keep the <privateKey> element out of the manifest", "<privately> held",
            "<private-x> is a custom element", "<privatefoo>", "escaped &lt;private&gt; text")
OPENERS = ("<private>p2-canary-1</private>", '<PRIVATE reason="x">p2-canary-2</PRIVATE>',
           "<private\np2-canary-3>", "p2-canary-4 <private", "<PRİVATE>p2-canary-5</private>")


async def test_the_egress_guard_refuses_openers_only(tmp_path: Path) -> None:
    """P2: text the redactor leaves alone is pushed; every opener form it would hide is still
    refused before sending (P6), counted, and no canary byte leaves."""
    hub = await start_hub(tmp_path / "hub")
    async with FaultProxy(hub.url) as proxy:
        a = await start_laptop("a", tmp_path / "a", proxy.url, hub.token)
        try:
            ids = [await save(a.store, text) for text in NOT_TAGS]
            report = await a.sync()
            assert report.ok and report.pushed_nodes == len(NOT_TAGS), report
            on_hub = await live_contents(hub.store)
            assert [on_hub[i][0] for i in ids] == list(NOT_TAGS)

            x = await save(a.store, "b: corrupted behind the redactor's back")
            for n, opener in enumerate(OPENERS, 1):
                await tamper(a.store, "UPDATE memories SET content = ? WHERE id = ?",
                             opener, x)
                report = await a.sync()
                assert not report.ok and report.error_kind == "egress_refused", (opener, report)
                assert a.engine.status.egress_refusals == n
            assert not any(b"p2-canary" in r.body for r in proxy.requests)
            assert x not in await live_contents(hub.store)
        finally:
            await a.close()
            await hub.close()


# ---------------------------------------------------------------------- C: a row too large

@pytest.fixture
async def small_hub(tmp_path: Path) -> AsyncIterator[tuple[str, str, Store]]:
    """A hub whose body limit is below the laptop's largest row (as axum's on the plane)."""
    hub_dir = tmp_path / "small-hub"
    store = await Store.open(hub_dir, embedder=HashingEmbedder(), feed=True)
    token = await asyncio.to_thread(create_token, hub_dir, role="write", name="laptops")
    book = await asyncio.to_thread(TokenBook, hub_dir)
    runner = web.AppRunner(create_hub_app(store, book, max_body=64 * 1024))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", token, store
    finally:
        await runner.cleanup()
        await store.close()


async def test_a_row_too_large_even_alone_stays_queued_and_the_rest_go(
        small_hub: tuple[str, str, Store], tmp_path: Path) -> None:
    """R21: the oversized row is skipped for the pass and reported; every later batch is still
    sent, and the pass ends ``held_back`` without a backoff."""
    url, token, hub_store = small_hub
    a = await start_laptop("a", tmp_path / "a", url, token, push_batch_bytes=20_000)
    try:
        big = await save(a.store, "x " * 60_000)  # ~120 KB: first in the outbox
        small = [await save(a.store, f"c: small note {i}") for i in range(6)]
        first = await a.sync()
        on_hub = set(await live_contents(hub_store))
        assert set(small) <= on_hub and big not in on_hub
        assert [item for _, item, _ in await outbox_items(a.store)] == [big]
        for report in (first, await a.sync()):
            assert not report.ok and report.error_kind == "held_back", report
            assert report.push_too_large == [f"node {big}"], report
            assert big in (report.error or "")
        status = a.engine.status
        assert status.too_large_rows == [f"node {big}"]
        assert status.consecutive_failures == 0 and status.next_attempt_in_secs == 0.0
    finally:
        await a.close()


# ---------------------------------------------------------------------- D: reset, failed pass

@pytest.mark.parametrize("failing", ["import", "re-pull"])
@pytest.mark.parametrize("mode", ["ingest", "origin"])
async def test_a_reset_survives_a_failed_pass(mode: str, failing: str, tmp_path: Path) -> None:
    """R16: the pass that detects the reset fails (on the push, or on the re-pull before any
    page committed); the next pass still runs anti-entropy and the plane gets back what it
    lost — a cursor-less pull is not taken for a finished bootstrap."""
    hub = await start_hub(tmp_path / "hub", mode)
    async with FaultProxy(hub.url) as proxy:
        a = await start_laptop("a", tmp_path / "a", proxy.url, hub.token)
        try:
            m1 = await save(a.store, "d: pushed to the hub before the wipe")
            assert (await a.sync()).ok
            hub = await wipe(hub)
            await a.close()
            a = await start_laptop("a", tmp_path / "a", proxy.url, hub.token)
            m2 = await save(a.store, "d: written while the hub was down")

            if failing == "import":
                proxy.inject(Fault("status", status=503, method="POST", path=IMPORT))
            else:  # the first changes detects the reset, the re-pull from the start fails
                proxy.inject(Fault("timeout", delay=0.0, method="GET", path=CHANGES),
                             Fault("status", status=503, method="GET", path=CHANGES))
            first = await a.sync()
            assert first.reset == "store_id changed" and not first.ok, first
            assert not first.anti_entropy
            after_first = await a.store.replication.sync_state()

            second = await a.sync()
            assert second.ok and second.anti_entropy, second
            assert {m1, m2} <= set(await live_contents(hub.store))
            assert "resync_pending" in after_first  # stored with the cleared cursor
            assert ("cursor" in after_first) == (failing == "import")
            assert "resync_pending" not in await a.store.replication.sync_state()
            third = await a.sync()
            assert third.ok and not third.anti_entropy, third
        finally:
            await a.close()
            await hub.close()


# ---------------------------------------------------------------------- E: a short pull

def corrupt(db: Path, memory_id: str) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE memories SET updated_at = 'not-a-time' WHERE id = ?", (memory_id,))


async def test_a_short_pull_holds_old_edits_so_a_stale_edit_cannot_beat_a_delete(
        tmp_path: Path) -> None:
    """R12 with R5: while a bad row holds A's cursor before B's delete of x, A's old edit of x
    stays queued (staging would re-stamp it to now) and the pass is not ok. Once the row is
    skipped, A pulls the delete and x stays deleted everywhere. (A recent write still goes
    during a short pull: test_bad_rows, origin mode.)"""
    hub = await start_hub(tmp_path / "hub")
    # overlap 1 s: queued versions older than 0.5 s are re-stamped at push
    a = await start_laptop("a", tmp_path / "a", hub.url, hub.token, overlap_secs=1.0)
    b = await start_laptop("b", tmp_path / "b", hub.url, hub.token, overlap_secs=1.0)
    try:
        x = await save(b.store, "e: the deploy key lives in vault")
        assert (await b.sync()).ok and (await a.sync()).ok
        await a.store.memories.update_importance(x, 0.9)  # A's edit; A is offline from here
        notes = [await save(b.store, f"e: release note {i}") for i in range(300)]
        assert (await b.sync()).ok
        await asyncio.to_thread(corrupt, hub.store.db_path, notes[0])
        await b.store.memories.delete(x)  # after A's edit
        assert (await b.sync()).ok and await is_deleted(hub.store, x)
        await asyncio.sleep(1.0)  # A's queued edit is now old enough to be re-stamped

        for _ in range(1, BAD_ROW_PASSES):
            report = await a.sync()
            assert report.pull_problems >= 1
            assert await is_deleted(hub.store, x), "A's stale edit resurrected x"
            assert report.pull_stopped and report.push_held == 1, report
            assert report.push_requests == 0 and await outbox_items(a.store) != []
            assert not report.ok and report.error_kind == "held_back", report
            assert a.engine.status.consecutive_failures == 0  # no backoff: the plane answered
        report = await a.sync()  # the bad row is skipped: the pull completes
        assert report.ok and not report.pull_stopped, report
        assert await is_deleted(a.store, x) and await is_deleted(hub.store, x)
        assert (await a.sync()).ok and await is_deleted(hub.store, x)
    finally:
        await a.close()
        await b.close()
        await hub.close()


# ---------------------------------------------------------------------- E: the gate, backoff

async def test_a_licence_that_ends_mid_pass_stops_the_pass_before_its_push(
        tmp_path: Path) -> None:
    """E3 (the grace ends exactly at ``exp``), E7 (no push while gated): a pass that started
    entitled, whose pull outlived ``exp``, used to push anyway."""
    hub = await start_hub(tmp_path / "hub")
    store = await Store.open(tmp_path / "laptop", embedder=HashingEmbedder())
    key = Ed25519PrivateKey.generate()
    now = time.time()
    token = sign(key, claims(now, device=store.replica_id, exp=now + 2))
    await asyncio.to_thread((tmp_path / "laptop" / TOKEN_FILENAME).write_text, token + "\n")
    gate = Gate(tmp_path / "laptop", pinned(key), store.replica_id)
    assert (await asyncio.to_thread(gate.evaluate)).entitled
    async with FaultProxy(hub.url) as proxy:
        engine = SyncEngine(store, PlaneClient(proxy.url, hub.token, timeout=10),
                            SyncOptions(plane_model=MODEL), gate=lambda: gate.allows("sync"))
        await engine.start()
        try:
            await save(store, "written while entitled, due to be pushed after exp")
            proxy.inject(Fault("timeout", delay=3.0, path="/changes"))  # the pull outlives exp
            async with asyncio.timeout(30):
                report = await engine.run_pass("schedule")
            assert gate.allows("sync") == "expired"
            assert proxy.count("POST", "/import") == 0
            assert (report.ok, report.error_kind, report.pushed_nodes) == (False, "gated", 0)
            assert engine.status.gated == "expired"
            assert engine.status.consecutive_failures == 0  # paused, not failed
            assert await store.replication.outbox_depth() == 1  # still queued for when it is entitled
        finally:
            await engine.close()
            await store.close()
            await hub.close()


async def test_a_huge_retry_after_is_honoured_only_up_to_the_backoff_cap(
        tmp_path: Path) -> None:
    """R20: a 429 with ``Retry-After: 1000000000`` set the next attempt 31 years away, so
    scheduled sync stopped until a restart."""
    hub = await start_hub(tmp_path / "hub")
    async with FaultProxy(hub.url) as proxy:
        laptop = await start_laptop("a", tmp_path / "a", proxy.url, hub.token)
        try:
            proxy.inject(Fault("retry_after", retry_after=1_000_000_000, path="/changes"))
            report = await laptop.sync()
            assert not report.ok and report.error_kind == "transient"
            assert 0 < laptop.engine.status.next_attempt_in_secs <= BACKOFF_CAP_SECS
        finally:
            await laptop.close()
            await hub.close()


async def test_a_prefetched_page_that_failed_while_the_pull_stopped_is_not_left_unread(
        tmp_path: Path) -> None:
    """The next page is fetched while one is applied. When that page held the cursor back (a
    bad row, R5) and the prefetch had failed meanwhile (here the gate closed), nobody read the
    prefetch's exception: asyncio logged "Task exception was never retrieved"."""
    hub = await start_hub(tmp_path / "hub")
    a = await start_laptop("a", tmp_path / "a", hub.url, hub.token)
    b = await start_laptop("b", tmp_path / "b", hub.url, hub.token)
    unread: list[str] = []
    loop = asyncio.get_running_loop()
    handler = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: unread.append(str(context.get("message"))))
    try:
        for batch in range(3):  # three imports: the hub's pages end on import boundaries
            saved = await a.store.memories.save_many([{"content": f"release note {batch}.{i}"}
                                             for i in range(150)])
            assert (await a.sync()).ok
            if batch == 0:
                first = f"memory:{saved['ids'][0]}"  # in the first page b pulls
        await asyncio.to_thread(corrupt, hub.store.db_path, first)
        asked = 0

        def gate() -> str | None:  # open for the pass, the plane's settings and the first
            nonlocal asked  # page; closed by the time the next page is fetched
            asked += 1
            return None if asked <= 3 else "expired"

        b.engine.gate = gate
        report = await b.sync()
        assert (report.error_kind, report.pull_problems, report.pull_stopped) == (
            "gated", 1, True), report
        gc.collect()
        assert unread == []
    finally:
        loop.set_exception_handler(handler)
        await a.close()
        await b.close()
        await hub.close()

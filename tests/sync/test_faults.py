"""Sync under faults: a real hub (both cursor modes) behind the real fault-injecting proxy, real
laptops, real HTTP. RELIABILITY R6, R7, R16, R20, R21, R22 and P6."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp import web

from local_store import Store, StoreLockedError
from protocol.timestamp import parse_ns
from syncd.sync.engine import PassReport
from syncd.sync.runner import SyncRunner
from syncd.sync.status import BACKOFF_BASE_SECS, BACKOFF_CAP_SECS
from tests.store_probe import dump_tables, integrity_check, outbox_items
from tests.sync.harness import (
    Hub,
    Laptop,
    edge_set,
    live_contents,
    restart_hub,
    start_hub,
    start_laptop,
    tamper,
)
from tests.syncd.faultproxy import Fault, FaultProxy

CHANGES = "/v1/agent/memory/changes"
IMPORT = "/v1/agent/memory/import"
EXPORT = "/v1/agent/memory/export"
SETTINGS = "/v1/agent/memory/settings"
ENDPOINTS = {"changes": ("GET", CHANGES), "import": ("POST", IMPORT),
             "export": ("GET", EXPORT), "settings": ("GET", SETTINGS)}
HTTP_TIMEOUT = float(os.environ.get("SYNCD_FAULT_HTTP_TIMEOUT", "1.0"))
ROWS = int(os.environ.get("SYNCD_FAULT_ROWS", "6"))
RETRY_AFTER = 40.0  # above every jittered delay before the cap, so the header must win
FAILURES = 12  # enough consecutive failures to reach BACKOFF_CAP_SECS
Opener = Callable[..., Awaitable[Laptop]]


# ---------------------------------------------------------------------- fixtures and helpers

@pytest.fixture(params=["ingest", "origin"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def hub(mode: str, tmp_path: Path) -> AsyncIterator[Hub]:
    h = await start_hub(tmp_path / "hub", mode)
    try:
        yield h
    finally:
        await h.close()


@pytest.fixture
async def proxy(hub: Hub) -> AsyncIterator[FaultProxy]:
    async with FaultProxy(hub.url) as p:
        yield p


@pytest.fixture
async def laptop(tmp_path: Path) -> AsyncIterator[Opener]:
    """``await laptop(name, url, token, **options)``: a laptop closed at teardown."""
    opened: list[Laptop] = []

    async def open_laptop(name: str, url: str, token: str, **kw: Any) -> Laptop:
        lap = await start_laptop(name, tmp_path / name, url, token, **kw)
        opened.append(lap)
        return lap

    try:
        yield open_laptop
    finally:
        for lap in reversed(opened):
            await lap.close()


async def save(store: Store, content: str, **extra: object) -> str:
    return str((await store.memories.save({"content": content, **extra}))["node_id"])


async def outbox_keys(store: Store) -> set[tuple[str, str]]:
    return {(kind, item) for kind, item, _ in await outbox_items(store)}


async def content_view(store: Store) -> dict[str, list[tuple[Any, ...]]]:
    """The store's data without what a pass may legitimately change while it fails: version
    stamps and seqs (push re-stamps queued items), sync state and the clock (``meta``)."""
    return {
        "memories": [tuple(r) for r in await store._fetch(
            "SELECT id, content, title, tags, status, importance, invalid_at, superseded_by, "
            "deleted FROM memories ORDER BY id")],
        "edges": [tuple(r) for r in await store._fetch(
            "SELECT id, src, dst, type, props, deleted FROM edges ORDER BY id")],
        "vectors": [tuple(r) for r in await store._fetch(
            "SELECT memory_id, model, vec FROM vectors ORDER BY memory_id, model")],
    }


async def cursor(store: Store) -> str | None:
    return (await store.replication.sync_state()).get("cursor")


async def converged(hub: Hub, *laptops: Laptop) -> None:
    want, edges = await live_contents(hub.store), await edge_set(hub.store)
    for lap in laptops:
        assert await live_contents(lap.store) == want, lap.name
        assert await edge_set(lap.store) == edges, lap.name
        assert (await lap.store.maintenance.stats())["outbox"] == 0, lap.name


async def assert_intact(*stores: Store) -> None:
    for store in stores:
        assert await integrity_check(store) == "ok"


def backoff_bounds(n: int, retry_after: float | None = None) -> tuple[float, float]:
    """The engine's documented delay after ``n`` consecutive failures: capped exponential with
    jitter in [half, full], and never below a ``Retry-After``."""
    full = min(BACKOFF_CAP_SECS, BACKOFF_BASE_SECS * 2 ** (n - 1))
    low, high = full / 2, full
    if retry_after is not None:
        low, high = max(low, retry_after), max(high, retry_after)
    return low - 1e-3, high + 1e-3


# ---------------------------------------------------------------------- R6 / R7

@pytest.mark.parametrize("kind", ["drop_after_commit", "reset_mid_body"])
async def test_push_committed_then_dropped_is_retried_into_one_version(
        kind: str, hub: Hub, proxy: FaultProxy, laptop: Opener) -> None:
    """R6: the plane commits a push then drops the connection → retry → one logical version."""
    a = await laptop("a", proxy.url, hub.token)
    ids = [await save(a.store, f"r6 note {i} about retries") for i in range(ROWS)]
    await a.store.graph.link({"memory_id": ids[0], "target_node_id": "repo:syncd"})
    proxy.inject(Fault(kind, method="POST", path=IMPORT))  # type: ignore[arg-type]

    report = await a.sync()
    assert not report.ok and report.error_kind == "transient", report
    assert set(await live_contents(hub.store)) == set(ids)  # the plane did commit
    assert len(await outbox_items(a.store)) == ROWS + 1  # ... but nothing was acknowledged

    report = await a.sync()
    assert report.ok, report.error
    assert proxy.count("POST", IMPORT) == 2
    hub_rows, mine = await live_contents(hub.store), await live_contents(a.store)
    assert sorted(hub_rows) == sorted(ids) == sorted(mine)  # one row per id, no duplicates
    assert hub_rows == mine  # and it is the laptop's version
    assert await edge_set(hub.store) == await edge_set(a.store)
    assert (await hub.store.maintenance.stats())["memories"] == ROWS
    assert await outbox_items(a.store) == []
    await assert_intact(a.store, hub.store)


async def test_write_during_an_inflight_push_is_pushed_later(
        hub: Hub, proxy: FaultProxy, laptop: Opener) -> None:
    """R7: a write committed while a push is in flight is still pushed by the next pass."""
    a = await laptop("a", proxy.url, hub.token, http_timeout=10.0)
    assert (await a.sync()).ok  # the first pass's anti-entropy is done: it won't re-queue
    x = await save(a.store, "r7 first version of x", topic_key="r7-x")
    proxy.inject(Fault("timeout", delay=1.0, method="POST", path=IMPORT))  # slow, succeeds
    running = asyncio.create_task(a.sync())
    async with asyncio.timeout(30):
        await proxy.wait_count(1, "POST", IMPORT)
    assert await save(a.store, "r7 second version of x", topic_key="r7-x") == x
    y = await save(a.store, "r7 a memory written during the push")
    held = [c for c in proxy.requests if c.method == "POST" and c.path == IMPORT]
    assert held[0].status is None  # both writes landed while the push was still in flight
    report = await running
    assert report.ok and report.pushed_nodes == 1, report
    assert await outbox_keys(a.store) == {("node", x), ("node", y)}
    assert (await hub.store.memories.get(x))["content"] == "r7 first version of x"

    report = await a.sync()
    assert report.ok and report.pushed_nodes == 2, report
    assert (await hub.store.memories.get(x))["content"] == "r7 second version of x"
    assert (await hub.store.memories.get(y))["content"] == "r7 a memory written during the push"
    await converged(hub, a)


# ---------------------------------------------------------------------- R16

async def _stop_copy_restart(hub: Hub, src: Path, dst: Path) -> Hub:
    """Stop the hub, replace ``dst`` by a copy of ``src`` (a cold backup or restore), restart
    it on the same port."""
    await hub.close()

    def copy() -> None:
        if dst.exists():
            shutil.rmtree(dst)
        shutil.copytree(src, dst)

    await asyncio.to_thread(copy)
    return await restart_hub(hub)


async def test_wiped_hub_is_detected_and_fully_resynced(
        mode: str, tmp_path: Path, laptop: Opener) -> None:
    """R16: the plane is wiped (new store_id) → detected → full resync restores everything."""
    hub = await start_hub(tmp_path / "hub", mode)
    try:
        a = await laptop("a", hub.url, hub.token)
        b = await laptop("b", hub.url, hub.token)
        a1 = await save(a.store, "r16 wipe: a's first memory")
        await save(a.store, "r16 wipe: a's second memory")
        await a.store.graph.link({"memory_id": a1, "target_node_id": "repo:syncd"})
        b1 = await save(b.store, "r16 wipe: b's memory")
        b2 = await save(b.store, "r16 wipe: b's memory, deleted later")
        await b.store.memories.delete(b2)
        for lap in (a, b, a):
            assert (await lap.sync()).ok
        had = await live_contents(a.store)
        assert b1 in had and b2 in had

        port = int(hub.url.rsplit(":", 1)[1])
        old_store_id = hub.store.store_id
        await hub.close()
        await asyncio.to_thread(shutil.rmtree, hub.data_dir)
        hub = await start_hub(hub.data_dir, mode, port=port)
        assert hub.store.store_id != old_store_id
        # The wiped hub issued new tokens: each laptop restarts with its new one.
        await a.close()
        await b.close()
        a = await laptop("a", hub.url, hub.token)
        b = await laptop("b", hub.url, hub.token)

        report = await a.sync()
        assert report.ok and report.reset == "store_id changed" and report.anti_entropy, report
        assert set(await live_contents(hub.store)) == set(had)  # b's items too, via a
        report = await b.sync()
        assert report.ok and report.reset == "store_id changed", report
        assert (await a.sync()).ok
        await converged(hub, a, b)
        assert set(await live_contents(hub.store)) == set(had)
        await assert_intact(a.store, b.store, hub.store)
    finally:
        await hub.close()


async def test_hub_restored_from_an_older_backup_is_detected_and_repaired(
        mode: str, tmp_path: Path, laptop: Opener) -> None:
    """R16: the plane is restored from an older backup → detected → repaired within 2 passes."""
    # In origin mode `until` is the plane's wall clock and never goes backwards: the only
    # detector is anti-entropy, so it runs every pass there.
    ae = 0.0 if mode == "origin" else 3600.0
    hub = await start_hub(tmp_path / "hub", mode)
    try:
        a = await laptop("a", hub.url, hub.token, anti_entropy_secs=ae)
        b = await laptop("b", hub.url, hub.token, anti_entropy_secs=ae)
        a0 = await save(a.store, "r16 restore: in the backup")
        assert (await a.sync()).ok and (await b.sync()).ok
        hub = await _stop_copy_restart(hub, hub.data_dir, tmp_path / "backup")

        a1 = await save(a.store, "r16 restore: a's write after the backup")
        assert (await a.sync()).ok
        b1 = await save(b.store, "r16 restore: b's write after the backup")
        await b.store.memories.update_importance(a0, 0.9)
        await b.store.graph.link({"memory_id": b1, "target_node_id": "repo:syncd"})
        assert (await b.sync()).ok
        everything = set(await live_contents(b.store))
        assert everything == {a0, a1, b1}

        hub = await _stop_copy_restart(hub, tmp_path / "backup", hub.data_dir)
        assert set(await live_contents(hub.store)) == {a0}  # the restore lost a1 and b1

        reports = [await a.sync(), await b.sync()]
        if mode == "ingest":
            assert reports[0].reset == "until went backwards", reports[0]
        else:
            assert reports[0].anti_entropy and reports[0].requeued >= 1, reports[0]
        reports += [await a.sync(), await b.sync()]
        assert all(r.ok for r in reports), [r.error for r in reports]
        assert set(await live_contents(hub.store)) == everything
        assert (await hub.store.memories.get(a0))["importance"] == 0.9
        await converged(hub, a, b)
        await assert_intact(a.store, b.store, hub.store)
    finally:
        await hub.close()


# ---------------------------------------------------------------------- R20

def _transient_faults(method: str, path: str) -> list[tuple[Fault, float | None]]:
    """Every transient kind once, 429 last but one, then 503s until the backoff is capped."""
    faults: list[tuple[Fault, float | None]] = [
        (Fault("timeout", delay=30.0, method=method, path=path), None),
        (Fault("status", status=503, method=method, path=path), None),
        (Fault("reset_mid_body", method=method, path=path), None),
        (Fault("truncate_json", method=method, path=path), None),
        (Fault("status", status=500, method=method, path=path), None),
        (Fault("retry_after", retry_after=RETRY_AFTER, method=method, path=path), RETRY_AFTER),
    ]
    while len(faults) < FAILURES:
        faults.append((Fault("status", status=502, method=method, path=path), None))
    return faults


@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
async def test_transient_faults_back_off_without_corruption_then_heal(
        endpoint: str, hub: Hub, proxy: FaultProxy, laptop: Opener) -> None:
    """R20: timeouts, 5xx, resets, truncated JSON and 429 on each endpoint: no corruption, no
    cursor reset, capped jittered exponential backoff (≥ Retry-After), progress after healing."""
    method, path = ENDPOINTS[endpoint]
    # export and settings are read by anti-entropy: make it run every pass
    ae = 0.0 if endpoint in ("export", "settings") else 3600.0
    a = await laptop("a", proxy.url, hub.token, http_timeout=HTTP_TIMEOUT,
                     anti_entropy_secs=ae)
    b = await laptop("b", hub.url, hub.token)
    await save(b.store, "r20 from b before the faults")
    assert (await b.sync()).ok
    assert (await a.sync()).ok
    a1 = await save(a.store, "r20 written by a while the plane misbehaves")

    for n, (fault, retry_after) in enumerate(_transient_faults(method, path), start=1):
        dump, view = await dump_tables(a.store), await content_view(a.store)
        queued, before = await outbox_keys(a.store), await cursor(a.store)
        proxy.fail_always(fault)  # sticky: aiohttp silently retries a dropped GET once
        report = await a.sync()
        proxy.fail_always(None)
        where = f"{endpoint} {fault.kind} #{n}"
        seen = len(proxy.requests)
        assert await a.engine.scheduled() is None, where  # backing off: no request made
        assert len(proxy.requests) == seen, where
        assert not report.ok and report.error_kind == "transient", (where, report)
        assert proxy.count(method, path) > 0, where

        after = await cursor(a.store)
        assert after is not None, where  # never reset
        assert parse_ns(after) >= parse_ns(before or ""), where  # never backwards
        if endpoint == "changes":  # the request that moves the cursor failed: nothing moved
            assert await dump_tables(a.store) == dump, where
        else:
            assert await content_view(a.store) == view, where
            assert await outbox_keys(a.store) <= queued, where
            if endpoint == "import":
                assert await outbox_keys(a.store) == queued == {("node", a1)}, where
        await assert_intact(a.store, hub.store)

        status = a.engine.status
        assert status.consecutive_failures == n, where
        low, high = backoff_bounds(n, retry_after)
        assert low <= status.next_attempt_in_secs <= high, (where, status.next_attempt_in_secs)

    report = await a.sync()
    assert report.ok, report.error
    assert a.engine.status.consecutive_failures == 0
    assert a.engine.status.next_attempt_in_secs == 0.0
    assert (await b.sync()).ok
    assert (await b.store.memories.get(a1))["content"] == "r20 written by a while the plane misbehaves"
    await converged(hub, a, b)
    await assert_intact(a.store, b.store, hub.store)


# ---------------------------------------------------------------------- R21: auth

@pytest.mark.parametrize(("status", "method", "path"), [
    (401, "GET", CHANGES), (403, "GET", CHANGES), (401, "POST", IMPORT), (403, "POST", IMPORT)])
async def test_auth_failure_stops_sync_until_a_manual_pass(
        status: int, method: str, path: str, hub: Hub, proxy: FaultProxy,
        laptop: Opener) -> None:
    """R21: a 401/403 stops the pass, shows in status, and is not retried by the schedule."""
    a = await laptop("a", proxy.url, hub.token)
    x = await save(a.store, "r21 waits for the plane to accept the token")
    proxy.inject(Fault("status", status=status, method=method, path=path))

    report = await a.sync()
    assert not report.ok and report.error_kind == "auth", report
    assert a.engine.status.auth_blocked
    assert await outbox_keys(a.store) == {("node", x)}
    seen = len(proxy.requests)
    for _ in range(3):
        assert await a.engine.scheduled() is None
    assert len(proxy.requests) == seen  # no retry loop

    report = await a.sync()  # the plane accepts the token again; a manual run proceeds
    assert report.ok and report.pushed_nodes == 1, report
    assert not a.engine.status.auth_blocked
    assert await a.engine.scheduled() is not None  # the schedule resumes
    await converged(hub, a)


async def test_a_wrong_token_blocks_until_fixed(
        hub: Hub, proxy: FaultProxy, laptop: Opener) -> None:
    """R21: a real wrong token (401) or a read-only one pushing (403) blocks sync; no retry."""
    wrong = await laptop("a", proxy.url, "syncd_not-a-token-the-hub-issued")
    x = await save(wrong.store, "r21 pushed once the token is fixed")
    report = await wrong.sync()
    assert report.error_kind == "auth" and "401" in (report.error or ""), report
    assert wrong.engine.status.auth_blocked
    seen = len(proxy.requests)
    assert await wrong.engine.scheduled() is None
    assert len(proxy.requests) == seen
    await wrong.close()

    reader = await laptop("a", proxy.url, hub.read_token)
    report = await reader.sync()  # a read token may pull, the push is refused
    assert report.error_kind == "auth" and "403" in (report.error or ""), report
    assert reader.engine.status.auth_blocked and report.pull_pages >= 1
    seen = len(proxy.requests)
    assert await reader.engine.scheduled() is None
    assert len(proxy.requests) == seen
    assert await outbox_keys(reader.store) == {("node", x)}
    await reader.close()

    fixed = await laptop("a", proxy.url, hub.token)  # the token file fixed, daemon restarted
    report = await fixed.sync()
    assert report.ok and report.pushed_nodes == 1, report
    assert (await hub.store.memories.get(x))["content"] == "r21 pushed once the token is fixed"
    await converged(hub, fixed)


# ---------------------------------------------------------------------- R21: 413 and errors

async def test_413_splits_the_batch(hub: Hub, proxy: FaultProxy, laptop: Opener) -> None:
    """R21: a 413 on import halves the batch until it fits; everything arrives."""
    a = await laptop("a", proxy.url, hub.token)
    ids = {await save(a.store, f"r21 split note {i}") for i in range(ROWS)}
    proxy.inject(Fault("status", status=413, method="POST", path=IMPORT))
    report = await a.sync()
    assert report.ok, report.error
    assert report.push_splits >= 1 and report.pushed_nodes == ROWS, report
    assert proxy.count("POST", IMPORT) >= 3  # the refused batch, then both halves
    assert set(await live_contents(hub.store)) == ids
    await converged(hub, a)


async def test_push_batches_stay_under_the_byte_budget(
        hub: Hub, proxy: FaultProxy, laptop: Opener) -> None:
    """R21: pushes are packed into bodies no larger than ``push_batch_bytes``."""
    a = await laptop("a", proxy.url, hub.token)
    ids = {await save(a.store, f"r21 budget note {i}") for i in range(ROWS)}
    nodes, _ = await a.store.feed.read()
    row = max(len(msgspec.json.encode(node)) for node in nodes)
    budget = 64 + 2 * (row + 1) + row // 2  # room for two rows a batch, not three
    await a.close()
    a = await laptop("a", proxy.url, hub.token, push_batch_bytes=budget)
    report = await a.sync()
    assert report.ok and report.pushed_nodes == ROWS, report
    bodies = [c.body for c in proxy.requests if c.method == "POST" and c.path == IMPORT]
    assert len(bodies) >= ROWS // 2
    assert all(len(body) <= budget for body in bodies), [len(body) for body in bodies]
    assert sum(len(json.loads(body)["memory_nodes"]) for body in bodies) == ROWS
    assert set(await live_contents(hub.store)) == ids
    await converged(hub, a)


async def test_row_refused_by_the_hub_stays_queued(
        hub: Hub, proxy: FaultProxy, laptop: Opener) -> None:
    """R21: the real hub refuses one row of a push (200 with errors): only that row stays queued."""
    a = await laptop("a", proxy.url, hub.token)
    x = await save(a.store, "r21 a node the hub accepts")
    await a.store.graph.link({"memory_id": x, "target_node_id": "repo:syncd"})
    eid = f"{x}->repo:syncd:REFERENCES"
    # a corrupted edge whose id no longer matches its endpoints: the hub's apply refuses it
    await tamper(a.store, "UPDATE edges SET src = ? WHERE id = ?", "not-" + x, eid)

    report = await a.sync()
    assert not report.ok and report.push_row_errors == 1, report
    assert report.pushed_nodes == 1 and report.pushed_edges == 0, report
    assert await outbox_keys(a.store) == {("edge", eid)}
    assert set(await live_contents(hub.store)) == {x}
    assert await edge_set(hub.store) == {}
    await assert_intact(a.store, hub.store)


@dataclass
class FakePlane:
    """A plane whose import answers what the test says (``answer``); it records the bodies."""

    answer: Callable[[dict[str, Any]], dict[str, Any]]
    bodies: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""


@pytest.fixture
async def fake_plane() -> AsyncIterator[Callable[..., Awaitable[FakePlane]]]:
    runners: list[web.AppRunner] = []

    async def serve(answer: Callable[[dict[str, Any]], dict[str, Any]]) -> FakePlane:
        plane = FakePlane(answer)

        async def settings(request: web.Request) -> web.Response:
            return web.json_response({})

        async def changes(request: web.Request) -> web.Response:
            return web.json_response({"since": request.query.get("since", ""),
                                      "until": "2020-01-01T00:00:00.000000000+00:00",
                                      "memory_nodes": [], "memory_edges": []})

        async def import_rows(request: web.Request) -> web.Response:
            body = json.loads(await request.read())
            plane.bodies.append(body)
            return web.json_response(plane.answer(body))

        app = web.Application()
        app.router.add_get(SETTINGS, settings)
        app.router.add_get(CHANGES, changes)
        app.router.add_post(IMPORT, import_rows)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        plane.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        return plane

    try:
        yield serve
    finally:
        for runner in runners:
            await runner.cleanup()


async def test_200_with_errors_naming_no_row_acks_nothing_it_covers(
        fake_plane: Callable[..., Awaitable[FakePlane]], laptop: Opener) -> None:
    """R21: a 200 whose ``errors`` is not empty (the plane's all-or-nothing) acks nothing of
    its batch. The halves are tried apart to single out the refused rows; a plane refusing
    every row refuses each alone, and all stay queued (tried again next pass)."""
    plane = await fake_plane(lambda body: {"applied_nodes": 0, "applied_edges": 0,
                                           "errors": ["nodes: boom"]})
    a = await laptop("a", plane.url, "token")
    ids = [await save(a.store, f"r21 refused note {i}") for i in range(3)]
    await a.store.graph.link({"memory_id": ids[0], "target_node_id": "repo:syncd"})
    queued = await outbox_keys(a.store)

    report = await a.sync()
    assert not report.ok and "boom" in (report.error or ""), report
    assert report.pushed_nodes == 0 and report.pushed_edges == 0
    assert len(report.push_refused) == 4 and report.push_bisections == 3, report
    assert len(plane.bodies) == 1 + 2 + 4  # the batch, its halves, each row
    assert sorted(len(b["memory_nodes"]) + len(b["memory_edges"]) for b in plane.bodies) == [
        1, 1, 1, 1, 2, 2, 4]
    assert await outbox_keys(a.store) == queued and len(queued) == 4
    report = await a.sync()  # still refused: still queued, pushed again
    assert not report.ok and len(plane.bodies) == 14
    assert await outbox_keys(a.store) == queued


async def test_200_with_a_row_error_keeps_only_that_entry(
        fake_plane: Callable[..., Awaitable[FakePlane]], laptop: Opener) -> None:
    """R21: ``row_errors`` naming node 0 only → that entry stays queued, the rest are acked."""
    plane = await fake_plane(lambda body: {
        "applied_nodes": len(body["memory_nodes"]) - 1,
        "applied_edges": len(body["memory_edges"]),
        "errors": ["nodes[0].content: boom"],
        "row_errors": [{"kind": "node", "index": 0, "message": "boom"}]})
    a = await laptop("a", plane.url, "token")
    ids = [await save(a.store, f"r21 row error note {i}") for i in range(3)]
    await a.store.graph.link({"memory_id": ids[1], "target_node_id": "repo:syncd"})

    report = await a.sync()
    assert not report.ok and report.push_row_errors == 1, report
    assert report.pushed_nodes == 2 and report.pushed_edges == 1, report
    (body,) = plane.bodies
    assert await outbox_keys(a.store) == {("node", body["memory_nodes"][0]["id"])}


# ---------------------------------------------------------------------- R22

async def test_a_second_store_on_the_same_data_dir_is_refused(
        hub: Hub, laptop: Opener) -> None:
    """R22: a second daemon's store on a data dir in use refuses to open (the lock)."""
    a = await laptop("a", hub.url, hub.token)
    with pytest.raises(StoreLockedError):
        await Store.open(a.data_dir)
    await save(a.store, "r22 the first store still works")
    assert (await a.sync()).ok


async def test_scheduled_and_manual_passes_never_overlap(
        hub: Hub, proxy: FaultProxy, laptop: Opener) -> None:
    """R22: scheduler jobs and manual runs never overlap: one pass, one request at a time."""
    a = await laptop("a", proxy.url, hub.token, http_timeout=10.0)
    await save(a.store, "r22 pushed by whichever pass comes first")
    engine, client = a.engine, a.engine.client
    events: list[str] = []
    in_flight = peak = 0
    pass_fn, request_fn = engine._pass, client._request

    async def counted_pass(trigger: str) -> PassReport:
        events.append("start")
        try:
            return await pass_fn(trigger)
        finally:
            events.append("end")

    async def counted_request(method: str, path: str, params: dict[str, str],
                              body: bytes | None, **options: Any) -> Any:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        try:
            return await request_fn(method, path, params, body, **options)
        finally:
            in_flight -= 1

    engine._pass = counted_pass  # type: ignore[method-assign]
    client._request = counted_request  # type: ignore[method-assign]
    proxy.fail_always(Fault("timeout", delay=0.2, method="GET", path=CHANGES))  # slow, succeeds
    runner = SyncRunner(engine, interval=0.05, jitter=0.0)
    await runner.start()
    try:
        async with asyncio.timeout(30):
            await proxy.wait_count(1, "GET", CHANGES)
            manual = await asyncio.gather(*(runner.run_now() for _ in range(3)))
            await proxy.wait_count(proxy.count("GET", CHANGES) + 1, "GET", CHANGES)
    finally:
        proxy.fail_always(None)
        await runner.stop()
    assert all(r.ok for r in manual), [r.error for r in manual]
    assert events.count("start") >= 5  # scheduled passes and the three manual ones
    finished = events[: len(events) - len(events) % 2]
    assert finished == ["start", "end"] * (len(finished) // 2)  # one after another
    assert peak == 1
    assert (await a.store.maintenance.stats())["outbox"] == 0


async def test_concurrent_manual_passes_run_one_after_another(
        hub: Hub, proxy: FaultProxy, laptop: Opener) -> None:
    """R22: three concurrent ``run_pass`` calls queue behind each other."""
    a = await laptop("a", proxy.url, hub.token, http_timeout=10.0)
    x = await save(a.store, "r22 pushed exactly once")
    proxy.fail_always(Fault("timeout", delay=0.1, method="GET", path=CHANGES))
    reports = await asyncio.gather(*(a.engine.run_pass("manual") for _ in range(3)))
    proxy.fail_always(None)
    assert all(r.ok for r in reports), [r.error for r in reports]
    assert sum(r.pushed_nodes for r in reports) == 1  # one pass pushed, the others had nothing
    assert proxy.count("POST", IMPORT) == 1
    assert [c.status for c in proxy.requests if c.path == CHANGES] == [200] * 4
    assert (await hub.store.memories.get(x))["content"] == "r22 pushed exactly once"


# ---------------------------------------------------------------------- P6

async def test_egress_guard_refuses_a_private_span_that_slipped_through(
        hub: Hub, proxy: FaultProxy, laptop: Opener) -> None:
    """P6: a staged row still holding ``<private`` is never sent, and the refusal is counted."""
    a = await laptop("a", proxy.url, hub.token)
    x = await save(a.store, "p6 will be corrupted behind the redactor's back")
    await save(a.store, "p6 an innocent neighbour")
    await tamper(a.store, "UPDATE memories SET content = ? WHERE id = ?",
                 "<private>p6-canary</private>", x)
    queued = await outbox_keys(a.store)

    report = await a.sync()
    assert not report.ok and report.error_kind == "egress_refused", report
    assert proxy.count("POST", IMPORT) == 0
    assert a.engine.client.egress_refusals == 1
    assert a.engine.status.egress_refusals == 1
    assert await outbox_keys(a.store) == queued
    assert not any(b"p6-canary" in c.body for c in proxy.requests)
    assert await live_contents(hub.store) == {}

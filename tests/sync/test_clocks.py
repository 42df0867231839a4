"""Clocks (RELIABILITY R9-R11): a laptop offline for two days, laptops whose clocks are an hour or
a day off, and a clock that steps back — against the hub in both cursor modes.

How time is simulated:
  * "World" tests put the hub and every laptop on ``FakeWall``s moved by hand. The hub's store
    stamps, its ``until`` and — through ``start_world_hub`` — its ``Date`` header all read the
    hub's wall, as a real plane's do (aiohttp's own ``Date`` reads the real clock, which would
    tell every laptop it is months off). A skewed laptop's wall is the world plus its skew.
  * "Real" tests run the hub on the real clock, each laptop on ``time.time_ns() + skew``, so the
    engine learns its offset from real ``Date`` headers; the subprocess tests do it in a separate
    process. Clock values there are compared with tolerances of seconds (the skews are hours;
    the offset estimate's error is ``Date``'s one second plus a round trip).
  * Every laptop runs with anti-entropy off (``NEVER_SECS``): a row must arrive through
    ``changes``, the path the origin-clock cursor hole is about.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from local_store import HashingEmbedder, Store
from protocol.timestamp import EPOCH_CURSOR, format_autosi, parse_ns
from syncd.config import HubConfig
from syncd.hub.app import create_hub_app
from syncd.hub.tokens import TokenBook, create_token
from syncd.sync.engine import PassReport
from tests.conftest import FakeWall
from tests.sync.harness import Hub, Laptop, live_contents, start_hub, start_laptop
from tests.syncd.faultproxy import FaultProxy

SECOND_NS = 1_000_000_000
HOUR_NS = 3600 * SECOND_NS
DAY_NS = 24 * HOUR_NS
NEVER_SECS = 1e12
OFFSET_TOLERANCE_NS = 5 * SECOND_NS  # Date's 1 s resolution plus a round trip
STAMP_TOLERANCE_NS = 30 * SECOND_NS  # plus the real time between minting and checking
OFFLINE_HOURS = 48
OFFLINE_STEPS = int(os.environ.get("SYNCD_OFFLINE_STEPS", "8"))  # B's passes while A is away
CHILD = Path(__file__).with_name("shifted_laptop_child.py")
REPO_ROOT = Path(__file__).resolve().parents[2]
CHILD_TIMEOUT_S = 60
IMPORT_PATH = "/v1/agent/memory/import"
CHANGES_PATH = "/v1/agent/memory/changes"


@pytest.fixture(params=["ingest", "origin"])
def cursor(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def stack() -> AsyncIterator[AsyncExitStack]:
    async with AsyncExitStack() as s:
        yield s


# ---------------------------------------------------------------------- helpers


async def start_world_hub(data_dir: Path, cursor: str, wall: Callable[[], int]) -> Hub:
    """``harness.start_hub`` on a simulated clock, ``Date`` header included."""
    store = await Store.open(data_dir, embedder=HashingEmbedder(), feed=True, wall=wall)
    token = await asyncio.to_thread(create_token, data_dir, role="write", name="laptops")
    read = await asyncio.to_thread(create_token, data_dir, role="read", name="reader")
    book = await asyncio.to_thread(TokenBook, data_dir)
    app = create_hub_app(store, book, config=HubConfig(cursor=cursor))

    async def date_from_wall(request: web.Request, response: web.StreamResponse) -> None:
        response.headers["Date"] = email.utils.formatdate(wall() / SECOND_NS, usegmt=True)

    app.on_response_prepare.append(date_from_wall)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    return Hub(data_dir, cursor, store, runner, url, token, read)


async def laptop(stack: AsyncExitStack, name: str, tmp_path: Path, url: str, token: str,
                 wall: Callable[[], int] | None = None) -> Laptop:
    lap = await start_laptop(name, tmp_path / name, url, token, wall=wall,
                             anti_entropy_secs=NEVER_SECS)
    stack.push_async_callback(lap.close)  # closing twice is harmless (restart tests)
    return lap


async def hub_on(stack: AsyncExitStack, tmp_path: Path, cursor: str,
                 wall: Callable[[], int] | None = None) -> Hub:
    hub = await (start_world_hub(tmp_path / "hub", cursor, wall) if wall
                 else start_hub(tmp_path / "hub", cursor))
    stack.push_async_callback(hub.close)
    return hub


def shifted(skew_ns: int) -> Callable[[], int]:
    return lambda: time.time_ns() + skew_ns


def ok(report: PassReport) -> PassReport:
    assert report.ok, report.error
    return report


async def put(lap: Laptop, topic: str, content: str) -> tuple[str, str]:
    """Save under ``topic`` (a new memory, or a new version of the one holding it): id, stamp."""
    saved = await lap.store.memories.save({"content": content, "topic_key": topic})
    return saved["node_id"], (await lap.store.memories.get(saved["node_id"]))["updated_at"]


async def content(store: Store, memory_id: str) -> str:
    return str((await store.memories.get(memory_id))["content"])


async def assert_everywhere(memory_id: str, expected: str, hub: Hub, *laptops: Laptop,
                            whole_store: bool = True) -> None:
    """Every replica holds ``expected`` for the item; with ``whole_store``, the laptops hold
    identical stores too."""
    assert await content(hub.store, memory_id) == expected
    for lap in laptops:
        assert await content(lap.store, memory_id) == expected, lap.name
    if not whole_store:
        return
    first = await live_contents(laptops[0].store)
    for lap in laptops[1:]:
        assert await live_contents(lap.store) == first, lap.name


def near(stamp: str, now_ns: int) -> bool:
    return abs(parse_ns(stamp) - now_ns) <= STAMP_TOLERANCE_NS


class NaiveClient:
    """Kyma's reference sync client (contract §9), rows kept in a dict: push every row changed
    since the push watermark with its original ``updated_at`` (then watermark = sync start),
    pull ``changes?since=<last until>`` — no overlap window, no re-stamping."""

    def __init__(self, url: str, token: str, wall: Callable[[], int]) -> None:
        self.url, self.wall = url, wall
        self.session = aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"})
        self.rows: dict[str, dict[str, Any]] = {}
        self.push_wm = self.pull_wm = EPOCH_CURSOR

    async def close(self) -> None:
        await self.session.close()

    def write(self, memory_id: str, text: str) -> None:
        now = format_autosi(self.wall())  # Utc::now().to_rfc3339()
        row = self.rows.setdefault(memory_id, {
            "id": memory_id, "labels": "Memory", "realm": "default", "memory_type": "fact",
            "created_at": now, "valid_at": now})
        row.update(content=text, updated_at=now)

    async def sync(self) -> None:
        started = format_autosi(self.wall())
        changed = [row for row in self.rows.values()
                   if parse_ns(row["updated_at"]) > parse_ns(self.push_wm)]
        if changed:
            async with self.session.post(self.url + IMPORT_PATH, json={
                    "memory_nodes": changed, "memory_edges": []}) as resp:
                assert resp.status == 200, await resp.text()
                assert not (await resp.json())["errors"]
        self.push_wm = started
        async with self.session.get(self.url + CHANGES_PATH,
                                    params={"since": self.pull_wm}) as resp:
            assert resp.status == 200, await resp.text()
            body = await resp.json()
        for node in body["memory_nodes"]:  # appended verbatim; the latest version is read
            held = self.rows.get(node["id"])
            if held is None or parse_ns(node["updated_at"]) >= parse_ns(held["updated_at"]):
                self.rows[node["id"]] = node
        if body.get("until"):
            self.pull_wm = body["until"]


# ---------------------------------------------------------------------- R9


async def test_r9_edit_made_offline_for_48h_reaches_b_within_two_passes(
        cursor: str, tmp_path: Path, stack: AsyncExitStack) -> None:
    """R9: A offline 48 h edits X (stamped 48 h before it reconnects); B, syncing all along, has
    the edit after A's one pass and at most two of its own."""
    world = FakeWall()
    hub = await hub_on(stack, tmp_path, cursor, world)
    proxy = FaultProxy(hub.url)
    await proxy.start()
    stack.push_async_callback(proxy.close)
    a = await laptop(stack, "a", tmp_path, proxy.url, hub.token, world)
    b = await laptop(stack, "b", tmp_path, hub.url, hub.token, world)
    x, _ = await put(a, "r9/x", "x: before A went offline")
    ok(await a.sync())
    ok(await b.sync())
    assert await content(b.store, x) == "x: before A went offline"

    proxy.offline = True
    seen_online = len(proxy.requests)
    world.advance(60)
    _, offline_stamp = await put(a, "r9/x", "x: edited while offline")
    for step in range(OFFLINE_STEPS):
        world.advance(OFFLINE_HOURS * 3600 / OFFLINE_STEPS)
        await b.store.memories.save({"content": f"b keeps working, step {step}"})
        ok(await b.sync())
        assert not (await a.sync()).ok  # A tries, reaches nothing
    away = proxy.requests[seen_online:]
    assert away and all(c.fault == "offline" for c in away)
    # The hole a naive client falls into: A's edit is older than everything B has pulled.
    b_cursor = (await b.store.replication.sync_state())["cursor"]
    assert parse_ns(offline_stamp) < parse_ns(b_cursor) - (OFFLINE_HOURS - 1) * HOUR_NS

    proxy.offline = False
    world.advance(60)
    report = ok(await a.sync())
    assert report.pushed_nodes == 1 and not report.anti_entropy
    for _ in range(2):  # B's passes: the edit must arrive through `changes` within two
        report = ok(await b.sync())
        assert not report.anti_entropy
        if await content(b.store, x) == "x: edited while offline":
            break
    await assert_everywhere(x, "x: edited while offline", hub, a, b)


async def test_r9_naive_kyma_client_misses_the_offline_edit_in_origin_mode(
        cursor: str, tmp_path: Path, stack: AsyncExitStack) -> None:
    """R9: side by side on one hub, a naive Kyma-style client pair never delivers the offline
    edit in origin mode (the origin-clock cursor hole); the engine pair does in both modes."""
    world = FakeWall()
    hub = await hub_on(stack, tmp_path, cursor, world)
    naive_a = NaiveClient(hub.url, hub.token, world)
    stack.push_async_callback(naive_a.close)
    naive_b = NaiveClient(hub.url, hub.token, world)
    stack.push_async_callback(naive_b.close)
    a = await laptop(stack, "a", tmp_path, hub.url, hub.token, world)
    b = await laptop(stack, "b", tmp_path, hub.url, hub.token, world)

    nx = "memory:00000000-0000-4000-8000-00000000009a"
    naive_a.write(nx, "naive x: v1")
    await naive_a.sync()
    await naive_b.sync()
    assert naive_b.rows[nx]["content"] == "naive x: v1"
    x, _ = await put(a, "r9/x", "engine x: v1")
    ok(await a.sync())
    ok(await b.sync())

    world.advance(60)  # both A's go offline and edit
    naive_a.write(nx, "naive x: v2, offline")
    await put(a, "r9/x", "engine x: v2, offline")
    for _ in range(OFFLINE_STEPS):
        world.advance(OFFLINE_HOURS * 3600 / OFFLINE_STEPS)
        await naive_b.sync()
        ok(await b.sync())

    world.advance(60)  # both A's reconnect: one pass each; both B's get two
    await naive_a.sync()
    ok(await a.sync())
    for _ in range(2):
        await naive_b.sync()
        ok(await b.sync())

    assert await content(hub.store, nx) == "naive x: v2, offline"  # the push did land
    stamped = parse_ns((await hub.store.memories.get(nx))["updated_at"])
    assert stamped < parse_ns(naive_b.pull_wm) - (OFFLINE_HOURS - 1) * HOUR_NS
    naive_sees = naive_b.rows[nx]["content"]
    if cursor == "origin":  # stamped 48 h before B's `since`: never in any `changes` again
        assert naive_sees == "naive x: v1"
    else:  # the ingest feed follows commit order, whatever the row's own clock said
        assert naive_sees == "naive x: v2, offline"
    # (In origin mode the engine's B misses the naive A's edit too: no overlap window shows it a
    # row pushed with a 48 h old stamp; its anti-entropy, off here, is what repairs that.)
    await assert_everywhere(x, "engine x: v2, offline", hub, a, b, whole_store=False)


# ---------------------------------------------------------------------- R10


async def test_r10_skew_of_an_hour_either_way_converges_on_the_later_write(
        cursor: str, tmp_path: Path, stack: AsyncExitStack) -> None:
    """R10: clocks -1 h / 0 / +1 h against a hub on the real clock: each laptop learns its
    offset on its first pass, stamps near the hub's time after it, a write made after seeing
    another version wins everywhere, and all converge."""
    hub = await hub_on(stack, tmp_path, cursor)
    skews = {"a": 0, "b": -HOUR_NS, "c": HOUR_NS}
    laps = {name: await laptop(stack, name, tmp_path, hub.url, hub.token, shifted(skew))
            for name, skew in skews.items()}
    a, b, c = laps["a"], laps["b"], laps["c"]
    x, _ = await put(a, "r10/x", "x: written by a")
    for name, lap in laps.items():
        ok(await lap.sync())
        offset_ns = lap.engine.status.clock_offset_ms * 1e6
        assert abs(offset_ns + skews[name]) <= OFFSET_TOLERANCE_NS, (name, offset_ns)
        _, stamp = await put(lap, f"r10/fresh-{name}", f"a fresh memory from {name}")
        assert near(stamp, hub.store.clock.physical_ns()), (name, stamp)

    chain = [(b, "x: b saw a's and wrote after it"), (c, "x: c saw b's and wrote after it"),
             (a, "x: a saw c's and wrote after it"), (b, "x: b (an hour slow) wrote last")]
    for lap, text in chain:
        ok(await lap.sync())  # see the current version first
        _, stamp = await put(lap, "r10/x", text)
        assert near(stamp, hub.store.clock.physical_ns()), (lap.name, stamp)
        ok(await lap.sync())
        assert await content(hub.store, x) == text
    for lap in (a, b, c):
        ok(await lap.sync())
    await assert_everywhere(x, "x: b (an hour slow) wrote last", hub, a, b, c)


async def test_r10_a_laptop_a_day_behind_still_propagates_its_edits(
        cursor: str, tmp_path: Path, stack: AsyncExitStack) -> None:
    """R10: a laptop a day behind gets its pre-sync and post-sync edits to B in one pass, and
    after syncing its later concurrent edit beats B's earlier one."""
    world = FakeWall()
    hub = await hub_on(stack, tmp_path, cursor, world)
    b = await laptop(stack, "b", tmp_path, hub.url, hub.token, world)
    slow = await laptop(stack, "slow", tmp_path, hub.url, hub.token, lambda: world() - DAY_NS)
    x, _ = await put(b, "r10/x", "x: b's first")
    z, _ = await put(b, "r10/z", "z: b's first")
    ok(await b.sync())
    world.advance(60)
    y, y_stamp = await put(slow, "r10/y", "y: written a day in the past, never synced")
    assert parse_ns(y_stamp) < parse_ns((await b.store.replication.sync_state())["cursor"]) - 23 * HOUR_NS

    world.advance(60)
    report = ok(await slow.sync())
    assert not report.clock_rewound
    assert abs(slow.engine.status.clock_offset_ms * 1e6 - DAY_NS) <= SECOND_NS
    _, stamp = await put(slow, "r10/x", "x: slow edited after seeing b's")
    assert near(stamp, world())
    ok(await slow.sync())
    ok(await b.sync())
    assert await content(b.store, y) == "y: written a day in the past, never synced"
    assert await content(b.store, x) == "x: slow edited after seeing b's"

    world.advance(5)
    await put(b, "r10/z", "z: b's edit, earlier")
    ok(await b.sync())
    world.advance(5)  # slow has not pulled b's edit: concurrent, and 5 s later in real time
    _, stamp = await put(slow, "r10/z", "z: slow's concurrent edit, later")
    assert near(stamp, world())
    for lap in (slow, b):
        ok(await lap.sync())
    await assert_everywhere(z, "z: slow's concurrent edit, later", hub, b, slow)
    await assert_everywhere(x, "x: slow edited after seeing b's", hub, b, slow)


async def test_r10_a_laptop_a_day_ahead_is_not_unbeatable_once_synced(
        cursor: str, tmp_path: Path, stack: AsyncExitStack) -> None:
    """R10: a laptop a day ahead syncs once (offset learnt, HLC rewound); its later edit of X
    loses to B's edit made after pulling it, and to B's concurrent edit made later in real
    time."""
    world = FakeWall()
    hub = await hub_on(stack, tmp_path, cursor, world)
    b = await laptop(stack, "b", tmp_path, hub.url, hub.token, world)
    fast = await laptop(stack, "fast", tmp_path, hub.url, hub.token, lambda: world() + DAY_NS)
    x, _ = await put(b, "r10/x", "x: b's first")
    ok(await b.sync())
    await put(fast, "r10/y", "y: written a day ahead before the first sync")
    report = ok(await fast.sync())
    assert report.clock_rewound
    assert abs(fast.engine.status.clock_offset_ms * 1e6 + DAY_NS) <= SECOND_NS

    world.advance(10)
    _, stamp = await put(fast, "r10/x", "x: fast's edit after its first sync")
    assert near(stamp, world())
    ok(await fast.sync())
    world.advance(10)
    ok(await b.sync())
    assert await content(b.store, x) == "x: fast's edit after its first sync"
    await put(b, "r10/x", "x: b's edit after pulling fast's")
    ok(await b.sync())
    ok(await fast.sync())
    await assert_everywhere(x, "x: b's edit after pulling fast's", hub, b, fast)

    world.advance(10)
    await put(fast, "r10/x", "x: fast's edit, earlier")
    ok(await fast.sync())
    world.advance(10)  # b has not pulled fast's edit: concurrent, and 10 s later in real time
    await put(b, "r10/x", "x: b's concurrent edit, later")
    for lap in (b, fast):
        ok(await lap.sync())
    await assert_everywhere(x, "x: b's concurrent edit, later", hub, b, fast)


async def test_r10_the_later_of_two_concurrent_edits_wins_whoever_syncs_first(
        cursor: str, tmp_path: Path, stack: AsyncExitStack) -> None:
    """R10: after the day-ahead laptop synced, it edits X, then B edits X later in real time
    without having seen that edit; both sync, the earlier editor first: B's later edit wins."""
    world = FakeWall()
    hub = await hub_on(stack, tmp_path, cursor, world)
    b = await laptop(stack, "b", tmp_path, hub.url, hub.token, world)
    fast = await laptop(stack, "fast", tmp_path, hub.url, hub.token, lambda: world() + DAY_NS)
    x, _ = await put(b, "r10/x", "x: b's first")
    ok(await b.sync())
    ok(await fast.sync())
    assert await content(fast.store, x) == "x: b's first"

    world.advance(10)
    _, earlier = await put(fast, "r10/x", "x: fast's edit, earlier")
    world.advance(10)
    _, later = await put(b, "r10/x", "x: b's concurrent edit, later")
    assert earlier < later  # fast's clock is corrected: its stamps are not a day ahead
    world.advance(10)
    for lap in (fast, b, fast):  # the earlier editor pushes first: edit time decides, not push
        ok(await lap.sync())
    await assert_everywhere(x, "x: b's concurrent edit, later", hub, b, fast)


async def run_child(data_dir: Path, hub: Hub, shift_ns: int,
                    ops: list[dict[str, str]]) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(CHILD), str(data_dir), hub.url, hub.token, str(shift_ns),
        json.dumps(ops), cwd=REPO_ROOT, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(CHILD_TIMEOUT_S):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        pytest.fail(f"shifted child still running after {CHILD_TIMEOUT_S}s")
    assert proc.returncode == 0, err.decode(errors="replace")
    result: dict[str, Any] = json.loads(out)
    return result


@pytest.mark.parametrize("shift_ns", [-DAY_NS, DAY_NS], ids=["day-behind", "day-ahead"])
async def test_r10_a_day_off_in_a_real_process_with_a_shifted_clock(
        cursor: str, shift_ns: int, tmp_path: Path, stack: AsyncExitStack) -> None:
    """R10: a separate process whose clock is a day behind or ahead (hub and B on the real
    clock) learns its offset, gets its pre- and post-sync edits to B in one pass, and B's edit
    made after pulling its version wins everywhere."""
    hub = await hub_on(stack, tmp_path, cursor)
    b = await laptop(stack, "b", tmp_path, hub.url, hub.token)
    x, _ = await put(b, "r10/x", "x: b's first")
    ok(await b.sync())
    b_cursor = (await b.store.replication.sync_state())["cursor"]

    child_dir = tmp_path / "child"
    run = await run_child(child_dir, hub, shift_ns, [
        {"op": "save", "content": "y: the child's, before its first sync", "topic_key": "r10/y"},
        {"op": "sync"},
        {"op": "save", "content": "x: the child's, after its first sync", "topic_key": "r10/x"},
        {"op": "sync"},
    ])
    now = time.time_ns()
    saved_y, first, saved_x, second = run["results"]
    assert first["ok"] and second["ok"], (first["error"], second["error"])
    assert abs(first["offset_ms"] * 1e6 + shift_ns) <= OFFSET_TOLERANCE_NS
    assert first["clock_rewound"] is (shift_ns > 0)
    assert near(saved_y["updated_at"], now + shift_ns)  # minted before the clock was corrected
    if shift_ns < 0:  # the origin-clock hole the engine must close
        assert parse_ns(saved_y["updated_at"]) < parse_ns(b_cursor)
    assert saved_x["id"] == x and near(saved_x["updated_at"], now)

    report = ok(await b.sync())
    assert not report.anti_entropy
    y = saved_y["id"]
    assert await content(b.store, y) == "y: the child's, before its first sync"
    assert await content(b.store, x) == "x: the child's, after its first sync"
    await put(b, "r10/x", "x: b's, after pulling the child's")
    ok(await b.sync())

    again = await run_child(child_dir, hub, shift_ns, [{"op": "sync"}])
    assert abs(again["offset_ms_at_start"] * 1e6 + shift_ns) <= OFFSET_TOLERANCE_NS  # kept
    assert again["results"][0]["ok"], again["results"][0]["error"]
    ok(await b.sync())
    await assert_everywhere(x, "x: b's, after pulling the child's", hub, b)
    mine = {mid: {"content": row[0], "updated_at": row[8]}
            for mid, row in (await live_contents(b.store)).items()}
    assert again["rows"] == mine


# ---------------------------------------------------------------------- R11


async def test_r11_clock_stepping_back_between_two_edits_keeps_the_second(
        cursor: str, tmp_path: Path, stack: AsyncExitStack) -> None:
    """R11: A's clock steps back 10 min between two edits of X: the second is stamped after the
    first (and so is anything else A writes), wins locally, and wins everywhere after sync."""
    world, a_wall = FakeWall(), FakeWall()
    hub = await hub_on(stack, tmp_path, cursor, world)
    a = await laptop(stack, "a", tmp_path, hub.url, hub.token, a_wall)
    b = await laptop(stack, "b", tmp_path, hub.url, hub.token, world)
    x, _ = await put(a, "r11/x", "x: original")
    ok(await a.sync())
    ok(await b.sync())

    world.advance(30)
    a_wall.advance(30)
    _, first = await put(a, "r11/x", "x: first edit")
    ok(await a.sync())  # the hub and B now hold the first edit
    ok(await b.sync())
    a_wall.advance(-600)
    world.advance(1)
    _, second = await put(a, "r11/x", "x: second edit, clock 10 min back")
    _, unrelated = await put(a, "r11/other", "another memory, clock 10 min back")
    assert first < second < unrelated  # canonical stamps: string order is time order
    assert await content(a.store, x) == "x: second edit, clock 10 min back"

    ok(await a.sync())
    ok(await b.sync())
    await assert_everywhere(x, "x: second edit, clock 10 min back", hub, a, b)


async def test_r11_restart_with_a_stepped_back_clock_does_not_reset_the_hlc(
        cursor: str, tmp_path: Path, stack: AsyncExitStack) -> None:
    """R11: A restarts with its clock 10 min back: the HLC resumes past the last stamp issued
    before the restart, and the post-restart edit of X wins everywhere."""
    world, a_wall = FakeWall(), FakeWall()
    hub = await hub_on(stack, tmp_path, cursor, world)
    a = await laptop(stack, "a", tmp_path, hub.url, hub.token, a_wall)
    b = await laptop(stack, "b", tmp_path, hub.url, hub.token, world)
    x, _ = await put(a, "r11/x", "x: original")
    ok(await a.sync())
    ok(await b.sync())
    world.advance(30)
    a_wall.advance(30)
    _, before = await put(a, "r11/x", "x: edited before the restart")
    last_before = a.store.clock.last_ns
    await a.close()

    a_wall.advance(-600)
    world.advance(1)
    a = await laptop(stack, "a", tmp_path, hub.url, hub.token, a_wall)
    assert a.store.clock.last_ns >= last_before
    _, fresh = await put(a, "r11/other", "a new memory after the restart")
    assert parse_ns(fresh) > last_before
    _, after = await put(a, "r11/x", "x: edited after the restart")
    assert before < fresh < after
    assert await content(a.store, x) == "x: edited after the restart"

    ok(await a.sync())
    ok(await b.sync())
    await assert_everywhere(x, "x: edited after the restart", hub, a, b)

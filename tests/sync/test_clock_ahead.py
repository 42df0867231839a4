"""Edits made while a laptop's clock ran a day ahead (R10: "a laptop a day ahead does not make
its edits unbeatable once it has synced"). Staged for the push, such an edit — beyond the drift
bound — is stamped again, like any offline edit: after the version it replaced, and at the
plane's time. So an edit made elsewhere after the laptop synced beats it everywhere, while it
still beats the version it replaced (even one from a writer a little ahead), and an edit
stamped just after another writer's far-future version keeps its stamp. This holds whether the
engine pulled the clock back or NTP fixed the wall before the laptop synced. The hub and
laptops run on hand-moved walls (its ``Date`` reads the hub's wall), in both cursor modes."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from local_store import HashingEmbedder, Store
from protocol.timestamp import parse_ns
from tests.conftest import FakeWall
from tests.sync.harness import Hub, Laptop
from tests.sync.test_clocks import (
    DAY_NS,
    SECOND_NS,
    NaiveClient,
    assert_everywhere,
    cursor,  # noqa: F401 (the fixture: both cursor modes)
    hub_on,
    laptop,
    ok,
    put,
    stack,  # noqa: F401 (the fixture)
)


async def synced_pair(stack: AsyncExitStack, tmp_path: Path, cursor: str,  # noqa: F811
                      ) -> tuple[FakeWall, list[int], Hub, Laptop, Laptop, str]:
    """A hub and laptops A and B on one hand-moved wall — A's clock shifted by ``shift[0]`` —
    both synced with B's memory x at "x v0"."""
    world = FakeWall()
    shift = [0]
    hub = await hub_on(stack, tmp_path, cursor, world)
    a = await laptop(stack, "a", tmp_path, hub.url, hub.token, lambda: world() + shift[0])
    b = await laptop(stack, "b", tmp_path, hub.url, hub.token, world)
    x, _ = await put(b, "ahead/x", "x v0")
    for lap in (b, a):
        ok(await lap.sync())
    return world, shift, hub, a, b, x


@pytest.mark.parametrize("fixed_by", ["the engine", "ntp"])
async def test_an_edit_made_a_day_ahead_is_beaten_by_an_edit_made_after_the_sync(
        cursor: str, tmp_path: Path, stack: AsyncExitStack, fixed_by: str) -> None:  # noqa: F811
    world, shift, hub, a, b, x = await synced_pair(stack, tmp_path, cursor)

    shift[0] = DAY_NS  # a's clock jumps a day ahead while it is offline
    world.advance(10)
    _, ahead = await put(a, "ahead/x", "x edited on a (offline, clock a day ahead)")
    assert parse_ns(ahead) > world() + DAY_NS - 30 * SECOND_NS  # it was stamped a day ahead
    world.advance(10)
    if fixed_by == "ntp":
        shift[0] = 0  # the wall is right again before a syncs: no offset to correct
    report = ok(await a.sync())
    assert report.pushed_nodes == 1
    pushed = parse_ns((await hub.store.memories.get(x))["updated_at"])
    assert abs(pushed - world()) <= 5 * SECOND_NS  # stamped again, at the plane's time
    ok(await b.sync())
    await assert_everywhere(x, "x edited on a (offline, clock a day ahead)", hub, a, b)
    world.advance(10)
    await put(b, "ahead/x", "x edited on b after a synced")
    for lap in (b, a, b):
        ok(await lap.sync())
    await assert_everywhere(x, "x edited on b after a synced", hub, a, b)
    assert a.store.clock.last_ns < world() + DAY_NS // 2  # a stamps at the plane's time again


async def test_an_edit_a_day_ahead_still_beats_the_version_it_replaced(
        cursor: str, tmp_path: Path, stack: AsyncExitStack) -> None:  # noqa: F811
    """A pulled R from a writer two minutes ahead (inside the drift bound), then edited x with
    its clock a day ahead: stamped again, the edit still sorts after R (HLC causality)."""
    world = FakeWall()
    shift = [0]
    hub = await hub_on(stack, tmp_path, cursor, world)
    other = NaiveClient(hub.url, hub.token, lambda: world() + 120 * SECOND_NS)
    stack.push_async_callback(other.close)
    a = await laptop(stack, "a", tmp_path, hub.url, hub.token, lambda: world() + shift[0])
    x = "memory:00000000-0000-4000-8000-0000000000ab"
    other.write(x, "x from the other writer")
    await other.sync()
    ok(await a.sync())
    shift[0] = DAY_NS
    world.advance(10)
    await a.store.memories.update_importance(x, 0.9)  # made after a saw the other's version
    world.advance(10)
    for _ in range(2):
        ok(await a.sync())
    for store in (hub.store, a.store):
        assert (await store.memories.get(x))["importance"] == 0.9


async def test_an_offline_edit_a_day_ahead_with_no_concurrent_edit_still_lands(
        cursor: str, tmp_path: Path, stack: AsyncExitStack) -> None:  # noqa: F811
    """Stamped again, the edit still reaches every replica — with a stamp of its push."""
    world, shift, hub, a, b, x = await synced_pair(stack, tmp_path, cursor)

    shift[0] = DAY_NS
    world.advance(10)
    await put(a, "ahead/x", "x edited on a (offline, clock a day ahead)")
    world.advance(10)
    pushed_at = world()
    for lap in (a, b):
        ok(await lap.sync())
    await assert_everywhere(x, "x edited on a (offline, clock a day ahead)", hub, a, b)
    stamp = parse_ns((await hub.store.memories.get(x))["updated_at"])
    assert abs(stamp - pushed_at) <= 5 * SECOND_NS


async def test_an_edit_over_a_far_future_version_keeps_its_stamp(
        cursor: str, tmp_path: Path, stack: AsyncExitStack) -> None:  # noqa: F811
    """Another writer stamps x two days ahead (applied, it does not drag A's clock); A's edit of
    x is stamped just after it, so it beats it; stamped again after its base, it stays there."""
    world = FakeWall()
    hub = await hub_on(stack, tmp_path, cursor, world)
    far = NaiveClient(hub.url, hub.token, lambda: world() + 2 * DAY_NS)
    stack.push_async_callback(far.close)
    a = await laptop(stack, "a", tmp_path, hub.url, hub.token, world)
    b = await laptop(stack, "b", tmp_path, hub.url, hub.token, world)

    x = "memory:00000000-0000-4000-8000-0000000000fa"
    far.write(x, "x, stamped two days ahead")
    await far.sync()
    ok(await a.sync())
    await a.store.memories.update_importance(x, 0.9)  # a's edit, made after it pulled the far version
    edit = await a.store.memories.get(x)
    assert parse_ns(edit["updated_at"]) > world() + DAY_NS  # just after the far stamp
    world.advance(10)
    for lap in (a, b):
        ok(await lap.sync())
    for store in (hub.store, a.store, b.store):
        held = await store.memories.get(x)
        assert (held["updated_at"], held["importance"]) == (edit["updated_at"], 0.9)


async def test_an_edit_made_while_its_predecessor_was_pushed_stays_after_it(
        tmp_path: Path) -> None:
    """V1, stamped a day ahead, is staged and pushed; V2 lands before the ack (the entry stays,
    R7). Stamped again once the clock is right, V2 must still sort after V1 — the plane may
    hold V1 — or the newest edit loses to its own predecessor everywhere."""
    world = FakeWall()
    shift = [0]
    s = await Store.open(tmp_path / "d", embedder=HashingEmbedder(),
                         wall=lambda: world() + shift[0])
    try:
        x = (await s.memories.save({"content": "x v0", "topic_key": "t"}))["node_id"]
        entries, _, _ = await s.replication.stage_push(100, model="m", dim=8)
        await s.replication.ack_push(entries)
        assert await s.replication.outbox_depth() == 0

        shift[0] = DAY_NS  # the wall jumps a day ahead; no offset known yet
        world.advance(10)
        await s.memories.update_importance(x, 0.7)  # V1, stamped a day ahead
        entries, nodes, _ = await s.replication.stage_push(100, model="m", dim=8)  # staged as it is
        pushed_v1 = nodes[0].updated_at
        await s.memories.update_importance(x, 0.9)  # V2, made while V1's push is in flight
        await s.replication.ack_push(entries)  # R7: the entry stays (seq bumped)

        shift[0] = 0  # NTP fixes the wall
        world.advance(10)
        _, nodes, _ = await s.replication.stage_push(100, model="m", dim=8)
        v2 = nodes[0].updated_at
        # the plane holds V1; V2 must beat it or the newest edit is lost everywhere
        assert v2 > pushed_v1, (v2, pushed_v1)
    finally:
        await s.close()

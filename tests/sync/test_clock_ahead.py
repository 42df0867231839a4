"""An edit made offline while the laptop's clock ran a day ahead (R10): when the laptop
reconnects and its clock is pulled back, the queued edit moves back by the day — to when it was
written — before the pull compares the plane's rows with it. An edit made later in real time on
another laptop beats it everywhere; it is not unbeatable. An edit stamped after a far-future
version from another writer (not by a clock running ahead) keeps its stamp and still wins.
The hub and laptops run on hand-moved walls (``start_world_hub``: its ``Date`` reads the
hub's wall), in both cursor modes."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

from local_store.replica import STAMPED_AHEAD
from protocol.timestamp import parse_ns
from tests.conftest import FakeWall
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


async def test_an_offline_edit_under_a_clock_a_day_ahead_loses_to_a_later_edit(
        cursor: str, tmp_path: Path, stack: AsyncExitStack) -> None:  # noqa: F811
    world = FakeWall()
    shift = [0]
    hub = await hub_on(stack, tmp_path, cursor, world)
    a = await laptop(stack, "a", tmp_path, hub.url, hub.token, lambda: world() + shift[0])
    b = await laptop(stack, "b", tmp_path, hub.url, hub.token, world)
    x, _ = await put(b, "ahead/x", "x v0")
    for lap in (b, a):
        ok(await lap.sync())

    shift[0] = DAY_NS  # a's clock jumps a day ahead while it is offline
    world.advance(10)
    _, ahead = await put(a, "ahead/x", "x edited on a (offline, clock a day ahead)")
    world.advance(10)
    await put(b, "ahead/x", "x edited on b, later in real time")
    ok(await b.sync())
    report = ok(await a.sync())
    assert report.clock_rewound
    assert STAMPED_AHEAD not in await a.store.sync_state()  # consumed by the pull
    for lap in (b, a):
        ok(await lap.sync())
    await assert_everywhere(x, "x edited on b, later in real time", hub, a, b)
    assert parse_ns(ahead) > world() + DAY_NS - 30 * SECOND_NS  # it was stamped a day ahead


async def test_an_offline_edit_a_day_ahead_with_no_concurrent_edit_still_lands(
        cursor: str, tmp_path: Path, stack: AsyncExitStack) -> None:  # noqa: F811
    """Moved back, the edit still reaches every replica — with a stamp of its real time."""
    world = FakeWall()
    shift = [0]
    hub = await hub_on(stack, tmp_path, cursor, world)
    a = await laptop(stack, "a", tmp_path, hub.url, hub.token, lambda: world() + shift[0])
    b = await laptop(stack, "b", tmp_path, hub.url, hub.token, world)
    x, _ = await put(b, "ahead/x", "x v0")
    for lap in (b, a):
        ok(await lap.sync())

    shift[0] = DAY_NS
    world.advance(10)
    await put(a, "ahead/x", "x edited on a (offline, clock a day ahead)")
    written = world()
    world.advance(10)
    for lap in (a, b):
        ok(await lap.sync())
    await assert_everywhere(x, "x edited on a (offline, clock a day ahead)", hub, a, b)
    stamp = parse_ns((await hub.store.get(x))["updated_at"])
    assert abs(stamp - written) <= 5 * SECOND_NS


async def test_an_edit_over_a_far_future_version_is_not_moved_back(
        cursor: str, tmp_path: Path, stack: AsyncExitStack) -> None:  # noqa: F811
    """Another writer stamps x two days ahead (applied, it does not drag A's clock); A's edit of
    x is stamped just after it, so it beats it. A's own clock is right: nothing moves back."""
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
    await a.store.update_importance(x, 0.9)  # a's edit, made after it pulled the far version
    edit = await a.store.get(x)
    assert parse_ns(edit["updated_at"]) > world() + DAY_NS  # just after the far stamp
    world.advance(10)
    for lap in (a, b):
        ok(await lap.sync())
    for store in (hub.store, a.store, b.store):
        held = await store.get(x)
        assert (held["updated_at"], held["importance"]) == (edit["updated_at"], 0.9)

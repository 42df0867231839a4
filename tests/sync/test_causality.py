"""Causality under lost push replies (issue 32, point 1; docs/sync-causality.md): an outbox
entry whose version the plane already holds is cleared, never stamped again, so it cannot beat
an edit another laptop made after receiving it. A real hub (both cursor modes) behind the real
fault-injecting proxy; the overlap window's half passes on the laptops' wall clock (a
``FakeWall``), never by sleeping."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.conftest import FakeWall
from tests.store_probe import integrity_check, outbox_items
from tests.sync.crash_push_child import NO_CRASH_EXIT
from tests.sync.harness import Hub, Laptop, live_contents, run_script, start_laptop
from tests.sync.test_clocks import start_world_hub
from tests.syncd.faultproxy import Fault, FaultProxy

IMPORT = "/v1/agent/memory/import"
OVERLAP_SECS = 120.0
CHILD = Path(__file__).with_name("crash_push_child.py")
CHILD_TIMEOUT_S = 120.0


@pytest.fixture(params=["ingest", "origin"])
async def hub(request: pytest.FixtureRequest, tmp_path: Path, wall: FakeWall,
              ) -> AsyncIterator[Hub]:
    """A hub on the laptops' wall clock (its ``Date`` too: the laptops' offset stays 0)."""
    h = await start_world_hub(tmp_path / "hub", request.param, wall)
    try:
        yield h
    finally:
        await h.close()


@pytest.fixture
async def proxy(hub: Hub) -> AsyncIterator[FaultProxy]:
    async with FaultProxy(hub.url) as p:
        yield p


async def importance(store_owner: Laptop | Hub, mid: str) -> float:
    rows = await store_owner.store._fetch("SELECT importance FROM memories WHERE id = ?", (mid,))
    return float(rows[0][0])


async def end_with_ys_edit(hub: Hub, x: Laptop, y: Laptop, wall: FakeWall, mid: str) -> None:
    """Steps 3 and 4: Y sees 0.9 and sets 0.1; half the overlap window and a second later X, Y
    and X sync; Y's edit, made after it received X's, must be everywhere."""
    assert (await y.sync()).ok
    assert await importance(y, mid) == 0.9
    await y.store.memories.update_importance(mid, 0.1)  # made after Y received 0.9

    wall.advance(OVERLAP_SECS / 2 + 1)  # X's queued 0.9 is now old enough to be re-stamped
    for lap in (x, y, x):
        assert (await lap.sync()).ok, lap.name
    for holder in (hub, x, y):
        assert await importance(holder, mid) == 0.1
    assert await live_contents(x.store) == await live_contents(hub.store) \
        == await live_contents(y.store)
    assert await outbox_items(x.store) == [] and await outbox_items(y.store) == []


async def test_lost_reply_then_restamp_does_not_beat_a_later_edit(
        hub: Hub, proxy: FaultProxy, wall: FakeWall, tmp_path: Path) -> None:
    """Issue 32's scenario: X's push of 0.9 commits but the reply is dropped; Y sees 0.9 and
    sets 0.1; more than half the overlap window later X, Y, X sync: 0.1 everywhere."""
    x = await start_laptop("x", tmp_path / "x", proxy.url, hub.token, wall=wall,
                           overlap_secs=OVERLAP_SECS)
    y = await start_laptop("y", tmp_path / "y", hub.url, hub.token, wall=wall,
                           overlap_secs=OVERLAP_SECS)
    try:
        mid = str((await x.store.memories.save({"content": "causal note", "importance": 0.5}))["node_id"])
        assert (await x.sync()).ok and (await y.sync()).ok
        assert await importance(y, mid) == 0.5

        await x.store.memories.update_importance(mid, 0.9)
        proxy.inject(Fault("drop_after_commit", method="POST", path=IMPORT))
        report = await x.sync()
        assert not report.ok and report.error_kind == "transient", report
        assert await importance(hub, mid) == 0.9  # the hub committed
        assert [item for _, item, _ in await outbox_items(x.store)] == [mid]  # ... unacknowledged

        await end_with_ys_edit(hub, x, y, wall, mid)
    finally:
        await y.close()
        await x.close()


async def run_child(data_dir: Path, hub: Hub, wall_ns: int) -> tuple[int, str]:
    try:
        return await run_script(CHILD, str(data_dir), hub.url, hub.token, str(wall_ns),
                                timeout_s=CHILD_TIMEOUT_S)
    except TimeoutError:
        pytest.fail(f"crash child still running after {CHILD_TIMEOUT_S}s")


async def test_kill_9_after_the_hub_committed_then_restamp_does_not_beat_a_later_edit(
        hub: Hub, wall: FakeWall, tmp_path: Path) -> None:
    """The same scenario with X killed -9 (a real child process) after the hub committed its
    push and before the outbox entry was cleared."""
    x_dir = tmp_path / "x"
    x = await start_laptop("x", x_dir, hub.url, hub.token, wall=wall, overlap_secs=OVERLAP_SECS)
    y = await start_laptop("y", tmp_path / "y", hub.url, hub.token, wall=wall,
                           overlap_secs=OVERLAP_SECS)
    try:
        mid = str((await x.store.memories.save({"content": "causal note", "importance": 0.5}))["node_id"])
        assert (await x.sync()).ok and (await y.sync()).ok
        await x.store.memories.update_importance(mid, 0.9)
        await x.close()

        code, output = await run_child(x_dir, hub, wall.now_ns)
        assert code != NO_CRASH_EXIT, f"the crash never fired:\n{output}"
        assert code == -signal.SIGKILL, f"child exited {code}:\n{output}"
        assert await importance(hub, mid) == 0.9  # the hub committed

        x = await start_laptop("x", x_dir, hub.url, hub.token, wall=wall,
                               overlap_secs=OVERLAP_SECS)
        assert await integrity_check(x.store) == "ok"
        assert [item for _, item, _ in await outbox_items(x.store)] == [mid]  # never cleared
        await end_with_ys_edit(hub, x, y, wall, mid)
    finally:
        await y.close()
        await x.close()


async def test_a_push_the_plane_refused_whole_is_restamped_when_old(
        hub: Hub, proxy: FaultProxy, wall: FakeWall, tmp_path: Path) -> None:
    """A 413 (or a connection never made: ``Transient.unsent``, tests/sync/test_plane_errors.py)
    means the plane holds none of the batch: the entry is not "sent", so once it is older than
    half the overlap window it gets a fresh stamp, as any unsent edit does. Pushed with its old
    stamp, a reader whose cursor had passed it (origin mode, Kyma) would skip it."""
    x = await start_laptop("x", tmp_path / "x", proxy.url, hub.token, wall=wall,
                           overlap_secs=OVERLAP_SECS)
    try:
        mid = str((await x.store.memories.save({"content": "refused whole"}))["node_id"])
        (written,) = await x.store._fetch("SELECT updated_at FROM memories WHERE id = ?",
                                          (mid,))
        proxy.inject(Fault("status", status=413, method="POST", path=IMPORT))
        report = await x.sync()
        assert report.push_too_large and report.pushed_nodes == 0, report
        assert await x.store._fetch("SELECT sent_version FROM outbox") == [(None,)]

        wall.advance(OVERLAP_SECS / 2 + 1)
        assert (await x.sync()).ok
        (pushed,) = await hub.store._fetch("SELECT updated_at FROM memories WHERE id = ?",
                                           (mid,))
        assert pushed[0] > written[0]  # a fresh stamp, after the wait
        assert await outbox_items(x.store) == []
    finally:
        await x.close()

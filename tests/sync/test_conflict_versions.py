"""Two laptops edit one memory while apart, through a real hub (both cursor modes) and through a
plane that drops syncd's extensions (Kyma-like): last-writer-wins picks one edit, and the
loser's text is kept as a ``conflict`` version on both laptops — never current anywhere,
never pushed. Restoring it on either laptop makes it current everywhere after sync, and
reviews the conflict there (local_store/versions.py states the rule)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from local_store import Store
from tests.sync.harness import Hub, Laptop, two_laptops
from tests.sync.test_kyma_plane import KymaLike, kyma  # noqa: F401  (the fixture)

COMMON, X_WORDS, Y_WORDS = "the cache lives in redis", "the cache lives in memcached", (
    "the cache lives in valkey")


async def content(store: Store, mid: str) -> str:
    return str((await store.memories.get(mid))["content"])


async def conflicts_of(store: Store, mid: str) -> list[dict[str, Any]]:
    return [v for v in (await store.versions.history(mid))["versions"] if v["reason"] == "conflict"]


async def edit_apart(x: Laptop, y: Laptop, *, later: str) -> tuple[str, str, str]:
    """X and Y share a memory, then each edits it without syncing; ``later`` ("x" or "y")
    edits second, so its stamp is larger and it wins. Returns (id, winner, loser) texts."""
    mid = (await x.store.memories.save({"content": COMMON, "topic_key": "infra/cache"}))["node_id"]
    assert (await x.sync()).ok and (await y.sync()).ok
    assert await content(y.store, mid) == COMMON
    first, second = (y, x) if later == "x" else (x, y)
    words = {x.name: X_WORDS, y.name: Y_WORDS}
    await first.store.memories.save({"content": words[first.name], "topic_key": "infra/cache"})
    await second.store.memories.save({"content": words[second.name], "topic_key": "infra/cache"})
    return mid, words[second.name], words[first.name]


async def sync_all(x: Laptop, y: Laptop, passes: int = 2) -> None:
    for _ in range(passes):
        for laptop in (x, y):
            report = await laptop.sync()
            assert report.ok, report.error


@pytest.mark.parametrize("later", ["y", "x"])
async def test_the_loser_is_kept_as_a_conflict_on_every_laptop_that_held_it(
        hub: Hub, tmp_path: Path, later: str) -> None:
    """X syncs first. ``later`` y: X's losing edit reaches the hub first, so Y holds both and
    both keep the loser. ``later`` x: X's winning edit is first; Y's pending loser is beaten
    on Y and never pushed (docs/sync-causality.md rule 1), so only Y ever held it."""
    async with two_laptops(tmp_path, hub.url, hub.token) as (x, y):
        x.name, y.name = "x", "y"
        mid, winner, loser = await edit_apart(x, y, later=later)
        await sync_all(x, y)
        for store in (x.store, y.store, hub.store):
            assert await content(store, mid) == winner
        holders = (x, y) if later == "y" else (y,)
        for laptop in (x, y):
            kept = await conflicts_of(laptop.store, mid)
            held = laptop in holders
            assert [v["content"] for v in kept] == ([loser] if held else []), laptop.name
            assert (await laptop.store.versions.conflicts())["count"] == int(held)
            history = [(v["reason"], v["content"]) for v in
                       (await laptop.store.versions.history(mid))["versions"]]
            assert history[0] == ("current", winner) and ("replaced", COMMON) in history
            assert all(v["reviewed"] is False for v in kept)
            assert loser not in [text for reason, text in history if reason != "conflict"]
        nodes, _, _ = (await hub.store.feed.page(0))[:3]
        assert [n.content for n in nodes if n.id == mid] == [winner]  # the loser: not current
        hub_kept = [v["content"] for v in await conflicts_of(hub.store, mid)]
        assert hub_kept == ([loser] if later == "y" else [])  # the hub held it, or never did
        await sync_all(x, y)  # quiet passes keep what they kept, and push nothing new
        for laptop in (x, y):
            assert len(await conflicts_of(laptop.store, mid)) == int(laptop in holders)
            assert await laptop.store.replication.outbox_depth() == 0


@pytest.mark.parametrize("restorer", ["x", "y"])
async def test_restoring_the_conflict_makes_it_current_everywhere(
        hub: Hub, tmp_path: Path, restorer: str) -> None:
    async with two_laptops(tmp_path, hub.url, hub.token) as (x, y):
        x.name, y.name = "x", "y"
        mid, winner, loser = await edit_apart(x, y, later="y")
        await sync_all(x, y)
        laptop = x if restorer == "x" else y
        (kept,) = await conflicts_of(laptop.store, mid)
        await laptop.store.versions.restore(mid, kept["n"])
        await sync_all(x, y)
        for store in (x.store, y.store, hub.store):
            assert await content(store, mid) == loser
        for each in (x, y):  # chosen on one laptop, settled on both
            assert (await each.store.versions.conflicts())["count"] == 0, each.name
            history = [(v["reason"], v["content"]) for v in
                       (await each.store.versions.history(mid))["versions"]]
            assert history[0] == ("current", loser)
            assert ("replaced", winner) in history  # the restore replaced the winner


async def test_an_edit_made_after_seeing_the_other_is_no_conflict(
        hub: Hub, tmp_path: Path) -> None:
    async with two_laptops(tmp_path, hub.url, hub.token) as (x, y):
        mid = (await x.store.memories.save({"content": COMMON, "topic_key": "infra/cache"}))["node_id"]
        await sync_all(x, y)
        await y.store.memories.save({"content": Y_WORDS, "topic_key": "infra/cache"})
        await sync_all(x, y)
        await x.store.memories.save({"content": X_WORDS, "topic_key": "infra/cache"})
        await sync_all(x, y)
        for laptop in (x, y):
            assert await content(laptop.store, mid) == X_WORDS
            assert (await laptop.store.versions.conflicts())["count"] == 0
            reasons = [v["reason"] for v in (await laptop.store.versions.history(mid))["versions"]]
            assert reasons == ["current", "replaced", "replaced"]


@pytest.mark.parametrize("later", ["y", "x"])
async def test_through_a_plane_that_drops_base_and_origin(
        kyma: tuple[KymaLike, str], tmp_path: Path, later: str) -> None:  # noqa: F811
    """Without ``base`` the laptop where the two edits meet still keeps the loser as a
    conflict: the one holding the winner's base (Y, when X's loser came first), or the one
    whose pending edit was beaten. A laptop whose losing edit the plane had acknowledged
    keeps it only as ``replaced`` (nothing says the winner did not follow it). Its own
    versions served back without an origin are no conflicts."""
    plane, url = kyma
    async with two_laptops(tmp_path, url, "token") as (x, y):
        x.name, y.name = "x", "y"
        mid, winner, loser = await edit_apart(x, y, later=later)
        await sync_all(x, y)
        assert all("base" not in n and "origin" not in n for n in plane.nodes)  # non-vacuity
        for laptop in (x, y):
            assert await content(laptop.store, mid) == winner
        assert [v["content"] for v in await conflicts_of(y.store, mid)] == [loser]
        assert await conflicts_of(x.store, mid) == []
        history = [(v["reason"], v["content"]) for v in (await x.store.versions.history(mid))["versions"]]
        assert ("replaced", loser) in history if later == "y" else loser not in str(history)

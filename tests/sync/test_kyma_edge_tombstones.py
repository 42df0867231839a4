"""Edge tombstones in Kyma's own form (contract §2.3: props ``{"deleted":true,"deleted_at":…}``).

Deleting a memory tombstones its edges. Kyma drops syncd's ``deleted`` extension, so through it
a tombstone used to arrive as a live edge (the other laptop kept the deleted memory's edges).
The tombstone's props are now Kyma's form — stored so, not rewritten on the wire — so the
deletion survives the plane, and every replica holds and hashes the same edge row."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from local_store import NotFoundError, Store
from local_store.writes import bare_tombstone, tombstone_props
from tests.sync.harness import Hub, Laptop, two_laptops
from tests.sync.test_kyma_plane import KymaLike, kyma  # noqa: F401 (fixture)

REPO = "default::repo:x"


async def edge_rows(store: Store) -> dict[str, tuple[Any, ...]]:
    """Each edge as every replica must hold it: (deleted, props, content_hash)."""
    rows = await store._fetch("SELECT id, deleted, props, content_hash FROM edges ORDER BY id")
    return {r[0]: tuple(r[1:]) for r in rows}


async def edge_stamps(store: Store) -> dict[str, str]:
    return {r[0]: r[1] for r in await store._fetch("SELECT id, updated_at FROM edges")}


async def sync_all(*laptops: Laptop, rounds: int = 2) -> None:
    for _ in range(rounds):
        for laptop in laptops:
            report = await laptop.sync()
            assert report.ok, report.error


def props_of(row: tuple[Any, ...]) -> dict[str, Any]:
    parsed = json.loads(row[1])
    assert isinstance(parsed, dict)
    return parsed


async def test_an_edge_tombstone_reaches_the_other_laptop_through_kyma(
        kyma: tuple[KymaLike, str], tmp_path: Path) -> None:  # noqa: F811
    """A soft delete's edge tombstone arrives as a tombstone, the edge's reason kept."""
    plane, url = kyma
    async with two_laptops(tmp_path, url, "token") as (a, b):
        m = (await a.store.memories.save({"content": "the deploy script lives in repo x",
                                 "references": [REPO]}))["node_id"]
        other = (await a.store.memories.save({"content": "deploys run from the ci box"}))["node_id"]
        await a.store.graph.judge(other, m, "conflicts", "they disagree")
        await sync_all(a, b, rounds=1)
        ref, judged = f"{m}->{REPO}:REFERENCES", f"{other}->{m}:RELATES_TO"
        assert {(await edge_rows(b.store))[e][0] for e in (ref, judged)} == {0}
        await a.store.memories.delete(m)
        await sync_all(a, b)
        assert all("deleted" not in e and "origin" not in e for e in plane.edges)
        held_a, held_b = await edge_rows(a.store), await edge_rows(b.store)
        for eid in (ref, judged):
            assert held_a[eid][0] == 1 and held_b[eid] == held_a[eid], eid  # same hash too
        stamps = await edge_stamps(b.store)
        assert props_of(held_b[ref]) == {"deleted": True, "deleted_at": stamps[ref]}
        assert props_of(held_b[judged])["reason"] == "they disagree"  # a soft delete keeps it
        assert (await b.store.memories.get(other))["edges"] == []
        for laptop in (a, b):  # quiet passes: nothing is pushed back and forth
            report = await laptop.sync()
            assert report.ok and (report.pushed_nodes, report.pushed_edges) == (0, 0), report
        assert await edge_rows(a.store) == held_a and await edge_rows(b.store) == held_b


async def test_a_hard_deletes_edge_tombstone_holds_no_reason_through_kyma(
        kyma: tuple[KymaLike, str], tmp_path: Path) -> None:  # noqa: F811
    plane, url = kyma
    async with two_laptops(tmp_path, url, "token") as (a, b):
        m = (await a.store.memories.save({"content": "rotate the vault key"}))["node_id"]
        other = (await a.store.memories.save({"content": "the vault key rotates weekly"}))["node_id"]
        await a.store.graph.judge(other, m, "conflicts", "reason canary 5521")
        await sync_all(a, b, rounds=1)
        await a.store.memories.delete(m, hard=True)
        await sync_all(a, b)
        eid = f"{other}->{m}:RELATES_TO"
        held = (await edge_rows(b.store))[eid]
        assert held == (await edge_rows(a.store))[eid] and held[0] == 1
        assert bare_tombstone(held[1]) and "canary" not in held[1]
        assert "canary 5521" not in json.dumps(plane.edges[-1])


async def test_edge_tombstones_are_the_same_row_on_every_replica_through_the_hub(
        hub: Hub, tmp_path: Path) -> None:
    """Through the syncd hub (both cursors), with anti-entropy every pass: the replicas hold
    the same edge rows and repair nothing."""
    async with two_laptops(tmp_path, hub.url, hub.token, anti_entropy_secs=0) as (a, b):
        m = (await a.store.memories.save({"content": "the staging cluster is in eu-west-1",
                                 "references": [REPO]}))["node_id"]
        other = (await b.store.memories.save({"content": "staging moved to eu-central-1"}))["node_id"]
        await sync_all(a, b, rounds=1)
        await b.store.graph.judge(other, m, "supersedes", "moved")
        await sync_all(a, b)  # a holds the edge b made before it deletes
        await a.store.memories.delete(m)
        await sync_all(a, b)
        held = await edge_rows(a.store)
        assert held == await edge_rows(b.store) == await edge_rows(hub.store)
        assert all(row[0] == 1 and props_of(row)["deleted"] is True for row in held.values())
        for laptop in (a, b):
            report = await laptop.sync()
            assert report.ok and report.requeued == 0, report
            assert (report.pushed_nodes, report.pushed_edges) == (0, 0), report


async def test_a_soft_delete_keeps_the_reason_and_a_hard_one_purges_it(store: Store) -> None:
    victim = await store.memories.save({"content": "plan b", "references": [REPO]})
    other = await store.memories.save({"content": "plan a"})
    await store.graph.judge(other["id"], victim["id"], "conflicts", "because purgecanary")
    judged = f"{other['node_id']}->{victim['node_id']}:RELATES_TO"
    ref = f"{victim['node_id']}->{REPO}:REFERENCES"
    await store.memories.delete(victim["id"])
    soft = await edge_rows(store)
    stamps = await edge_stamps(store)
    assert props_of(soft[ref]) == {"deleted": True, "deleted_at": stamps[ref]}
    assert props_of(soft[judged]) == {"verdict": "conflicts", "reason": "because purgecanary",
                                      "deleted": True, "deleted_at": stamps[judged]}
    await store.memories.delete(victim["id"], hard=True)
    hard = await edge_rows(store)
    assert hard[ref] == soft[ref]  # nothing left to purge: no new version
    assert bare_tombstone(hard[judged][1]) and "purgecanary" not in hard[judged][1]
    with pytest.raises(NotFoundError):
        await store.memories.delete(victim["id"], hard=True)


@pytest.mark.parametrize(("props", "expected"), [
    (None, {"deleted": True, "deleted_at": "S"}),
    ('{"reason":"r"}', {"reason": "r", "deleted": True, "deleted_at": "S"}),
    ('{"deleted":false,"x":1}', {"deleted": True, "x": 1, "deleted_at": "S"}),
    ("not json", {"deleted": True, "deleted_at": "S"}),
    ("[1, 2]", {"deleted": True, "deleted_at": "S"}),
    ("[" * 100_000, {"deleted": True, "deleted_at": "S"})])
def test_tombstone_props(props: str | None, expected: dict[str, Any]) -> None:
    made = tombstone_props("S", props)
    assert json.loads(made) == expected and bare_tombstone(made) == (len(expected) == 2)
    assert ":" in made and ", " not in made  # compact, as props_json


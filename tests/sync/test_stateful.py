"""RELIABILITY R3: three laptops and a hub, random concurrent edits and partial syncs through
faulty networks and restarts, then a full sync: every replica identical, and equal to a
reference model.

The machine (one per hub cursor mode) runs its own event loop; the hub, three fault-injecting
proxies (one per laptop, ``tests/syncd/faultproxy.py``) and the laptops all live on it.
Rules: create (save, with or without a topic key — a topic key may upsert), update
(importance, status, topic upsert), invalidate (``judge`` supersedes), archive, soft and hard
delete, link to an entity, a sync pass of one laptop, a pass through injected faults
(5xx, 429, reset mid-body, truncated JSON, dropped after the hub committed), and a restart of
one laptop (store and engine closed, reopened on the same data dir).

The reference model. A version is ``(updated_at, origin, content_hash)`` (``merge.version_key``);
its *content* is what the operation that minted it produced. The model predicts that content
from the laptop's row before each operation (and checks the store wrote exactly it), so it
knows ``content_hash → content`` for every id. It cannot predict every version *key*: the
engine re-stamps queued versions when it pushes them (``replica.stage``: same content and hash,
a newer ``updated_at``, possibly another ``origin``). So after every step the model observes
every replica and the hub, and asserts:

  * every version anywhere has a content some operation produced (nothing invented, nothing
    half-applied: ``content_hash`` and content agree with the model);
  * at each place, each item's version never goes backwards (LWW: a row is replaced only by a
    greater key — a stale update never resurrects a delete).

At the end (``teardown``) faults are healed and every laptop runs three round-robin passes.
Then every laptop and the hub hold exactly the same rows and edges — ``origin`` and
``updated_at`` included, since LWW replicates the winning version verbatim — and these equal
the model: for each id the greatest key ever observed anywhere, with the content its operation
produced.

``SYNCD_STATEFUL_EXAMPLES`` (default 8) and ``SYNCD_STATEFUL_STEPS`` (default 25) size the run.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
import shutil
import tempfile
import unittest
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Concatenate, ParamSpec, TypeVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from local_store import NotFoundError, Store
from local_store.writes import bare_tombstone, props_json, tombstone_props
from protocol.rows import edge_id
from tests.store_probe import outbox_items
from tests.sync.harness import Hub, Laptop, edge_set, live_contents, start_hub, start_laptop
from tests.syncd.faultproxy import Fault, FaultProxy

EXAMPLES = int(os.environ.get("SYNCD_STATEFUL_EXAMPLES", "8"))
STEPS = int(os.environ.get("SYNCD_STATEFUL_STEPS", "25"))
SETTINGS = settings(max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
LAPTOPS = 3
SEED_PER_LAPTOP = 2
FINAL_ROUNDS = 3  # twice round-robin, plus once more
ENTITIES = ("entity:repo", "entity:ci", "entity:alice")
TOPICS = (None, None, "topic/release", "topic/oncall")

# A version's content: a node's (content, title, tags, status, importance, invalid_at,
# superseded_by, deleted) — ``live_contents`` without the version — or an edge's (deleted, props).
Fields = tuple[Any, ...]
FIELD = {name: i for i, name in enumerate(
    ("content", "title", "tags", "status", "importance", "invalid_at", "superseded_by",
     "deleted"))}
Key = tuple[str, str, str]  # (updated_at, origin, content_hash)
Version = tuple[Fields, Key]

NODE_SQL = ("SELECT id, content, title, tags, status, importance, invalid_at, superseded_by, "
            "deleted, updated_at, origin, content_hash FROM memories")
EDGE_SQL = "SELECT id, deleted, props, updated_at, origin, content_hash FROM edges"

LAPTOP = st.integers(0, LAPTOPS - 1)
PICK = st.integers(0, 10_000)
FAULTS = st.lists(st.builds(
    Fault,
    kind=st.sampled_from(
        ["status", "retry_after", "reset_mid_body", "truncate_json", "drop_after_commit"]),
    status=st.sampled_from([500, 502, 503]),
    path=st.sampled_from([None, "/changes", "/import", "/export", "/settings"]),
), min_size=1, max_size=3)


async def edge_stamp(store: Store, eid: str) -> str:
    rows = await store._fetch("SELECT updated_at FROM edges WHERE id = ?", (eid,))
    return str(rows[0][0])


def _version(row: Any) -> tuple[str, Version]:
    return row[0], (tuple(row[1:-3]), (row[-3], row[-2], row[-1]))


async def versions(store: Store, kind: str, item_id: str | None = None) -> dict[str, Version]:
    """Every node (or edge) version the store holds — or just ``item_id``'s."""
    sql = NODE_SQL if kind == "node" else EDGE_SQL
    rows = await store._fetch(sql + " WHERE id = ?", (item_id,)) if item_id else \
        await store._fetch(sql)
    return dict(_version(r) for r in rows)


@dataclass
class Item:
    contents: dict[str, Fields] = field(default_factory=dict)  # content_hash → content
    seen: set[Key] = field(default_factory=set)


@dataclass
class Reference:
    """What every replica must converge to: per id, the greatest version key ever seen, with
    the content the operation that minted it produced."""

    items: dict[tuple[str, str], Item] = field(default_factory=dict)  # (kind, id) → Item
    last: dict[tuple[str, str, str], Key] = field(default_factory=dict)  # (place, kind, id)

    def minted(self, kind: str, item_id: str, fields: Fields, key: Key) -> None:
        item = self.items.setdefault((kind, item_id), Item())
        known = item.contents.setdefault(key[2], fields)
        assert known == fields, f"{kind} {item_id}: one content hash, two contents"
        item.seen.add(key)

    def observe(self, place: str, kind: str, held: dict[str, Version]) -> None:
        for item_id, (fields, key) in held.items():
            item = self.items.get((kind, item_id))
            assert item is not None, f"{place} holds a {kind} no operation made: {item_id}"
            assert item.contents.get(key[2]) == fields, (
                f"{place}: {kind} {item_id} at {key} holds {fields}, but the operation that "
                f"made content hash {key[2]} produced {item.contents.get(key[2])}")
            before = self.last.get((place, kind, item_id))
            assert before is None or key >= before, (
                f"{place}: {kind} {item_id} went back from {before} to {key}")
            self.last[(place, kind, item_id)] = key
            item.seen.add(key)

    def expected(self, kind: str) -> dict[str, tuple[Any, ...]]:
        """Rows as ``live_contents`` (nodes) or ``edge_set`` (edges) must show them."""
        out: dict[str, tuple[Any, ...]] = {}
        for (k, item_id), item in sorted(self.items.items()):
            if k != kind:
                continue
            key = max(item.seen)
            fields = item.contents[key[2]]
            out[item_id] = (*fields, key[0], key[1]) if kind == "node" else (
                fields[0], key[0], fields[1])
        return out


T = TypeVar("T")
P = ParamSpec("P")


def step(fn: Callable[Concatenate[ReplicationMachine, P], None],
         ) -> Callable[Concatenate[ReplicationMachine, P], None]:
    """Mark the machine dirty while a rule runs; the invariant marks it clean after. A failed
    step leaves it dirty, so teardown reports that failure instead of a convergence one."""
    @functools.wraps(fn)
    def wrapper(self: ReplicationMachine, /, *args: P.args, **kwargs: P.kwargs) -> None:
        self.clean = False
        fn(self, *args, **kwargs)
    return wrapper


class ReplicationMachine(RuleBasedStateMachine):
    mode: ClassVar[str] = "ingest"

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.root = Path(tempfile.mkdtemp(prefix="syncd-r3-"))
        self.proxies: list[FaultProxy] = []
        self.laptops: list[Laptop] = []
        self.hub: Hub | None = None
        self.model = Reference()
        self.ids: list[str] = []
        self.counter = itertools.count()
        self.clean = True
        try:
            self.hub = self.run(start_hub(self.root / "hub", self.mode))
            for i in range(LAPTOPS):
                proxy = FaultProxy(self.hub.url)
                self.proxies.append(proxy)
                self.run(proxy.start())
                self.laptops.append(self.run(self.open_laptop(i)))
        except BaseException:
            self.close_all()
            raise

    # ------------------------------------------------------------------ plumbing

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    async def open_laptop(self, i: int) -> Laptop:
        assert self.hub is not None
        return await start_laptop(f"laptop{i}", self.root / f"laptop{i}", self.proxies[i].url,
                                  self.hub.token)

    def places(self) -> list[tuple[str, Store]]:
        assert self.hub is not None
        return [(lap.name, lap.store) for lap in self.laptops] + [("hub", self.hub.store)]

    def read(self, who: int, kind: str, item_id: str) -> Version | None:
        return self.run(versions(self.laptops[who].store, kind, item_id)).get(item_id)

    def live(self, who: int, mid: str) -> Version | None:
        found = self.read(who, "node", mid)
        return found if found is not None and not found[0][FIELD["deleted"]] else None

    def pick(self, index: int) -> str:
        return self.ids[index % len(self.ids)]

    def wrote(self, who: int, kind: str, item_id: str, expected: Fields,
              before: Version | None) -> Version:
        """The laptop's new version of ``item_id`` has exactly the predicted content, a key
        greater than the version it replaced, and its own origin; the model records it."""
        got = self.read(who, kind, item_id)
        assert got is not None, f"{kind} {item_id} missing after a write"
        fields, key = got
        assert fields == expected, f"{kind} {item_id}: wrote {fields}, expected {expected}"
        assert key[1] == self.laptops[who].store.replica_id
        assert before is None or key > before[1], f"{kind} {item_id}: {key} ≤ {before[1]}"
        self.model.minted(kind, item_id, fields, key)
        return got

    def refused(self, who: int, mid: str, coro: Coroutine[Any, Any, object],
                *watched: tuple[str, str]) -> None:
        """An operation on an id this laptop does not hold live: NotFoundError, no change."""
        before = [self.read(who, kind, item_id) for kind, item_id in watched]
        try:
            self.run(coro)
        except NotFoundError:
            pass
        else:
            raise AssertionError(f"an operation on {mid}, not live here, succeeded")
        assert [self.read(who, kind, item_id) for kind, item_id in watched] == before

    # ------------------------------------------------------------------ writes

    @initialize()
    @step
    def seed(self) -> None:
        """Two memories per laptop, synced everywhere: later edits of them are concurrent."""
        for who in range(LAPTOPS):
            for _ in range(SEED_PER_LAPTOP):
                self.create(who, None, 0.5, [])
        for _ in range(2):
            for who in range(LAPTOPS):
                self.sync(who)

    @rule(who=LAPTOP, topic=st.sampled_from(TOPICS),
          importance=st.sampled_from([0.1, 0.5, 0.9]), tags=st.sampled_from([[], ["ops"], ["ops", "release"]]))
    @step
    def create(self, who: int, topic: str | None, importance: float, tags: list[str]) -> None:
        """save; with a topic key it upserts the laptop's live memory of that topic, if any."""
        store, n = self.laptops[who].store, next(self.counter)
        holders: dict[str, Version | None] = {}
        if topic is not None:
            holders = {r[0]: self.read(who, "node", r[0]) for r in self.run(store._fetch(
                "SELECT id FROM memories WHERE topic_key = ? AND deleted = 0", (topic,)))}
        args: dict[str, object] = {"content": f"note {n} written on laptop{who}",
                                   "title": f"note {n}", "tags": tags, "importance": importance}
        if topic is not None:
            args["topic_key"] = topic
        result = self.run(store.memories.save(args))
        mid = result["node_id"]
        if result.get("upserted"):
            assert mid in holders, f"{topic} upserted {mid}, not one of {list(holders)}"
        else:
            assert not holders and not result.get("deduped") and mid not in self.ids
            self.ids.append(mid)
        self.wrote(who, "node", mid, (args["content"], args["title"], ",".join(tags), "active",
                                      importance, None, None, 0), holders.get(mid))

    @rule(who=LAPTOP, pick=PICK, change=st.sampled_from(
        [("importance", 0.05), ("importance", 0.95), ("status", "background"),
         ("status", "active")]))
    @step
    def update(self, who: int, pick: int, change: tuple[str, object]) -> None:
        """update_importance / update_status on one laptop."""
        store, mid = self.laptops[who].store, self.pick(pick)
        name, value = change
        op = store.memories.update_importance(mid, value) if name == "importance" else \
            store.memories.update_status(mid, value)
        self.mutate(who, mid, op, {name: value})

    @rule(who=LAPTOP, pick=PICK)
    @step
    def archive(self, who: int, pick: int) -> None:
        """update_status archived."""
        mid = self.pick(pick)
        self.mutate(who, mid, self.laptops[who].store.memories.update_status(mid, "archived"),
                    {"status": "archived"})

    def mutate(self, who: int, mid: str, op: Coroutine[Any, Any, object],
               changes: dict[str, object]) -> None:
        before = self.live(who, mid)
        if before is None:
            self.refused(who, mid, op, ("node", mid))
            return
        self.run(op)
        fields = list(before[0])
        for name, value in changes.items():
            fields[FIELD[name]] = value
        self.wrote(who, "node", mid, tuple(fields), before)

    @rule(who=LAPTOP, src=PICK, dst=PICK)
    @step
    def invalidate(self, who: int, src: int, dst: int) -> None:
        """judge(src, dst, "supersedes"): dst gets invalid_at and superseded_by, plus an
        INVALIDATES edge."""
        store, src_id, dst_id = self.laptops[who].store, self.pick(src), self.pick(dst)
        if src_id == dst_id:
            return
        eid = edge_id(src_id, dst_id, "INVALIDATES")
        op = store.graph.judge(src_id, dst_id, "supersedes", "newer note")
        before = self.live(who, dst_id)
        if before is None or self.live(who, src_id) is None:
            self.refused(who, dst_id, op, ("node", src_id), ("node", dst_id), ("edge", eid))
            return
        edge_before = self.read(who, "edge", eid)
        self.run(op)
        after = self.read(who, "node", dst_id)
        assert after is not None
        invalid_at = after[0][FIELD["invalid_at"]]
        assert invalid_at is not None and invalid_at < after[1][0]
        fields = list(before[0])
        fields[FIELD["invalid_at"]], fields[FIELD["superseded_by"]] = invalid_at, src_id
        self.wrote(who, "node", dst_id, tuple(fields), before)
        self.wrote(who, "edge", eid, (0, props_json({"reason": "newer note"})), edge_before)

    @rule(who=LAPTOP, pick=PICK, hard=st.booleans())
    @step
    def delete(self, who: int, pick: int, hard: bool) -> None:
        """Soft or hard delete: a tombstone (archived, invalidated), and every live edge of the
        memory tombstoned in Kyma's form (props ``{…, "deleted": true, "deleted_at": stamp}``).
        A hard delete also purges a soft delete's tombstone (its text) and the reasons (props)
        on every edge of the memory, tombstones included."""
        store, mid = self.laptops[who].store, self.pick(pick)
        op = store.memories.delete(mid, hard=hard)
        before = self.live(who, mid)
        held = self.read(who, "node", mid)
        purge = hard and before is None and held is not None and bool(
            held[0][FIELD["content"]] or held[0][FIELD["title"]] is not None)
        if before is None and not purge:
            self.refused(who, mid, op, ("node", mid))
            return
        edges = {r[0]: self.read(who, "edge", r[0]) for r in self.run(store._fetch(
            "SELECT id, deleted, props FROM edges WHERE src = ? OR dst = ?", (mid, mid)))
            if not r[1] or (hard and not bare_tombstone(r[2]))}
        self.run(op)
        after = self.read(who, "node", mid)
        assert after is not None
        before = before or held
        assert before is not None
        fields = list(before[0])
        fields[FIELD["deleted"]] = 1
        # a tombstone is also the plane's soft delete: archived, and invalid from its stamp on
        # (unless it was invalidated before)
        fields[FIELD["status"]] = "archived"
        fields[FIELD["invalid_at"]] = fields[FIELD["invalid_at"]] or after[1][0]
        if hard:
            fields[FIELD["content"]], fields[FIELD["title"]], fields[FIELD["tags"]] = "", None, ""
        self.wrote(who, "node", mid, tuple(fields), before)
        for eid, edge in edges.items():
            assert edge is not None
            stamp = self.run(edge_stamp(store, eid))
            self.wrote(who, "edge", eid, (1, tombstone_props(stamp, None if hard else edge[0][1])),
                       edge)

    @rule(who=LAPTOP, pick=PICK, entity=st.sampled_from(ENTITIES))
    @step
    def link(self, who: int, pick: int, entity: str) -> None:
        """link_memory_to_entity: a live REFERENCES edge (revived if it was tombstoned)."""
        store, mid = self.laptops[who].store, self.pick(pick)
        eid = edge_id(mid, entity, "REFERENCES")
        op = store.graph.link({"memory_id": mid, "target_node_id": entity})
        if self.live(who, mid) is None:
            self.refused(who, mid, op, ("edge", eid))
            return
        before = self.read(who, "edge", eid)
        self.run(op)
        self.wrote(who, "edge", eid, (0, None), before)

    # ------------------------------------------------------------------ sync, faults, restarts

    @rule(who=LAPTOP)
    @step
    def sync(self, who: int) -> None:
        """One pass of one laptop over a healthy network completes."""
        report = self.run(self.laptops[who].sync())
        assert report.ok, report.error

    @rule(who=LAPTOP, faults=FAULTS)
    @step
    def sync_through_faults(self, who: int, faults: list[Fault]) -> None:
        """One pass whose requests meet injected faults: it may fail, it must not corrupt."""
        proxy = self.proxies[who]
        proxy.inject(*faults)
        self.run(self.laptops[who].sync())
        proxy._queue.clear()  # faults not met in this pass do not leak into the next one

    @rule(who=LAPTOP)
    @step
    def restart(self, who: int) -> None:
        """Close the laptop's engine and store; reopen both on the same data dir."""
        self.run(self.laptops[who].close())
        self.laptops[who] = self.run(self.open_laptop(who))

    @invariant()
    def versions_are_made_by_operations_and_only_move_forward(self) -> None:
        for place, store in self.places():
            for kind in ("node", "edge"):
                self.model.observe(place, kind, self.run(versions(store, kind)))
        self.clean = True

    # ------------------------------------------------------------------ the end

    def teardown(self) -> None:
        try:
            if self.clean:
                self.converge()
        finally:
            self.close_all()

    def converge(self) -> None:
        """Heal, three round-robin passes each, then every place equals every other and the
        reference model."""
        for proxy in self.proxies:
            proxy.offline = False
            proxy.fail_always(None)
            proxy._queue.clear()
        for _ in range(FINAL_ROUNDS):
            for laptop in self.laptops:
                report = self.run(laptop.sync())
                assert report.ok, f"{laptop.name}: {report.error}"
        self.versions_are_made_by_operations_and_only_move_forward()
        places = self.places()
        nodes = {name: self.run(live_contents(store)) for name, store in places}
        edges = {name: self.run(edge_set(store)) for name, store in places}
        first = places[0][0]
        for name, _ in places[1:]:
            assert nodes[name] == nodes[first], f"{name} and {first} hold different memories"
            assert edges[name] == edges[first], f"{name} and {first} hold different edges"
        assert nodes[first] == self.model.expected("node")
        assert edges[first] == self.model.expected("edge")
        for laptop in self.laptops:
            assert self.run(outbox_items(laptop.store)) == [], f"{laptop.name} still has an outbox"

    def close_all(self) -> None:
        try:
            for laptop in self.laptops:
                self.run(laptop.close())
            for proxy in self.proxies:
                self.run(proxy.close())
            if self.hub is not None:
                self.run(self.hub.close())
            self.run(self.loop.shutdown_asyncgens())
            self.run(self.loop.shutdown_default_executor())
        finally:
            self.loop.close()
            shutil.rmtree(self.root, ignore_errors=True)



def machine_test(mode: str) -> type[unittest.TestCase]:
    """The hypothesis TestCase of the machine against a hub in ``mode``."""
    machine: type[ReplicationMachine] = type(
        f"{mode.title()}Hub", (ReplicationMachine,), {"mode": mode})
    case = machine.TestCase
    case.settings = SETTINGS
    case.__doc__ = (f"R3: random ops, partial syncs, faults and restarts on three laptops "
                    f"converge to the reference model ({mode} hub).")
    return case


TestReplicationIngestHub = machine_test("ingest")
TestReplicationOriginHub = machine_test("origin")

"""RELIABILITY R4: kill -9 at every stage of a pull, restart, nothing missing.

A hub runs in this process (both cursor modes). A filler laptop pushes ~200 memories with
edges to it (later iterations add, update, delete and link some more). Then a real child
process (``crash_pull_child.py``) opens the crash laptop and runs one pass that SIGKILLs itself
at one stage of the pull: after the fetch, mid-apply (rows written, transaction open), after the
apply but before the cursor write, right after the commit. After the child is dead this process
reopens the laptop and asserts:

  * ``PRAGMA integrity_check`` = ok;
  * the laptop holds either exactly what it held before (rows, edges and cursor) or exactly the
    page (every hub row and edge, and the new cursor): never rows without their cursor or a
    cursor without its rows — and which one is fixed by the stage (only ``after_commit``
    committed);
  * a normal pass then completes and the laptop holds every hub memory and edge, versions
    included.

``SYNCD_CRASH_ITERATIONS`` sets the number of crashes per mode (default: each stage once);
iterations cycle through the stages and reuse one laptop, so later crashes hit incremental pulls.
"""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path
from typing import Any

import pytest

from local_store import Store
from tests.store_probe import integrity_check
from tests.sync.crash_pull_child import NO_CRASH_EXIT, STAGES
from tests.sync.harness import (
    Hub,
    Laptop,
    edge_set,
    live_contents,
    run_script,
    start_laptop,
)

ITERATIONS = int(os.environ.get("SYNCD_CRASH_ITERATIONS", str(len(STAGES))))
REPO_ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("crash_pull_child.py")
CHILD_TIMEOUT_S = 120.0
FIRST_BATCH = 200
ENTITIES = ("entity:repo", "entity:ci", "entity:alice")

State = tuple[dict[str, tuple[Any, ...]], dict[str, tuple[Any, ...]], str | None]


async def state_of(store: Store) -> State:
    """Rows, edges and the pull cursor: what one pulled page must change all at once."""
    cursor = (await store.replication.sync_state()).get("cursor")
    return await live_contents(store), await edge_set(store), cursor


async def hub_cursor(hub: Hub) -> str | None:
    """The cursor a complete pull must store: in ingest mode the hub's last feed mark (nothing
    is written to the hub meanwhile); in origin mode the hub's clock, unknowable here."""
    if hub.cursor != "ingest":
        return None
    _, _, until, _ = await hub.store.feed.page(None)
    return until


class Filler:
    """The laptop that writes everything the crash laptop pulls."""

    def __init__(self, laptop: Laptop, rng: random.Random) -> None:
        self.laptop, self.rng = laptop, rng
        self.live: list[str] = []
        self.batch = 0

    async def write(self) -> None:
        store, n = self.laptop.store, FIRST_BATCH if not self.batch else 30
        saved = await store.memories.save_many([
            {"content": f"batch {self.batch} note {i}: deploy step {self.rng.random()}",
             "tags": [f"b{self.batch}"], "importance": self.rng.choice([0.2, 0.5, 0.8])}
            for i in range(n)])
        fresh = [f"memory:{uuid}" for uuid in saved["ids"]]
        old, self.live = self.live, self.live + fresh
        for mid in self.rng.sample(fresh, 5 if old else 20):
            await store.graph.link({"memory_id": mid, "target_node_id": self.rng.choice(ENTITIES)})
        if old:
            for mid in self.rng.sample(old, 10):
                await store.memories.update_importance(mid, self.rng.random())
            for k, mid in enumerate(self.rng.sample(old, 5)):
                await store.memories.delete(mid, hard=bool(k % 2))
                self.live.remove(mid)
        self.batch += 1
        report = await self.laptop.sync()
        assert report.ok, report.error


async def run_child(data_dir: Path, hub: Hub, stage: str) -> tuple[int, str]:
    try:
        return await run_script(CHILD, str(data_dir), hub.url, hub.token, stage,
                                timeout_s=CHILD_TIMEOUT_S)
    except TimeoutError:
        pytest.fail(f"crash child at {stage} still running after {CHILD_TIMEOUT_S}s")


def outcome(after: State, before: State, page: State, exact_cursor: bool) -> str:
    """"none" (nothing of the page), "all" (every row of the page and its cursor), or
    "partial" — the one R4 forbids."""
    if after == before:
        return "none"
    rows, edges, cursor = after
    if (rows, edges) == page[:2] and cursor is not None and cursor != before[2] and (
            not exact_cursor or cursor == page[2]):
        return "all"
    return "partial"


async def test_kill_9_at_every_pull_stage_keeps_rows_and_cursor_together(
        hub: Hub, tmp_path: Path) -> None:
    """R4: kill -9 at each pull stage → the page and its cursor commit together; nothing lost."""
    filler = Filler(await start_laptop("filler", tmp_path / "filler", hub.url, hub.token),
                    random.Random(4))
    data_dir = tmp_path / "crash-laptop"
    before: State = ({}, {}, None)
    try:
        for iteration in range(ITERATIONS):
            stage = STAGES[iteration % len(STAGES)]
            await filler.write()
            page: State = (await live_contents(hub.store), await edge_set(hub.store),
                           await hub_cursor(hub))
            assert page[:2] != before[:2]

            code, output = await run_child(data_dir, hub, stage)
            assert code != NO_CRASH_EXIT, f"the crash at {stage} never fired:\n{output}"
            assert code == -signal.SIGKILL, f"child at {stage} exited {code}:\n{output}"

            laptop = await start_laptop("crash", data_dir, hub.url, hub.token)
            try:
                assert await integrity_check(laptop.store) == "ok"
                after = await state_of(laptop.store)
                got = outcome(after, before, page, exact_cursor=page[2] is not None)
                assert got != "partial", (
                    f"{hub.cursor}/{stage}: rows and cursor were not committed together: "
                    f"{len(after[0])} rows (before {len(before[0])}, page {len(page[0])}), "
                    f"cursor {after[2]!r} (before {before[2]!r}, page {page[2]!r})")
                assert got == ("all" if stage == "after_commit" else "none"), (
                    f"{hub.cursor}/{stage}: {got}")

                report = await laptop.sync()
                assert report.ok, report.error
                assert await live_contents(laptop.store) == await live_contents(hub.store)
                assert await edge_set(laptop.store) == await edge_set(hub.store)
                assert (await laptop.store.maintenance.stats())["outbox"] == 0
                before = await state_of(laptop.store)
            finally:
                await laptop.close()
    finally:
        await filler.laptop.close()

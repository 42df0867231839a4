"""Recall's row memo (``reader.RowMemo``) never answers with a row a write has changed.

Each case recalls a memory once (its row enters the memo through the semantic leg), changes
it through the store's writer — another connection, as every write is — and recalls again:
the answer must show the change. The memo must also be used: a repeated recall reads no row
of its semantic leg again."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from local_store import Store, db
from local_store.reader import MEMO_CHANGED, MEMO_ROWS, RowMemo, SyncReader
from local_store.recall import Recall, Semantic
from protocol.query import QueryRequest

TEXT = "rotate the signing keys every ninety days"


async def recalled(store: Store, **request: object) -> dict[str, Any]:
    res = await store.recall.query({"query": TEXT, **request})
    return {m.id: m for m in res.memories if not m.fallback}


Change = Callable[[Store, str], Awaitable[object]]
CHANGES: dict[str, tuple[Change, Callable[[dict[str, Any], str], bool]]] = {
    "archived": (lambda s, mid: s.memories.update_status(mid, "archived"),
                 lambda got, mid: mid not in got),
    "soft-deleted": (lambda s, mid: s.memories.delete(mid), lambda got, mid: mid not in got),
    "hard-deleted": (lambda s, mid: s.memories.delete(mid, hard=True), lambda got, mid: mid not in got),
    "importance": (lambda s, mid: s.memories.update_importance(mid, 0.93),
                   lambda got, mid: got[mid].importance == pytest.approx(0.93)),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
async def test_a_write_between_two_recalls_shows_in_the_second(store: Store, change: str) -> None:
    mid = (await store.memories.save({"content": TEXT, "importance": 0.2}))["node_id"]
    await store.memories.save({"content": "the release train leaves on thursdays"})
    assert (await recalled(store))[mid].importance == pytest.approx(0.2)
    assert store._recall_reader.memo.held > 0  # the row came through the memo
    act, holds = CHANGES[change]
    await act(store, mid)
    assert holds(await recalled(store), mid), change


async def test_a_superseding_judgement_shows_as_invalidated(store: Store) -> None:
    old = (await store.memories.save({"content": TEXT}))["node_id"]
    assert old in await recalled(store)
    new = (await store.memories.save({"content": TEXT + " via the vault"}))["node_id"]
    await store.graph.judge(new, old, "supersedes")
    assert old not in await recalled(store)
    assert (await recalled(store, include_invalidated=True))[old].superseded_by == new


async def test_a_repeated_recall_reads_its_rows_from_the_memo(store: Store,
                                                              tmp_path: Path) -> None:
    """Across writes too: a write costs the memo the rows of the memories it wrote, no more —
    and those rows are read again, so the next answer shows the write."""
    ids = [(await store.memories.save({"content": f"{TEXT} note {i}"}))["node_id"] for i in range(30)]
    reader = SyncReader(tmp_path / "data" / db.DB_FILENAME)
    reads: list[set[str]] = []  # the memory ids of each row read

    def fetch(sql: str, params: Any) -> list[Any]:
        if "m.id IN" in sql:
            reads.append({p for p in params if isinstance(p, str) and p.startswith("memory:")})
        return reader.fetch(sql, params)

    memo = RowMemo(fetch)
    request = msgspec.convert({"query": TEXT}, QueryRequest)
    vector = store.embedder.embed([TEXT])[0]

    def answer() -> Any:
        semantic = Semantic(*store.index.snapshot(vector))
        return Recall(fetch, semantic, store.settings.current, memo=memo).run(request)

    async def read_by_next_answer() -> tuple[set[str], Any]:
        reads.clear()
        got = await asyncio.get_running_loop().run_in_executor(reader.pool, answer)
        return set().union(*reads), got

    try:
        first_read, first = await read_by_next_answer()
        assert len(first.memories) >= 5 and set(ids[:5]) <= first_read  # a real answer
        read, second = await read_by_next_answer()
        assert read == set()  # nothing read again
        assert [m.id for m in second.memories] == [m.id for m in first.memories]
        unrelated = (await store.memories.save({"content": "an unrelated write"}))["node_id"]
        read, again = await read_by_next_answer()
        assert read <= {unrelated}  # the rows already held stay held
        assert [m.id for m in again.memories] == [m.id for m in first.memories]
        changed = first.memories[0].id
        await store.memories.update_importance(changed, 0.91)
        read, after = await read_by_next_answer()
        assert read == {changed}  # exactly the written memory's row is read again
        assert {m.id: m.importance for m in after.memories}[changed] == pytest.approx(0.91)
        await store.memories.delete(changed)  # (it leaves the index: no leg asks for its row)
        read, gone = await read_by_next_answer()
        assert changed not in {m.id for m in gone.memories} and read <= {changed}
    finally:
        await reader.close()


async def test_fresh_forgets_the_written_memories_or_past_a_bound_all(
        store: Store, tmp_path: Path) -> None:
    """``fresh`` drops the rows of the memories written since (up to ``MEMO_CHANGED`` of
    them), all rows past that, and then keeps following the writes."""
    ids = [(await store.memories.save({"content": f"{TEXT} note {i}"}))["node_id"] for i in range(8)]
    reader = SyncReader(tmp_path / "data" / db.DB_FILENAME)

    async def on_reader(call: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(reader.pool, call)

    def hold(memo: RowMemo, held: list[str]) -> None:
        memo.rows("w", ()).update((mid, (mid,)) for mid in held)
        memo.added(len(held))

    try:
        memo = RowMemo(reader.fetch)
        await on_reader(memo.fresh)
        hold(memo, ids)
        await on_reader(memo.fresh)  # nothing written: everything stays
        assert set(memo.rows("w", ())) == set(ids) and memo.held == len(ids)
        await store.memories.update_importance(ids[0], 0.5)
        await store.memories.delete(ids[1])
        await on_reader(memo.fresh)
        assert set(memo.rows("w", ())) == set(ids[2:]) and memo.held == len(ids) - 2
        await store.memories.save_many([{"content": f"filler {i}"} for i in range(MEMO_CHANGED - 1)])
        await store.memories.update_importance(ids[2], 0.5)  # MEMO_CHANGED written: still one by one
        await on_reader(memo.fresh)
        assert set(memo.rows("w", ())) == set(ids[3:])
        await store.memories.save_many([{"content": f"more {i}"} for i in range(MEMO_CHANGED + 1)])
        await on_reader(memo.fresh)
        assert memo.rows("w", ()) == {} and memo.held == 0
        hold(memo, ids[3:])
        await store.memories.update_importance(ids[3], 0.5)  # followed again after starting over
        await on_reader(memo.fresh)
        assert set(memo.rows("w", ())) == set(ids[4:])
    finally:
        await reader.close()


@pytest.mark.parametrize("batch_every", [None, 25], ids=["single writes", "with batches"])
async def test_recalls_racing_writes_end_on_the_written_state(store: Store,
                                                              batch_every: int | None) -> None:
    """Recalls run while a writer keeps changing the memories they answer with; once the
    writes stop, the next recall shows every memory as last written (no row the memo kept
    from before a write survives it). With batches, some writes are more than
    ``MEMO_CHANGED`` memories at once, so the memo also starts over while recalls run."""
    ids = [(await store.memories.save({"content": f"{TEXT} note {i}", "importance": 0.1}))["node_id"]
           for i in range(12)]
    last: dict[str, float] = {}

    async def writes() -> None:
        for step in range(ROUNDS):
            if batch_every and step % batch_every == 0:
                await store.memories.save_many([{"content": f"filler {step} {i}"}
                                       for i in range(MEMO_CHANGED + 1)])
            mid = ids[step * 7 % len(ids)]
            last[mid] = round(0.2 + (step % 70) / 100, 2)
            await store.memories.update_importance(mid, last[mid])

    async def recalls() -> None:
        for _ in range(ROUNDS):
            await recalled(store)

    await asyncio.gather(writes(), recalls())
    got = await recalled(store, limit=50)
    assert set(ids) <= set(got)
    for mid in ids:
        assert got[mid].importance == pytest.approx(last.get(mid, 0.1)), mid


ROUNDS = 150


def test_the_memo_empties_itself_past_its_bound() -> None:
    memo = RowMemo(lambda sql, params: [(1,)])
    memo.fresh()
    memo.rows("w", ()).update(dict.fromkeys(map(str, range(MEMO_ROWS))))
    memo.added(MEMO_ROWS)
    assert memo.held == MEMO_ROWS and len(memo.rows("w", ())) == MEMO_ROWS
    memo.added(1)
    assert memo.held == 0 and memo.rows("w", ()) == {}

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
from local_store.reader import MEMO_ROWS, RowMemo, SyncReader
from local_store.recall import Recall, Semantic
from protocol.query import QueryRequest

TEXT = "rotate the signing keys every ninety days"


async def recalled(store: Store, **request: object) -> dict[str, Any]:
    res = await store.recall({"query": TEXT, **request})
    return {m.id: m for m in res.memories if not m.fallback}


Change = Callable[[Store, str], Awaitable[object]]
CHANGES: dict[str, tuple[Change, Callable[[dict[str, Any], str], bool]]] = {
    "archived": (lambda s, mid: s.update_status(mid, "archived"),
                 lambda got, mid: mid not in got),
    "soft-deleted": (lambda s, mid: s.delete(mid), lambda got, mid: mid not in got),
    "hard-deleted": (lambda s, mid: s.delete(mid, hard=True), lambda got, mid: mid not in got),
    "importance": (lambda s, mid: s.update_importance(mid, 0.93),
                   lambda got, mid: got[mid].importance == pytest.approx(0.93)),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
async def test_a_write_between_two_recalls_shows_in_the_second(store: Store, change: str) -> None:
    mid = (await store.save({"content": TEXT, "importance": 0.2}))["node_id"]
    await store.save({"content": "the release train leaves on thursdays"})
    assert (await recalled(store))[mid].importance == pytest.approx(0.2)
    assert store._recall_reader.memo.held > 0  # the row came through the memo
    act, holds = CHANGES[change]
    await act(store, mid)
    assert holds(await recalled(store), mid), change


async def test_a_superseding_judgement_shows_as_invalidated(store: Store) -> None:
    old = (await store.save({"content": TEXT}))["node_id"]
    assert old in await recalled(store)
    new = (await store.save({"content": TEXT + " via the vault"}))["node_id"]
    await store.judge(new, old, "supersedes")
    assert old not in await recalled(store)
    assert (await recalled(store, include_invalidated=True))[old].superseded_by == new


async def test_a_repeated_recall_reads_its_rows_from_the_memo(store: Store,
                                                              tmp_path: Path) -> None:
    for i in range(30):
        await store.save({"content": f"{TEXT} note {i}"})
    reader = SyncReader(tmp_path / "data" / db.DB_FILENAME)
    statements: list[str] = []

    def fetch(sql: str, params: Any) -> list[Any]:
        statements.append(sql)
        return reader.fetch(sql, params)

    memo = RowMemo(fetch)
    request = msgspec.convert({"query": TEXT}, QueryRequest)
    vector = store.embedder.embed([TEXT])[0]

    def answer() -> Any:
        semantic = Semantic(*store.index.snapshot(vector))
        return Recall(fetch, semantic, store.settings, memo=memo).run(request)

    def row_reads() -> int:
        return sum("m.id IN" in sql for sql in statements)

    try:
        loop = asyncio.get_running_loop()
        first = await loop.run_in_executor(reader.pool, answer)
        reads = row_reads()
        second = await loop.run_in_executor(reader.pool, answer)
        assert row_reads() == reads  # nothing read again
        assert [m.id for m in second.memories] == [m.id for m in first.memories]
        assert len(first.memories) >= 5  # a real answer, not an empty one
        await store.save({"content": "an unrelated write"})
        await loop.run_in_executor(reader.pool, answer)
        assert row_reads() > reads  # the write emptied the memo
    finally:
        await reader.close()


def test_the_memo_empties_itself_past_its_bound() -> None:
    memo = RowMemo(lambda sql, params: [(1,)])
    memo.fresh()
    memo.rows("w", ()).update(dict.fromkeys(map(str, range(MEMO_ROWS))))
    memo.added(MEMO_ROWS)
    assert memo.held == MEMO_ROWS and len(memo.rows("w", ())) == MEMO_ROWS
    memo.added(1)
    assert memo.held == 0 and memo.rows("w", ()) == {}

"""The vector index dropped before a pull that would outgrow it, and rebuilt when recall next
needs it (``Shell.drop_index``/``ensure_index``): every stored vector and nothing else ends up in
it whatever lands meanwhile, and recall answers as a store that never dropped it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from local_store import HashingEmbedder, Store
from protocol.rows import NodeRow
from protocol.timestamp import format_ns

T0 = 1_780_000_000_000_000_000
WORDS = ("deploy", "branch", "release", "cache", "index", "schema", "token", "proxy", "vector",
         "backup", "restore", "migrate", "lint", "build", "wheel", "daemon")


def text(i: int) -> str:
    return " ".join(WORDS[(i * k) % len(WORDS)] for k in (1, 3, 5, 7)) + f" note {i}"


def rows(store: Store, first: int, count: int) -> list[NodeRow]:
    """Pulled rows carrying the store's own model's vectors, as a plane of the same model sends."""
    texts = [text(i) for i in range(first, first + count)]
    vectors = store.embedder.embed(texts)
    out = []
    for k, i in enumerate(range(first, first + count)):
        stamp = format_ns(T0 + i)
        out.append(NodeRow(id=f"memory:pulled{i:06d}", realm="p", memory_type="fact",
                           content=texts[k], updated_at=stamp, created_at=stamp,
                           importance=0.5, status="active",
                           embedding=[float(x) for x in vectors[k]]))
    return out


async def stored_ids(store: Store) -> set[str]:
    found = await store._fetch("SELECT memory_id FROM vectors WHERE model = ?",
                               (store.embedder.model_id,))
    return {r[0] for r in found}


async def pull(store: Store, batch: list[NodeRow]) -> None:
    store.replication.expect_vectors(len(batch), store.embedder.model_id)
    for at in range(0, len(batch), 500):
        await store.replication.apply(batch[at:at + 500], [], model=store.embedder.model_id)


async def test_a_pull_that_outgrows_the_index_drops_it_and_recall_rebuilds_it(
        tmp_path: Path) -> None:
    async with await Store.open(tmp_path / "a", embedder=HashingEmbedder()) as store, \
            await Store.open(tmp_path / "b", embedder=HashingEmbedder()) as control:
        for s in (store, control):
            await s.memories.save({"content": "the release branch deploys with make ship"})
        room = store.index.capacity - len(store.index)
        batch = rows(store, 0, room + 200)
        await pull(store, batch)
        assert store.index_stale and len(store.index) == 0  # nothing was grown or copied
        assert await store.maintenance.indexed_vectors() == len(batch) + 1
        for at in range(0, len(batch), 500):  # the control grows its index in place
            await control.replication.apply(batch[at:at + 500], [],
                                            model=control.embedder.model_id)
        assert not control.index_stale and len(control.index) == len(batch) + 1

        query = {"query": "release branch deploy", "limit": 10}
        got, want = await store.recall.query(query), await control.recall.query(query)
        assert not store.index_stale
        assert set(store.index.ids) == await stored_ids(store)
        def answer(response: object) -> list[tuple[str, float]]:  # the saved row's id differs
            return [(m.id if m.id.startswith("memory:pulled") else "saved", round(m.score, 6))
                    for m in response.memories]  # type: ignore[attr-defined]
        assert answer(got) == answer(want) and len(answer(got)) == 10
        assert await store.maintenance.indexed_vectors() == len(batch) + 1


async def test_a_small_pull_goes_into_the_loaded_index(tmp_path: Path) -> None:
    async with await Store.open(tmp_path / "a", embedder=HashingEmbedder()) as store:
        batch = rows(store, 0, 300)
        await pull(store, batch)  # fits the 1,024 rows a new index has room for
        assert not store.index_stale and len(store.index) == 300


async def test_writes_and_drops_during_a_rebuild_all_reach_the_index(tmp_path: Path) -> None:
    """Saves and pulled rows that land while the rebuild reads, and a second drop before it is
    installed: once it is, the index holds exactly the stored vectors."""
    async with await Store.open(tmp_path / "a", embedder=HashingEmbedder()) as store:
        await pull(store, rows(store, 0, 1500))
        assert store.index_stale
        saves = [store.memories.save({"content": f"{text(i)} saved during the rebuild"})
                 for i in range(5)]
        await asyncio.gather(store.recall.query({"query": "cache index"}), *saves)
        assert not store.index_stale
        assert set(store.index.ids) == await stored_ids(store)

        store.drop_index()
        rebuilt = asyncio.ensure_future(store.ensure_index())
        await asyncio.sleep(0)  # the rebuild's read is queued on the writer
        store.drop_index()  # dropped again while it reads, then rows land
        await pull(store, rows(store, 5000, 1500))
        await rebuilt
        assert not store.index_stale
        assert set(store.index.ids) == await stored_ids(store)
        assert len(store.index) == 1500 + 5 + 1500


async def test_a_store_opened_again_reads_the_index_a_block_at_a_time(tmp_path: Path) -> None:
    async with await Store.open(tmp_path / "a", embedder=HashingEmbedder()) as store:
        await pull(store, rows(store, 0, 700))
        before = (list(store.index.ids), store.index.matrix.copy())
    async with await Store.open(tmp_path / "a", embedder=HashingEmbedder()) as store:
        assert store.index.ids == before[0]
        assert (store.index.matrix == before[1]).all()

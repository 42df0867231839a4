"""A failing embedder never costs a memory: saves land without a vector (keyword recall finds
them), recall answers from its keyword leg, the failure is visible, and the vectors come once
the embedder works again."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from local_store import HashingEmbedder, Store


class FlakyEmbedder(HashingEmbedder):
    """The hashing embedder, failing while ``broken`` (a model file gone, a runtime error)."""

    broken = True

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        if self.broken:
            raise RuntimeError("model.onnx: No such file or directory")
        return super().embed(texts)


@pytest.fixture
async def flaky(tmp_path: Path) -> AsyncIterator[tuple[Store, FlakyEmbedder]]:
    embedder = FlakyEmbedder()
    store = await Store.open(tmp_path, embedder=embedder)
    try:
        yield store, embedder
    finally:
        await store.close()


async def vector_count(store: Store) -> int:
    return int((await store._fetch("SELECT count(*) FROM vectors"))[0][0])


async def test_saves_land_without_vectors_while_the_embedder_fails(
        flaky: tuple[Store, FlakyEmbedder]) -> None:
    store, embedder = flaky
    one = await store.save({"content": "deploy with make release"})
    many = await store.save_many([{"content": "rotate the staging keys monthly"},
                                  {"content": "billing runs on postgres"}])
    entity = await store.ingest_entity({"name": "billing-api", "kind": "service"})
    assert one["saved"] and many["count"] == 2 and entity["node_id"]
    assert (await store.stats())["memories"] == 4
    assert await vector_count(store) == 0 and len(store.index) == 0
    assert store.embedder_error == "RuntimeError: model.onnx: No such file or directory"

    found = await store.recall({"query": "make release"})
    assert [m.id for m in found.memories] == [one["node_id"]] and not found.fallback

    embedder.broken = False
    assert await store.reembed_missing() == 4
    assert store.embedder_error is None
    assert await vector_count(store) == 4 and len(store.index) == 4


async def test_recall_answers_from_keywords_while_the_embedder_fails(
        flaky: tuple[Store, FlakyEmbedder]) -> None:
    store, embedder = flaky
    embedder.broken = False
    saved = await store.save({"content": "rotate the staging keys monthly"})
    assert len(store.index) == 1
    embedder.broken = True
    found = await store.recall({"query": "staging keys"})
    assert [m.id for m in found.memories] == [saved["node_id"]]
    assert found.memories[0].distance is None  # no semantic leg ran
    assert store.embedder_error is not None
    embedder.broken = False
    found = await store.recall({"query": "staging keys"})
    assert found.memories[0].distance is not None and store.embedder_error is None


async def test_reembedding_reports_its_progress(flaky: tuple[Store, FlakyEmbedder]) -> None:
    store, embedder = flaky
    await store.save_many([{"content": f"note {i}"} for i in range(5)])
    embedder.broken = False
    seen: list[tuple[int, int]] = []
    assert await store.reembed_missing(batch=2, progress=lambda d, t: seen.append((d, t))) == 5
    assert seen == [(2, 5), (4, 5), (5, 5)]

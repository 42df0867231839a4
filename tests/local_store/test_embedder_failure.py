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
from protocol.rows import NodeRow


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
    one = await store.memories.save({"content": "deploy with make release"})
    many = await store.memories.save_many([{"content": "rotate the staging keys monthly"},
                                  {"content": "billing runs on postgres"}])
    entity = await store.graph.ingest_entity({"name": "billing-api", "kind": "service"})
    assert one["saved"] and many["count"] == 2 and entity["node_id"]
    assert (await store.maintenance.stats())["memories"] == 4
    assert await vector_count(store) == 0 and len(store.index) == 0
    assert store.embedder_error == "RuntimeError: model.onnx: No such file or directory"

    found = await store.recall.query({"query": "make release"})
    assert [m.id for m in found.memories] == [one["node_id"]] and not found.fallback

    embedder.broken = False
    assert await store.embedding.reembed_missing() == 4
    assert store.embedder_error is None
    assert await vector_count(store) == 4 and len(store.index) == 4


async def test_recall_answers_from_keywords_while_the_embedder_fails(
        flaky: tuple[Store, FlakyEmbedder]) -> None:
    store, embedder = flaky
    embedder.broken = False
    saved = await store.memories.save({"content": "rotate the staging keys monthly"})
    assert len(store.index) == 1
    embedder.broken = True
    found = await store.recall.query({"query": "staging keys"})
    assert [m.id for m in found.memories] == [saved["node_id"]]
    assert found.memories[0].distance is None  # no semantic leg ran
    assert store.embedder_error is not None
    embedder.broken = False
    found = await store.recall.query({"query": "staging keys"})
    assert found.memories[0].distance is not None and store.embedder_error is None


async def test_reembedding_reports_its_progress(flaky: tuple[Store, FlakyEmbedder]) -> None:
    store, embedder = flaky
    await store.memories.save_many([{"content": f"note {i}"} for i in range(5)])
    embedder.broken = False
    seen: list[tuple[int, int]] = []
    assert await store.embedding.reembed_missing(batch=2, progress=lambda d, t: seen.append((d, t))) == 5
    assert seen == [(2, 5), (4, 5), (5, 5)]


class OddEmbedder(HashingEmbedder):
    """Answers what a broken model might: ``bad`` is "short" (one value missing per row),
    "nan", or None (the hashing embedder's own answer); texts holding ``poison`` fail."""

    bad: str | None = None
    poison: str | None = None

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        if self.poison is not None and any(self.poison in text for text in texts):
            raise RuntimeError("tokenizer: cannot encode this text")
        out = super().embed(texts)
        if self.bad == "short":
            return out[:, :-1]
        if self.bad == "nan":
            out[:] = np.nan
        return out


@pytest.mark.parametrize("bad", ["short", "nan"])
async def test_an_answer_that_is_not_a_vector_is_a_failure(tmp_path: Path, bad: str) -> None:
    """A row of the wrong width, or NaN, was stored as the memory's vector: re-embedding looks
    only for memories without one, so it stood for the memory forever."""
    embedder = OddEmbedder()
    embedder.bad = bad
    async with await Store.open(tmp_path, embedder=embedder) as store:
        saved = await store.memories.save({"content": "deploy with make release"})
        assert saved["node_id"] not in store.index and await vector_count(store) == 0
        assert store.embedder_error is not None and "embedder answered" in store.embedder_error
        embedder.bad = None
        assert await store.embedding.reembed_missing() == 1
        assert saved["node_id"] in store.index


async def test_one_text_the_embedder_cannot_take_does_not_stop_the_others(
        tmp_path: Path) -> None:
    """After a model switch, one such text failed its whole batch, and every pass failed on it
    first: none of the others ever got a vector of the new model."""
    async with await Store.open(tmp_path, embedder=HashingEmbedder(model_id="old")) as store:
        ids = [(await store.memories.save({"content": "POISON first"}))["node_id"]]
        ids += [(await store.memories.save({"content": f"ordinary note {i}"}))["node_id"]
                for i in range(10)]
    embedder = OddEmbedder(model_id="new")
    embedder.poison = "POISON"
    async with await Store.open(tmp_path, embedder=embedder) as store:
        assert await store.embedding.reembed_missing(batch=4) == 10
        assert [mid in store.index for mid in ids] == [False] + [True] * 10
        embedder.poison = None  # a fixed model: the one left behind is taken next time
        assert await store.embedding.reembed_missing(batch=4) == 1 and ids[0] in store.index
    embedder = OddEmbedder(model_id="newer")
    embedder.poison = " "  # every text fails: the embedder is what fails, and it says so
    async with await Store.open(tmp_path, embedder=embedder) as store:
        await store.memories.save({"content": "a note for the newer model"})
        with pytest.raises(RuntimeError, match="cannot encode"):
            await store.embedding.reembed_missing(batch=50)


async def local_vector(store: Store, memory_id: str) -> npt.NDArray[np.float32] | None:
    rows = await store._fetch("SELECT vec FROM vectors WHERE memory_id = ? AND model = ?",
                              (memory_id, store.embedder.model_id))
    return None if not rows else np.frombuffer(rows[0][0], dtype="<f4")


async def test_a_text_changed_without_a_new_vector_loses_the_old_ones(
        flaky: tuple[Store, FlakyEmbedder]) -> None:
    """The text changed while the embedder failed (a topic-key upsert): the old text's vector
    stayed, so semantic recall matched the old text and re-embedding (which looks for
    memories without a vector) never replaced it."""
    store, embedder = flaky
    embedder.broken = False
    mid = (await store.memories.save({"content": "deploy with make release", "topic_key": "deploy"}))[
        "node_id"]
    embedder.broken = True
    again = await store.memories.save({"content": "kubernetes helm chart rollout canary",
                              "topic_key": "deploy"})
    assert again["node_id"] == mid and await local_vector(store, mid) is None
    assert mid not in store.index
    await store.memories.update_status(mid, "background")  # no text change: nothing to drop
    embedder.broken = False
    assert await store.embedding.reembed_missing() == 1
    vector = await local_vector(store, mid)
    assert vector is not None and np.allclose(
        vector, embedder.embed(["kubernetes helm chart rollout canary"])[0])
    await store.memories.update_status(mid, "active")  # a write that keeps the text keeps its vector
    assert await local_vector(store, mid) is not None and mid in store.index


async def test_a_pulled_text_change_drops_the_local_models_vector(tmp_path: Path) -> None:
    """A pulled version with new text replaced only the sender's model's vector: the local
    model's, of the old text, stayed in the table and the index."""
    embedder = HashingEmbedder()
    async with await Store.open(tmp_path, embedder=embedder) as store:
        mid = (await store.memories.save({"content": "deploy with make release"}))["node_id"]
        same = (await store.memories.save({"content": "an untouched note"}))["node_id"]
        kept = await local_vector(store, same)
        newer = [NodeRow(id=mid, content="kubernetes helm chart rollout canary",
                         updated_at="2999-01-01T00:00:00+00:00", embedding=[0.6, 0.8]),
                 NodeRow(id=same, content="an untouched note", importance=0.9,
                         updated_at="2999-01-01T00:00:00+00:00", embedding=[0.8, 0.6])]
        result = await store.replication.apply(newer, [], model="bge-small-en-v1.5")
        assert result.applied_nodes == 2
        assert await local_vector(store, mid) is None and mid not in store.index
        assert kept is not None and np.array_equal(await local_vector(store, same), kept)
        assert same in store.index  # its text did not change: its vector still fits
        assert await store.embedding.reembed_missing() == 1
        assert np.allclose(await local_vector(store, mid),
                           embedder.embed(["kubernetes helm chart rollout canary"])[0])

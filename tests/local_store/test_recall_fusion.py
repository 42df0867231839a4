"""syncd's fusion on stores whose cosines are planted: importance and recency scale the evidence
instead of adding to it, a superseded memory never ranks above its successor, and only the
best match's links count as graph evidence, and an entity is a name — no graph term, no recency
(``ranking.score_syncd``, ``recall._expand``)."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from local_store import HashingEmbedder, Store
from local_store.embed import Vectors

QUERY = "which one answers it"


def planted(cosine: float, axis: int) -> list[float]:
    """A unit vector at ``cosine`` from the query's axis (0), the rest on its own ``axis``."""
    v = np.zeros(384, dtype=np.float32)
    v[0], v[axis] = cosine, math.sqrt(1 - cosine * cosine)
    return v.tolist()


class PlantedEmbedder(HashingEmbedder):
    """Texts in ``vectors`` get the planted vector (the query: axis 0); others hash."""

    def __init__(self) -> None:
        super().__init__()
        self.vectors: dict[str, list[float]] = {QUERY: planted(1.0, 1)}

    def embed(self, texts: list[str]) -> Vectors:
        out = super().embed(texts)
        for i, text in enumerate(texts):
            if text in self.vectors:
                out[i] = self.vectors[text]
        return out


@pytest.fixture
async def planted_store(tmp_path: Path) -> AsyncIterator[tuple[Store, PlantedEmbedder]]:
    embedder = PlantedEmbedder()
    store = await Store.open(tmp_path / "data", embedder=embedder)
    try:
        yield store, embedder
    finally:
        await store.close()


async def save_at(store: Store, embedder: PlantedEmbedder, content: str, cosine: float,
                  axis: int, **fields: Any) -> str:
    embedder.vectors[content] = planted(cosine, axis)
    return str((await store.memories.save({"content": content, **fields}))["node_id"])


async def ranked(store: Store, **kw: Any) -> list[str]:
    res = await store.recall.query({"query": QUERY, "expand_hops": 1, **kw})
    return [m.id for m in res.memories if not m.fallback]


async def test_importance_reorders_close_matches_but_does_not_lift_a_weak_one(
        planted_store: tuple[Store, PlantedEmbedder]) -> None:
    store, embedder = planted_store
    nearest = await save_at(store, embedder, "alpha note", 0.40, 2, importance=0.1)
    # 0.03 further and of full importance: an added term (0.04 · 0.9) lifted it over the
    # nearest; scaled, importance is worth 4 % of its evidence, about 0.016 here.
    further = await save_at(store, embedder, "bravo note", 0.37, 3, importance=1.0)
    assert (await ranked(store))[:2] == [nearest, further]
    # 0.005 further and of full importance: importance settles a close call.
    close = await save_at(store, embedder, "charlie note", 0.395, 4, importance=1.0)
    assert (await ranked(store))[:3] == [close, nearest, further]


async def test_a_superseded_memory_never_ranks_above_the_memory_that_superseded_it(
        planted_store: tuple[Store, PlantedEmbedder]) -> None:
    store, _ = planted_store
    oldest = await store.memories.save({"content": "billing runs on mysql five"})
    middle = await store.memories.save({"content": "billing moved to mariadb"})
    newest = await store.memories.save({"content": "the ledger now lives in postgres"})
    await store.graph.judge(middle["id"], oldest["id"], "supersedes")
    await store.graph.judge(newest["id"], middle["id"], "supersedes")
    res = await store.recall.query({"query": "billing runs on mysql five", "include_invalidated": True})
    order = [m.id for m in res.memories]
    # the oldest holds every word of the query (a strict keyword hit, far ahead on evidence)
    assert order[:3] == [newest["node_id"], middle["node_id"], oldest["node_id"]]
    scores = [m.score for m in res.memories]
    assert scores == sorted(scores, reverse=True)
    by_id = {m.id: m for m in res.memories}
    assert by_id[oldest["node_id"]].superseded_by == middle["node_id"]
    # without invalidated memories the current one is all there is of the chain
    current = await store.recall.query({"query": "billing runs on mysql five"})
    assert newest["node_id"] in [m.id for m in current.memories]
    assert oldest["node_id"] not in [m.id for m in current.memories]


async def test_only_the_best_matchs_links_count_as_graph_evidence(
        planted_store: tuple[Store, PlantedEmbedder]) -> None:
    store, embedder = planted_store
    best = await save_at(store, embedder, "delta best match", 0.90, 2)
    weaker = await save_at(store, embedder, "echo weaker match", 0.50, 3)
    of_best = await save_at(store, embedder, "foxtrot linked to the best", 0.30, 4)
    of_weaker = await save_at(store, embedder, "golf linked to the weaker", 0.30, 5)
    for src, dst in ((best, of_best), (weaker, of_weaker)):
        await store.graph.link({"memory_id": src, "target_node_id": dst,
                          "relationship_type": "RELATES_TO"})
    res = await store.recall.query({"query": QUERY, "expand_hops": 1})
    parts = {m.id: m.components for m in res.memories}
    linked_to_best, linked_to_weaker = parts[of_best], parts[of_weaker]
    assert linked_to_best is not None and linked_to_best.graph > 0
    assert linked_to_weaker is not None and linked_to_weaker.graph == 0
    order = [m.id for m in res.memories]
    assert order.index(of_best) < order.index(of_weaker)


async def entity_at(store: Store, embedder: PlantedEmbedder, name: str, cosine: float,
                    axis: int) -> str:
    embedder.vectors[name] = planted(cosine, axis)  # an entity with no kind: its name is its text
    return str((await store.graph.ingest_entity({"name": name}))["node_id"])


async def test_when_an_entity_is_the_best_match_the_best_statements_links_count_too(
        planted_store: tuple[Store, PlantedEmbedder]) -> None:
    store, embedder = planted_store
    repo = await entity_at(store, embedder, "india-repo", 0.90, 2)
    about = await save_at(store, embedder, "juliet what the store says of the repo", 0.60, 3)
    pitfall = await save_at(store, embedder, "kilo pitfall of the statement", 0.30, 4)
    weaker = await save_at(store, embedder, "lima weaker match", 0.50, 5)
    of_weaker = await save_at(store, embedder, "mike linked to the weaker", 0.30, 6)
    for src, dst, kind in ((about, repo, "REFERENCES"), (about, pitfall, "RELATES_TO"),
                           (weaker, of_weaker, "RELATES_TO")):
        await store.graph.link({"memory_id": src, "target_node_id": dst, "relationship_type": kind})
    res = await store.recall.query({"query": QUERY, "expand_hops": 1})
    parts = {m.id: m.components for m in res.memories}
    of_statement, of_weak = parts[pitfall], parts[of_weaker]
    assert of_statement is not None and of_statement.graph > 0
    assert of_weak is not None and of_weak.graph == 0
    order = [m.id for m in res.memories]
    assert order.index(pitfall) < order.index(of_weaker)


async def test_an_entity_takes_neither_a_graph_term_nor_recency(
        planted_store: tuple[Store, PlantedEmbedder]) -> None:
    store, embedder = planted_store
    best = await save_at(store, embedder, "november best statement", 0.80, 2)
    named = await entity_at(store, embedder, "oscar-service", 0.50, 3)
    equal = await save_at(store, embedder, "papa as near as the name", 0.50, 4)
    await store.graph.link({"memory_id": best, "target_node_id": named,
                      "relationship_type": "REFERENCES"})
    res = await store.recall.query({"query": QUERY, "expand_hops": 1})
    parts = {m.id: m.components for m in res.memories}
    of_name, of_statement = parts[named], parts[equal]
    assert of_name is not None and of_name.graph == 0 and of_name.recency == 0
    assert of_statement is not None and of_statement.recency > 0
    order = [m.id for m in res.memories]
    # as near as the statement and linked to the best match, the name still ranks below it
    assert order[:3] == [best, equal, named]

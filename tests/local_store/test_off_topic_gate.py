"""syncd's off-topic gate: a query far from everything the store holds is not a match, however
high its best cosine (``local_store/domain.py``, ``recall.py``).

The fit is checked on vectors of known shape, and the gate through a real store holding the
eval corpus (bench/data/recall_corpus.json) with the real MiniLM model: a cooking question whose
best cosine (0.42) is above the cosine gate gets the fallback, while a paraphrase with no word
in common with its answer, and an exact identifier, still match.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from functools import cache
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from local_store import Store
from local_store.domain import FIT_ROWS, MIN_ROWS, fit_domain, sample_rows
from local_store.embed_minilm import MiniLMEmbedder
from local_store.recall import OFF_TOPIC_GATE, QUERY_COSINE_GATE, QUERY_COSINE_SURE
from local_store.vectors import VectorIndex
from protocol.rows import NodeRow
from protocol.timestamp import format_ns

CORPUS = Path(__file__).resolve().parents[2] / "bench/data/recall_corpus.json"
DIM = 384


def unit(rows: npt.NDArray[np.float64]) -> npt.NDArray[np.float32]:
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def topical(rng: np.random.Generator, n: int, basis: npt.NDArray[np.float64],
            ) -> npt.NDArray[np.float32]:
    """Unit vectors that vary along ``basis``'s 24 directions, around a shared one, plus a
    little noise everywhere: what a store's memories on a few subjects look like."""
    centre = np.zeros(DIM)
    centre[0] = 3.0
    mix = rng.standard_normal((n, len(basis))) @ basis
    return unit(centre + mix + 0.05 * rng.standard_normal((n, DIM)))


@pytest.fixture
def subject() -> npt.NDArray[np.float64]:
    basis = np.linalg.qr(np.random.default_rng(7).standard_normal((DIM, 24)))[0].T
    return basis


def test_unseen_vectors_of_the_subject_score_about_one_and_others_far_more(
        subject: npt.NDArray[np.float64]) -> None:
    rng = np.random.default_rng(1)
    store = topical(rng, 600, subject)
    domain = fit_domain(store[sample_rows(len(store))], len(store))
    assert domain is not None and domain.rows == 600
    unseen = [domain.strangeness(v) for v in topical(rng, 200, subject)]
    elsewhere = [domain.strangeness(v) for v in unit(rng.standard_normal((200, DIM)))]
    assert 0.8 < float(np.median(unseen)) < 1.2
    assert max(unseen) < OFF_TOPIC_GATE < min(elsewhere)


def test_no_fit_below_min_rows_or_from_non_finite_vectors(
        subject: npt.NDArray[np.float64]) -> None:
    rows = topical(np.random.default_rng(2), MIN_ROWS, subject)
    assert fit_domain(rows[: MIN_ROWS - 1], MIN_ROWS - 1) is None
    assert fit_domain(rows, MIN_ROWS) is not None
    poisoned = rows.copy()
    poisoned[0] = np.nan  # one NaN vector: dropped, which leaves too few here
    assert fit_domain(poisoned, MIN_ROWS) is None
    assert len(sample_rows(100_000)) == FIT_ROWS and len(sample_rows(50)) == 50


def test_index_fits_lazily_and_refits_after_growing_by_a_tenth(
        subject: npt.NDArray[np.float64]) -> None:
    rng = np.random.default_rng(3)
    index = VectorIndex("m", DIM)
    off = unit(rng.standard_normal((1, DIM)))[0]
    index.apply([(f"a{i}", v) for i, v in enumerate(topical(rng, MIN_ROWS - 1, subject))])
    assert index.strangeness(off) is None
    index.apply([("last", topical(rng, 1, subject)[0])])
    first = index.strangeness(off)
    assert first is not None and first > OFF_TOPIC_GATE
    fitted = index._domain
    index.apply([(f"b{i}", v) for i, v in enumerate(topical(rng, MIN_ROWS // 10, subject))])
    assert index.strangeness(off) == first and index._domain is fitted  # moved by exactly 10 %
    index.apply([("one more", topical(rng, 1, subject)[0])])
    index.strangeness(off)
    assert index._domain is not fitted and index._domain is not None
    assert index._domain.rows == len(index)


# ------------------------------------------------------------------ through a real store


@cache
def corpus_rows() -> tuple[list[tuple[str, str]], npt.NDArray[np.float32]]:
    corpus = json.loads(CORPUS.read_text())
    items = [(m["key"], m["content"]) for m in corpus["memories"]]
    return items, MiniLMEmbedder().embed([content for _, content in items])


@pytest.fixture(scope="module")
def embedded() -> tuple[list[tuple[str, str]], npt.NDArray[np.float32]]:
    return corpus_rows()  # embedded once, outside any event loop


@pytest.fixture
async def minilm_store(tmp_path: Path, embedded: tuple[list[tuple[str, str]],
                                                       npt.NDArray[np.float32]],
                       ) -> AsyncIterator[tuple[Store, dict[str, str]]]:
    items, vectors = embedded
    store = await Store.open(tmp_path / "data", embedder=MiniLMEmbedder())
    stamp = format_ns(1_780_000_000_000_000_000)
    ids = {key: f"memory:{uuid.uuid5(uuid.NAMESPACE_URL, key)}" for key, _ in items}
    nodes = [NodeRow(id=ids[key], labels="Memory", realm="r", memory_type="fact",
                     content=content, status="active", importance=0.5,
                     embedding=vector.tolist(), created_at=stamp, updated_at=stamp,
                     valid_at=stamp) for (key, content), vector in zip(items, vectors,
                                                                      strict=True)]
    result = await store.apply(nodes, [], model=store.embedder.model_id)
    assert result.applied_nodes == len(items) and not result.problems
    try:
        yield store, ids
    finally:
        await store.close()


async def test_an_off_topic_question_above_the_cosine_gate_gets_the_fallback(
        minilm_store: tuple[Store, dict[str, str]]) -> None:
    store, _ = minilm_store
    query = "chocolate chip cookies recipe without brown sugar"
    vector = (await asyncio.to_thread(store.embedder.embed, [query]))[0]
    best = float(store.index.similarities(vector).max())
    strangeness = await asyncio.to_thread(store.index.strangeness, vector)
    assert best >= QUERY_COSINE_GATE  # the cosine gate alone would call it a match
    assert strangeness is not None and strangeness >= OFF_TOPIC_GATE
    res = await store.recall({"query": query, "limit": 5})
    assert res.fallback is True and res.memories
    assert all(m.fallback for m in res.memories)


async def test_a_paraphrase_and_an_identifier_still_match(
        minilm_store: tuple[Store, dict[str, str]]) -> None:
    store, ids = minilm_store
    paraphrase = "how do we put a new version of the payments backend live?"
    vector = (await asyncio.to_thread(store.embedder.embed, [paraphrase]))[0]
    strangeness = await asyncio.to_thread(store.index.strangeness, vector)
    assert strangeness is not None and strangeness < OFF_TOPIC_GATE
    res = await store.recall({"query": paraphrase, "limit": 5})
    assert res.fallback is None
    got = [m.id for m in res.memories]
    assert {ids["billing-deploy"], ids["billing-continuous-delivery"]} & set(got[:3])
    # Every word found (a strict keyword hit) matches, however strange the vector: this
    # identifier's strangeness is above the gate and its best cosine below the cosine gate.
    identifier = "useDebouncedValue"
    vector = (await asyncio.to_thread(store.embedder.embed, [identifier]))[0]
    strangeness = await asyncio.to_thread(store.index.strangeness, vector)
    assert strangeness is not None and strangeness >= OFF_TOPIC_GATE
    res = await store.recall({"query": identifier, "limit": 5})
    assert res.fallback is None
    assert [m.id for m in res.memories][:1] == [ids["web-search-debounce"]]


async def test_a_short_query_with_a_high_cosine_matches_however_strange(
        minilm_store: tuple[Store, dict[str, str]]) -> None:
    """Short real queries sit near the off-topic threshold; a best cosine of QUERY_COSINE_SURE
    is a match whatever the strangeness. This one has no strict keyword hit either."""
    store, _ = minilm_store
    query = "what did we decide about currencies"
    vector = (await asyncio.to_thread(store.embedder.embed, [query]))[0]
    strangeness = await asyncio.to_thread(store.index.strangeness, vector)
    assert strangeness is not None and strangeness >= OFF_TOPIC_GATE
    assert float(store.index.similarities(vector).max()) >= QUERY_COSINE_SURE
    strict = await store._fetch("SELECT count(*) FROM memories_fts WHERE memories_fts MATCH "
                                "'\"decide\" AND \"currencies\"'")
    assert strict == [(0,)]
    res = await store.recall({"query": query, "limit": 5})
    assert res.fallback is None and res.memories
    assert not any(m.fallback for m in res.memories)

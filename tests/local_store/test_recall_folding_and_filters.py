"""Recall bugs found in review: folded keyword coverage, the superseded penalty at ``as_of``,
``dedupe_key`` in the fallback, literal realms, capped tag/realm filters, and plane mode's long
queries, semantic blend and Unicode lower-casing (contract §6.3–§6.5)."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from local_store import HashingEmbedder, Store, ValidationError
from local_store.ranking import PLANE_WORD_SEP, coverage, fold, plane_kw_score
from local_store.recall import MAX_REALMS
from local_store.records import MAX_TAGS
from protocol.rows import NodeRow
from protocol.timestamp import format_ns
from tests.conftest import FakeWall
from tests.local_store.test_recall import ids, mysql_then_postgres

STAMP = format_ns(1_780_000_000_000_000_000)


@pytest.mark.parametrize(("text", "folded"), [
    ("Crème Brûlée", "creme brulee"),
    ("CAFÉ", "cafe"),
    ("cafe\u0301", "cafe"),  # already decomposed
    ("Straße", "strasse"),  # case-folded, not only lower-cased
    ("ﬁle №5", "file no5"),  # compatibility forms
    ("Ärger über Zölle", "arger uber zolle"),
    ("plain ASCII Text", "plain ascii text"),
    ("日本語", "日本語"),
])
def test_fold_is_the_keyword_indexs_comparison(text: str, folded: str) -> None:
    assert fold(text) == folded


@pytest.mark.parametrize(("tokens", "text", "expected"), [
    (["creme", "brulee"], "Crème brûlée recipe", 1.0),
    (["cafe", "downstairs"], "from the café downstairs", 1.0),
    (["café"], "the CAFE is closed", 1.0),  # the query's accent folds too
    (["ärger"], "Ärger über Zölle", 1.0),
    (["deploy", "billing"], "Deploy the app", 0.5),  # ASCII: as before
    (["creme", "tart"], "Crème brûlée", 0.5),
])
def test_coverage_compares_words_folded(tokens: list[str], text: str, expected: float) -> None:
    assert coverage(tokens, text) == expected


async def test_diacritic_folded_keyword_match_is_not_a_fallback(store: Store) -> None:
    """FTS5 (remove_diacritics 2) finds "creme brulee" in "Crème brûlée": the match must score
    as one, not fall under the floor and come back as the fallback."""
    hit = await store.memories.save({"content": "Crème brûlée recipe from the café downstairs"})
    assert await ids(store, "creme brulee", mode="keyword") == [hit["node_id"]]
    res = await store.recall.query({"query": "creme brulee"})
    assert res.fallback is None
    assert [m.id for m in res.memories if not m.fallback] == [hit["node_id"]]
    assert res.memories[0].kw_score and res.memories[0].kw_score > 0


async def test_both_words_matched_with_an_accent_is_full_coverage(store: Store) -> None:
    await store.memories.save({"content": "Crème brûlée recipe from the café downstairs"})
    res = await store.recall.query({"query": "cafe downstairs"})
    assert res.memories[0].components is not None
    assert res.memories[0].components.keyword == pytest.approx(1.0)


async def test_memory_current_at_as_of_is_not_penalised(tmp_path: Path) -> None:
    """At an instant before it was superseded, a memory was current: no superseded penalty."""
    clock = FakeWall()
    store = await Store.open(tmp_path, wall=clock, embedder=HashingEmbedder())
    try:
        old, _, between = await mysql_then_postgres(store, clock)
        res = await store.recall.query({"query": "mysql billing", "as_of": between})
        assert [m.id for m in res.memories] == [old["node_id"]]
        assert res.memories[0].components is not None
        assert res.memories[0].components.penalty == 0.0
        now = await store.recall.query({"query": "mysql billing", "include_invalidated": True})
        by_id = {m.id: m for m in now.memories}
        assert by_id[old["node_id"]].components is not None
        assert by_id[old["node_id"]].components.penalty > 0  # without as_of: superseded
    finally:
        await store.close()


async def test_fallback_keeps_one_memory_per_dedupe_key(store: Store) -> None:
    a = await store.memories.save({"content": "never force push to main", "importance": 0.9})
    await store.memories.update_status(a["node_id"], "archived")  # so the second save is a new memory
    b = await store.memories.save({"content": "never force push to main", "importance": 0.9})
    assert b["node_id"] != a["node_id"]
    await store.memories.update_status(a["node_id"], "active")
    low = await store.memories.save({"content": "weekly standup is on tuesdays", "importance": 0.1})
    assert len(await ids(store, "never force push")) == 1  # a match collapses them
    res = await store.recall.query({"query": "qwzx plorf", "limit": 2})
    assert res.fallback is True
    got = [m.id for m in res.memories]
    assert len(got) == 2 and got[1] == low["node_id"], got  # limit filled past the duplicate
    assert got[0] in (a["node_id"], b["node_id"])


async def test_an_empty_realm_name_matches_no_realm(store: Store) -> None:
    """``realms: []`` is every realm; ``[""]`` is ``realm IN ('')``: nothing (a blank realm is
    saved as ``default``), neither as a match nor as the fallback."""
    await store.memories.save({"content": "deploy billing with make release", "realm": "p"})
    await store.memories.save({"content": "deploy billing with helm", "realm": ""})
    res = await store.recall.query({"query": "deploy billing", "realms": [""]})
    assert res.memories == []
    assert len(await ids(store, "deploy billing", realms=[])) == 2
    assert len(await ids(store, "deploy billing", realms=["", "default"])) == 1


async def test_more_tag_or_realm_filters_than_a_memory_can_hold_are_refused(
        store: Store) -> None:
    await store.memories.save({"content": "deploy billing with make release", "tags": ["t1"]})
    for name, cap in (("tags", MAX_TAGS), ("realms", MAX_REALMS)):
        values = [f"t{i}" for i in range(1000)]
        with pytest.raises(ValidationError) as exc:
            await store.recall.query({"query": "deploy billing", name: values})
        assert exc.value.field == name
        values[0] = "t1"
        res = await store.recall.query({"query": "deploy billing", name: values[:cap]})
        assert isinstance(res.took_ms, int)


@pytest.mark.parametrize("query", [
    " ".join(f"w{i}x" for i in range(1500)),  # ~10 kB of distinct words
    " ".join(f"w{i}" for i in range(1200)) + " deploy",
])
async def test_plane_mode_query_of_many_distinct_words_never_errors(store: Store,
                                                                   query: str) -> None:
    await store.memories.save({"content": "deploy billing with make release"})
    res = await store.recall.query({"query": query}, mode="plane")
    assert isinstance(res.took_ms, int)
    assert res.memories  # the plane has no floor: the semantic leg still answers


async def test_plane_semantic_leg_ranks_every_row_by_the_blend(store: Store) -> None:
    """The plane ranks all filtered rows by ``0.7·cos + 0.3·importance`` (LIMIT 50): a memory of
    importance 1.0 and key 0.65, beyond the 100 nearest, still beats fillers of key ≤ 0.63."""
    emb = HashingEmbedder()
    q = np.asarray(emb.embed(["alpha beta gamma"])[0], dtype=np.float64)
    rng = np.random.default_rng(1)

    def vec(c: float) -> list[float]:
        r = rng.standard_normal(q.shape[0])
        r -= (r @ q) * q
        r /= np.linalg.norm(r)
        return [float(x) for x in c * q + np.sqrt(1 - c * c) * r]

    rows = [NodeRow(id=f"memory:n{i:03d}", content=f"filler {i}", importance=0.0,
                    updated_at=STAMP, created_at=STAMP, embedding=vec(0.9 - i * 0.0005))
            for i in range(150)]
    rows.append(NodeRow(id="memory:x", content="important", importance=1.0,
                        updated_at=STAMP, created_at=STAMP, embedding=vec(0.5)))
    await store.replication.apply(rows, [], model=emb.model_id)
    res = await store.recall.query({"query": "alpha beta gamma", "limit": 100, "expand_hops": 0},
                             mode="plane")
    by_id = {m.id: m for m in res.memories}
    assert "memory:x" in by_id
    assert by_id["memory:x"].distance == pytest.approx(0.5, abs=1e-3)


async def test_plane_keyword_leg_lowercases_unicode_like_the_plane(store: Store) -> None:
    hit = await store.memories.save({"content": "Ärger über Zölle"})
    res = await store.recall.query({"query": "ärger zölle", "expand_hops": 0}, mode="plane")
    by_id = {m.id: m for m in res.memories}
    assert by_id[hit["node_id"]].kw_score == 2.0


def test_plane_kw_score_counts_as_the_sql_it_replaced_on_ascii_text() -> None:
    """On ASCII text, the Python count equals the former SQL (``lower(x) LIKE '%t%'`` per
    column, one term per token)."""
    rnd = random.Random(7)
    vocab = ["de", "deploy", "ploy", "billing", "bill", "x", "ci", "cd", "Release", "REL"]
    conn = sqlite3.connect(":memory:")
    for _ in range(300):
        content = " ".join(rnd.choices(vocab, k=rnd.randint(0, 6)))
        title = rnd.choice([None, "", " ".join(rnd.choices(vocab, k=2))])
        tags = ",".join(rnd.sample(vocab, rnd.randint(0, 2)))
        tokens = list(dict.fromkeys(t.lower() for t in rnd.sample(vocab, rnd.randint(1, 4))))
        terms = " + ".join(
            "(CASE WHEN lower(?) LIKE ? OR lower(coalesce(?, '')) LIKE ? OR lower(?) LIKE ? "
            "THEN 1 ELSE 0 END)" for _ in tokens)
        params: list[object] = []
        for t in tokens:
            params += [content, f"%{t}%", title, f"%{t}%", tags, f"%{t}%"]
        (expected,) = conn.execute(f"SELECT {terms}", params).fetchone()
        got = plane_kw_score(content, title, tags, PLANE_WORD_SEP.join(tokens))
        assert got == expected, (content, title, tags, tokens)

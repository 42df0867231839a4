"""Recall's shortcuts answer exactly what the straightforward computation answers.

``Straightforward`` is recall without them: the semantic leg reads the rows of all 2×50 nearest
memories picked by ``np.argpartition`` (and of every wider sample; in plane mode, of every
memory, as the plane ranks them all), and the keyword leg lets FTS5 rank its hits (``ORDER BY
rank``). On a random store built to hit every shortcut's edge —
duplicate vectors (tied cosines), few distinct words (tied BM25 scores at the cut), filters that
drop most rows, nonsense queries, edges — both must give the same response to every request.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from local_store import HashingEmbedder, Store, db
from local_store.ranking import Candidate
from local_store.reader import RowMemo, SyncReader
from local_store.recall import (
    CAND_K,
    FIRST_SAMPLE,
    FTS_SQL,
    OVERSAMPLE,
    ROW_COLUMNS,
    ROW_SQL,
    Filters,
    Mode,
    Recall,
    Semantic,
)
from protocol.query import QueryRequest, QueryResponse
from protocol.rows import EdgeRow, NodeRow
from protocol.timestamp import format_ns

NOW = 1_780_000_000_000_000_000
DAY = 86_400 * 1_000_000_000
WORDS = [f"w{i}" for i in range(40)]  # few words: many hits, many equal BM25 scores
ZIPF = [1.0 / (i + 1) for i in range(len(WORDS))]


class Straightforward(Recall):
    def _semantic_leg(self, filters: Filters, cands: dict[str, Candidate],
                      ranking: Callable[..., Any]) -> Semantic | None:
        semantic = self._semantic
        if semantic is None or not semantic.ids:
            return None
        plane = ranking == self._plane_blend  # else the nearest by cosine
        where, params = filters.sql()
        sims, every = semantic.sims, semantic.ids
        # The plane ranks every row that passes the filters by its blend (contract §6.4).
        want = len(every) if plane else min(len(every), CAND_K * FIRST_SAMPLE)
        while True:
            top = np.argpartition(-sims, want - 1)[:want] if want < len(every) else np.arange(
                len(every))
            cos = {every[i]: float(sims[i]) for i in top}
            allowed = self._rows_for(list(cos), where, params)
            if len(allowed) >= CAND_K or want >= len(every):
                break
            want = min(len(every), want * OVERSAMPLE)
        if plane:
            key = {mid: 0.7 * cos[mid] + 0.3 * row["importance"] for mid, row in allowed.items()}
        else:
            key = {mid: cos[mid] for mid in allowed}
        for rank, mid in enumerate(sorted(key, key=lambda mid: (-key[mid], mid))[:CAND_K]):
            cand = cands.setdefault(mid, Candidate(mid))
            cand.vec_rank, cand.cosine, cand.row = rank, cos[mid], allowed[mid]
        return semantic  # syncd then gives the other keyword hits their cosines, as recall does

    def _fts_rows(self, match: str, where: str,
                  params: list[object]) -> list[tuple[float, dict[str, Any]]]:
        inner = CAND_K * 4
        while True:
            hits = self._fetch(f"{FTS_SQL} ORDER BY rank LIMIT ?", [match, inner])
            score = {int(r[0]): float(r[1]) for r in hits}
            found = self._fetch(
                f"SELECT m.rowid, m.content, {ROW_SQL} FROM memories m WHERE {where} "
                f"AND m.rowid IN ({','.join('?' * len(score))})", [*params, *score])
            found.sort(key=lambda r: (-score[r[0]], r[2]))
            rows = []
            for r in found[:CAND_K]:
                row = dict(zip(ROW_COLUMNS, r[2:], strict=True))
                row["content"] = r[1]
                rows.append((score[r[0]], row))
            if len(rows) >= CAND_K or len(hits) < inner or inner >= 1 << 20:
                return rows
            inner *= 8


async def fill(store: Store, rng: random.Random, n: int) -> np.ndarray:
    dim = store.embedder.dim
    vectors = np.random.default_rng(3).standard_normal((n, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    for i in rng.sample(range(1, n), n // 20):  # exact duplicates: tied cosines
        vectors[i] = vectors[rng.randrange(i)]
    nodes, ids = [], [f"memory:{i:05d}" for i in range(n)]
    for i, mid in enumerate(ids):
        stamp = format_ns(NOW - rng.randint(0, 60) * DAY - i)
        nodes.append(NodeRow(
            id=mid, realm=rng.choice(["a", "b", "c"]), memory_type=rng.choice(["fact", "decision"]),
            content=" ".join(rng.choices(WORDS, weights=ZIPF, k=rng.randint(3, 12))),
            tags=",".join(rng.sample(["x", "y", "z"], 1)), importance=rng.random(),
            status="archived" if rng.random() < 0.05 else "active",
            invalid_at=stamp if rng.random() < 0.1 else None,
            embedding=vectors[i].tolist(), created_at=stamp, updated_at=stamp))
    edges = [EdgeRow(src=rng.choice(ids), dst=rng.choice([*rng.sample(ids, 3), "trace:1"]),
                     type="RELATES", created_at=format_ns(NOW)) for _ in range(n // 2)]
    result = await store.replication.apply(nodes, edges, model=store.embedder.model_id)
    assert not result.problems
    return vectors


def requests(rng: random.Random, vectors: np.ndarray, n: int) -> list[tuple[dict[str, Any], Any]]:
    out = []
    for i in range(n):
        query = " ".join(rng.sample(WORDS[:12] if i % 3 else WORDS, rng.randint(1, 3)))
        near = vectors[rng.randrange(len(vectors))]
        noise = np.random.default_rng(i).standard_normal(len(near)).astype(np.float32)
        vector = near + rng.choice([0.3, 1.4, 4.0, 100.0]) * noise / np.linalg.norm(noise)
        request: dict[str, Any] = {"query": query, "limit": rng.choice([5, 20, 100])}
        request.update(rng.choice([
            {}, {"realms": ["a"]}, {"memory_type": "decision", "tags": ["x"]},
            {"importance_min": 0.97}, {"include_invalidated": True, "expand_hops": 2},
            {"realms": ["b", "c"], "expand_hops": 0}]))
        out.append((request, vector / np.linalg.norm(vector)))
    return out


def run(recall: Recall, request: dict[str, Any], mode: Mode) -> QueryResponse:
    response = recall.run(msgspec.convert(request, QueryRequest), mode)
    return msgspec.structs.replace(response, took_ms=0)


async def test_shortcuts_answer_as_the_straightforward_computation(tmp_path: Path) -> None:
    rng = random.Random(5)
    store = await Store.open(tmp_path, embedder=HashingEmbedder())
    reader = SyncReader(tmp_path / db.DB_FILENAME)
    memo = RowMemo(reader.fetch)  # warm across requests of every filter and mode
    statements: Counter[str] = Counter()

    def fetch(sql: str, params: Any) -> list[Any]:
        statements["ranked by FTS5" if "ORDER BY rank" in sql else "other"] += 1
        return reader.fetch(sql, params)

    def compare(cases: list[tuple[dict[str, Any], Any]]) -> int:
        compared = 0
        for request, vector in cases:
            semantic = Semantic(*store.index.snapshot(vector), vector=vector,
                                index=store.index)
            for mode in ("syncd", "plane", "vector", "keyword"):
                fast = run(Recall(fetch, semantic, store.settings.current, lambda: NOW), request, mode)
                ranked = statements["ranked by FTS5"]
                slow = run(Straightforward(reader.fetch, semantic, store.settings.current, lambda: NOW),
                           request, mode)
                assert fast == slow, (request, mode)
                remembered = run(Recall(reader.fetch, semantic, store.settings.current, lambda: NOW,
                                        memo=memo), request, mode)
                assert remembered == slow, ("memo", request, mode)
                statements["ranked by FTS5"] = ranked  # count the fast path's fallbacks only
                compared += bool(slow.memories)
        return compared

    try:
        vectors = await fill(store, rng, 3000)
        cases = requests(rng, vectors, 60)
        compared = await asyncio.get_running_loop().run_in_executor(reader.pool, compare, cases)
    finally:
        await reader.close()
        await store.close()
    assert compared > 150  # most answers are not empty
    assert statements["ranked by FTS5"] > 0  # ties at the keyword cut did occur
    assert memo.held > 0

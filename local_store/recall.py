"""Hybrid recall over the local store: the control plane's algorithm (contract §6), and syncd's.

Pipeline (both modes): filters → semantic leg (exact cosine over the in-RAM index, 50) and
keyword leg (50) → candidate map with 0-based ranks → graph expansion from the top 10 seeds
(1–2 hops, proximity 1/(1+hops)) → blend → sort → truncate → ``context``. The legs, and the
filters and rows they read, are in ``recall_legs.py``; each mode is one path through them
(``Recall._syncd``, ``_plane``, ``_keyword_only``, ``_vector_only``), chosen once per request.

Where ``syncd`` mode departs from ``plane`` mode (each is listed in docs/recall.md):
  * keyword leg on FTS5/BM25 with quoted tokens (strict AND, relaxed to OR without stopwords
    when AND finds nothing), instead of substring counting;
  * semantic leg ranked by cosine alone (the plane mixes in importance), and candidates must
    clear a relevance floor; a keyword hit beyond the semantic leg's 50 still gets its cosine;
  * graph expansion dedupes edges by id, skips tombstones, orders edges deterministically, and
    applies the realm/status/validity filters to what it pulls in (the plane leaks archived,
    invalidated and other-realm memories through the graph);
  * superseded memories are penalised; one memory per ``dedupe_key``;
  * two tiers: every memory returned says whether it is ``confident`` (below), and
    ``confident_only`` returns only those; when no candidate clears the floor, the most
    important recent memories come back marked ``fallback``.

``plane`` mode departs from the plane in one way: its keyword leg counts a query's first
``PLANE_MAX_TOKENS`` distinct tokens, not all of them (a pasted log would take seconds).

``keyword`` and ``vector`` are single-leg baselines for the eval: no graph, ranked by the leg's
own relevance (normalised BM25 × coverage, or cosine).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from local_store.db import marks
from local_store.ranking import (
    Candidate,
    Weights,
    build_context,
    cosine_distance,
    dedupe_linked,
    order,
    recency,
    score_plane,
    score_syncd,
    specific_words,
    stamp_ns,
    tokenize,
)
from local_store.reader import RowMemo
from local_store.recall_legs import (
    CAND_K,
    FIRST_SAMPLE,
    FTS_SQL,
    MAX_REALMS,
    OVERSAMPLE,
    ROW_COLUMNS,
    ROW_SQL,
    Fetch,
    Filters,
    Legs,
    Semantic,
    add_keyword_hits,
    filters_from,
)
from local_store.records import is_placeholder
from local_store.reference import generic_words
from protocol.query import (
    Linked,
    QueryRequest,
    QueryResponse,
    RetrievedMemory,
    ScoreComponents,
    Via,
)
from protocol.settings import MemorySettings

# The names other modules and tests read from here, wherever they are defined.
__all__ = ["CAND_K", "FIRST_SAMPLE", "FTS_SQL", "MAX_REALMS", "OVERSAMPLE", "ROW_COLUMNS",
           "ROW_SQL", "Fetch", "Filters", "Mode", "Recall", "Semantic", "filters_from",
           "weights_from"]

Mode = Literal["syncd", "plane", "keyword", "vector"]

SEED_N = 10
EXPAND_CAP = 200
MAX_HOPS = 2
MAX_SUCCESSIONS = 8  # syncd: how far a chain of supersessions is followed into the answer
# syncd answers in two tiers. Explicit search returns every candidate whose relevance reaches
# CANDIDATE_FLOOR, ranked (the most important recent memories, marked ``fallback``, only when
# none does). Each memory it returns is ``confident`` when it has evidence of its own that it
# answers the query, judged against fixed generic text (``reference.py``), never against the
# store's other memories, so a store's composition cannot change it:
#   * semantic: the query is nearer the memory than the memory is to any generic text, and
#     nearer than the query is to any small talk, everyday text, joke or nonsense;
#   * keyword: the memory holds every word of the query (a strict hit), one of them a word too
#     rare to be common English (an identifier, a product's name: ``generic_words``);
#   * both: a strict hit the query is nearer than it is to any small talk, everyday text, joke
#     or nonsense — its words name the topic, and its meaning says it is no chat that happens
#     to use them ("how do we deploy this project?" of "the project deploys with make ship").
# A placeholder (an entity named by an edge before it was noted) and a memory only the graph
# reached are never confident. What is injected unasked — the prompt hook, ``memoryContext``,
# ``verify_memory`` — takes confident memories only (``QueryRequest.confident_only``).
CANDIDATE_FLOOR = 0.15

# The graph's edge query per mode: syncd skips tombstones and orders edges by id; the plane
# does neither. The plane hydrates what the graph pulled in by deletion and validity only.
SYNCD_EDGES = " AND deleted = 0", " ORDER BY id"
PLANE_EDGES = "", ""
PLANE_GRAPH_ROWS = "m.deleted = 0 AND m.invalid_at IS NULL"

# How one mode scores a candidate: (candidate, weights, recency, importance) → score.
Scorer = Callable[[Candidate, Weights, float, float], float]


def weights_from(s: MemorySettings) -> Weights:
    return Weights(w_rrf=s.w_rrf, w_semantic=s.w_semantic, w_keyword=s.w_keyword,
                   w_graph=s.w_graph, w_importance=s.w_importance, w_recency=s.w_recency,
                   rrf_k=s.rrf_k, half_life_days=s.half_life_days)


@dataclass(frozen=True, slots=True)
class Query:
    """One request as every mode reads it: ``hops`` is 0 when the graph is gated."""

    request: QueryRequest
    filters: Filters
    tokens: list[str]
    limit: int
    hops: int


@dataclass(slots=True)
class Answer:
    """What one mode found: ``ranked`` best first (the first ``limit`` are returned)."""

    ranked: list[Candidate]
    linked: list[Linked] = field(default_factory=list)
    confident: set[str] = field(default_factory=set)
    fallback: bool = False
    matched: bool | None = None


class Recall(Legs):
    """One recall request: synchronous, run on the store's reader thread in one hop (all its
    SQL and scoring). The query's similarities come ready, or as a future computed on another
    thread meanwhile, awaited only when the semantic leg needs them."""

    def __init__(self, fetch: Fetch, semantic: Semantic | Future[Semantic | None] | None,
                 settings: MemorySettings, now_ns: Callable[[], int] = time.time_ns,
                 memo: RowMemo | None = None) -> None:
        super().__init__(fetch, semantic, memo)
        self._settings = settings
        self._now_ns = now_ns

    def run(self, request: QueryRequest, mode: Mode = "syncd", graph_allowed: bool = True,
            started: float | None = None) -> QueryResponse:
        started = time.perf_counter() if started is None else started
        path = {"syncd": self._syncd, "plane": self._plane, "keyword": self._keyword_only,
                "vector": self._vector_only}[mode]
        s = self._settings
        limit = min(100, max(1, request.limit if request.limit is not None else s.default_limit))
        hops = min(MAX_HOPS, request.expand_hops if request.expand_hops is not None
                   else s.default_expand_hops)
        query = Query(request, filters_from(request), tokenize(request.query), limit,
                      hops if graph_allowed else 0)
        if self._memo is not None:
            self._memo.fresh()
        answer = path(query)
        memories = [_retrieved(c, answer.fallback, c.id in answer.confident)
                    for c in answer.ranked[:limit]]
        linked = dedupe_linked(answer.linked)
        took = int((time.perf_counter() - started) * 1000)
        return QueryResponse(memories=memories, linked=linked,
                             context=build_context(memories, linked, answer.fallback,
                                                   answer.matched),
                             took_ms=took, fallback=True if answer.fallback else None,
                             matched=answer.matched)

    # ------------------------------------------------------------------ one path per mode

    def _syncd(self, q: Query) -> Answer:
        """syncd's ranking and its two tiers (the module docstring's departures)."""
        cands: dict[str, Candidate] = {}
        strict_hit = False
        # The keyword leg goes first: its hits tell the semantic leg which rows it may skip.
        if q.tokens:
            hits, strict_hit = self._fts_keyword(q.tokens, *q.filters.sql())
            add_keyword_hits(cands, hits)
        nearest = functools.partial(self._nearest_allowed, matter=_can_matter)
        semantic = self._semantic_leg(q.filters, cands, nearest)
        if semantic is not None:  # a keyword hit further out still has a cosine: its relevance
            _cosine_of_the_rest(semantic, cands)
        self._hydrate(cands)
        cands = {k: c for k, c in cands.items() if _relevance(c) >= CANDIDATE_FLOOR}
        self._add_successors(cands, q.filters)
        linked = (self._expand(cands, q, SyncdGraph(self, cands, q.filters))
                  if q.hops >= 1 and cands else [])
        as_of = q.filters.as_of

        def score(c: Candidate, w: Weights, rec: float, importance: float) -> float:
            return score_syncd(c, w, rec, importance, _superseded(c.row or {}, as_of))

        ranked = _successors_first(_one_per_key(self._ranked(cands.values(), score)), as_of)
        confident = self._confident(ranked[:q.limit], q.tokens, strict_hit)
        fallback = False
        if q.request.confident_only:
            ranked = [c for c in ranked if c.id in confident]
            linked = linked if ranked else []
        elif not ranked:
            ranked = self._fallback(q.filters, q.limit)
            fallback = bool(ranked)
        return Answer(ranked, linked, confident, fallback, matched=bool(confident))

    def _plane(self, q: Query) -> Answer:
        """The control plane's algorithm (contract §6), with the one departure above."""
        cands: dict[str, Candidate] = {}
        if q.tokens:
            add_keyword_hits(cands, self._plane_keyword(q.tokens, *q.filters.sql()))
        self._semantic_leg(q.filters, cands, self._plane_blend)
        self._hydrate(cands)
        linked = self._expand(cands, q, PlaneGraph(self)) if q.hops >= 1 and cands else []
        n_tokens = len(q.tokens)

        def score(c: Candidate, w: Weights, rec: float, importance: float) -> float:
            return score_plane(c, w, n_tokens, rec, importance)

        return Answer(self._ranked(cands.values(), score), linked)

    def _keyword_only(self, q: Query) -> Answer:
        """The keyword baseline: syncd's keyword leg alone, ranked by its own relevance."""
        cands: dict[str, Candidate] = {}
        if q.tokens:
            add_keyword_hits(cands, self._fts_keyword(q.tokens, *q.filters.sql())[0])
        self._hydrate(cands)
        return Answer(self._ranked(cands.values(), _baseline(len(q.tokens), lambda c: c.kw_raw)))

    def _vector_only(self, q: Query) -> Answer:
        """The vector baseline: the nearest allowed memories alone, ranked by cosine."""
        cands: dict[str, Candidate] = {}
        nearest = functools.partial(self._nearest_allowed, matter=_all_of)
        self._semantic_leg(q.filters, cands, nearest)
        self._hydrate(cands)
        return Answer(self._ranked(cands.values(), _baseline(len(q.tokens), lambda c: c.cosine)))

    # ------------------------------------------------------------------ syncd's steps

    def _confident(self, ranked: list[Candidate], tokens: list[str],
                   strict_hit: bool) -> set[str]:
        """The ids of ``ranked`` with evidence of their own that they answer the query (the
        two tiers, above), among ``ranked`` (syncd's answer, best first, as far as it is
        returned)."""
        direct = [c for c in ranked if (c.vec_rank is not None or c.kw_rank is not None)
                  and not is_placeholder((c.row or {}).get("tags"))]
        specific = strict_hit and bool(specific_words(tokens, generic_words()))
        confident = {c.id for c in direct if specific and c.kw_rank is not None}
        semantic = self._semantic if any(c.cosine is not None for c in direct) else None
        prompt_side = None if semantic is None else semantic.off_topic()
        if semantic is None or prompt_side is None:
            return confident
        # The prompt's side first (one product): only memories nearer than it go on to the
        # memory's side, a product each.
        near = {c.id: c.cosine for c in direct if c.cosine is not None and c.cosine > prompt_side}
        if strict_hit:  # by words and meaning: it holds every word, and it is no small talk
            confident.update(c.id for c in direct if c.id in near and c.kw_rank is not None)
        generic = semantic.generic(list(near))
        confident.update(mid for mid, cosine in near.items()
                         if mid in generic and cosine > generic[mid])
        return confident

    def _add_successors(self, cands: dict[str, Candidate], filters: Filters) -> None:
        """syncd: the memory that superseded a candidate joins the answer when the filters let
        it (a chain: each in turn), with its own cosine, so ``_successors_first`` can put what
        is true now before what a question matched in the past."""
        for _ in range(MAX_SUCCESSIONS):
            wanted = {s for c in cands.values()
                      if (s := (c.row or {}).get("superseded_by")) and s not in cands
                      and _superseded(c.row or {}, filters.as_of)}
            if not wanted:
                return
            found = {mid: Candidate(mid) for mid in wanted}
            self._hydrate(found, *filters.sql(for_graph=True))
            found = {mid: c for mid, c in found.items() if c.row is not None}
            if not found:
                return
            semantic = self._semantic
            if semantic is not None:
                for mid, cosine in semantic.cosines(list(found)).items():
                    found[mid].cosine = cosine
            cands.update(found)

    def _fallback(self, filters: Filters, limit: int) -> list[Candidate]:
        """The most important recent memories, one per ``dedupe_key`` like every syncd answer:
        read more rows while collapsing leaves fewer than ``limit``."""
        where, params = filters.sql()
        want = limit
        while True:
            rows = self._fetch(
                f"SELECT {ROW_SQL} FROM memories m WHERE {where} "
                f"ORDER BY m.importance DESC, m.created_at DESC, m.id LIMIT ?", [*params, want])
            out = []
            for r in rows:
                c = Candidate(r[0], row=dict(zip(ROW_COLUMNS, r, strict=True)))
                assert c.row is not None
                c.parts = {"rrf": 0.0, "semantic": 0.0, "keyword": 0.0, "graph": 0.0,
                           "importance": float(c.row["importance"] or 0.0), "recency": 0.0,
                           "penalty": 0.0}
                out.append(c)
            kept = _one_per_key(out)
            if len(kept) >= limit or len(rows) < want:
                return kept[:limit]
            want *= OVERSAMPLE

    # ------------------------------------------------------------------ graph, scores

    def _expand(self, cands: dict[str, Candidate], q: Query, rules: GraphRules) -> list[Linked]:
        """Walk ``q.hops`` hops of edges out from the seeds: non-memory neighbours are listed
        (``linked``); a memory neighbour the mode's ``rules`` let meet its seed joins the
        candidates, and the next hop's frontier, when it is not one already."""
        frontier = {c.id: c.id for c in _seeds(cands)}  # node → the seed it came from
        linked: list[Linked] = []
        added: dict[str, Candidate] = {}
        for depth in range(1, q.hops + 1):
            if not frontier:
                break
            next_frontier: dict[str, str] = {}
            for eid, src, dst, etype, _realm, namespace in self._edges(frontier, q.filters,
                                                                       rules.edges):
                if not rules.fresh(eid):
                    continue
                for near, far in ((src, dst), (dst, src)):
                    if near not in frontier:
                        continue
                    seed = frontier[near]
                    if not far.startswith("memory:"):
                        linked.append(Linked(node_id=far, target_namespace=namespace,
                                             edge_type=etype, depth=depth))
                    elif rules.meets(seed, far, depth) and far not in cands and far not in added:
                        added[far] = _pulled(far, seed, etype, depth, _relevance(cands[seed]))
                        next_frontier[far] = seed
                if len(cands) + len(added) > 200 or len(linked) > q.limit * 20:
                    break
            frontier = rules.onward(next_frontier, added)
        cands.update(rules.joined(added))
        return linked

    def _edges(self, frontier: dict[str, str], filters: Filters,
               rules: tuple[str, str]) -> list[Any]:
        """Up to EXPAND_CAP edges (id, src, dst, type, realm, namespace) touching the
        frontier in the request's realms; ``rules``: the mode's (extra predicate, order)."""
        live, ordered = rules
        nodes = list(frontier)
        params: list[object] = [*nodes, *nodes]
        sql = (f"SELECT id, src, dst, type, realm, target_namespace FROM edges "
               f"WHERE (src IN ({marks(nodes)}) OR dst IN ({marks(nodes)})){live}")
        if filters.realms:
            sql += f" AND realm IN ({marks(filters.realms)})"
            params.extend(filters.realms)
        return self._fetch(f"{sql}{ordered} LIMIT {EXPAND_CAP}", params)

    def _ranked(self, cands: Iterable[Candidate], score: Scorer) -> list[Candidate]:
        """``cands`` scored by the mode's ``score``, best first (``ranking.order``)."""
        w = weights_from(self._settings)
        now = self._now_ns()
        out = []
        for c in cands:
            row = c.row or {}
            importance = float(row.get("importance") or 0.0)
            rec = recency(stamp_ns(row.get("created_at")), now, w.half_life_days) if row else 0.5
            c.score = score(c, w, rec, importance)
            out.append(c)
        return order(out)


class GraphRules(Protocol):
    """How one mode walks the graph (``Recall._expand``)."""

    edges: tuple[str, str]  # the edge query's extra predicate and order (``Recall._edges``)

    def fresh(self, edge_id: str) -> bool:
        """Whether this edge is walked (not one walked already)."""

    def meets(self, seed: str, far: str, depth: int) -> bool:
        """Whether memory ``far``, ``depth`` hops from ``seed``, counts as its neighbour."""

    def onward(self, reached: dict[str, str], added: dict[str, Candidate]) -> dict[str, str]:
        """The next hop's frontier (node → seed) from the memories this hop ``reached``."""

    def joined(self, added: dict[str, Candidate]) -> dict[str, Candidate]:
        """Which memories the walk pulled in join the candidates."""


class SyncdGraph:
    """syncd's graph: only the best matches' memory neighbours count (``_best_matches``), also a
    direct match's (it takes the graph term too); tombstones are skipped, edges ordered by id
    and walked once; the realm/status/validity filters apply to the memories pulled in, each
    hop's before the next is walked from them (a hidden memory is no bridge)."""

    edges = SYNCD_EDGES

    def __init__(self, recall: Recall, cands: dict[str, Candidate], filters: Filters) -> None:
        self._recall, self._cands = recall, cands
        self._best = _best_matches(_seeds(cands))
        self._rows = filters.sql(for_graph=True)
        self._seen: set[str] = set()

    def fresh(self, edge_id: str) -> bool:
        if edge_id in self._seen:
            return False
        self._seen.add(edge_id)
        return True

    def meets(self, seed: str, far: str, depth: int) -> bool:
        if seed not in self._best:
            return False
        if far in self._cands and far != seed:
            _also_linked(self._cands[far], 1.0 / (1 + depth), _relevance(self._cands[seed]))
        return True

    def onward(self, reached: dict[str, str], added: dict[str, Candidate]) -> dict[str, str]:
        rows = {mid: added[mid] for mid in reached}
        self._recall._hydrate(rows, *self._rows)
        return {mid: seed for mid, seed in reached.items() if rows[mid].row is not None}

    def joined(self, added: dict[str, Candidate]) -> dict[str, Candidate]:
        return {mid: cand for mid, cand in added.items() if cand.row is not None}


class PlaneGraph:
    """The plane's graph (contract §6): every seed's neighbours, through tombstoned and
    repeated edges too, all hydrated at the end by deletion and validity only."""

    edges = PLANE_EDGES

    def __init__(self, recall: Recall) -> None:
        self._recall = recall

    def fresh(self, edge_id: str) -> bool:
        return True

    def meets(self, seed: str, far: str, depth: int) -> bool:
        return True

    def onward(self, reached: dict[str, str], added: dict[str, Candidate]) -> dict[str, str]:
        return reached

    def joined(self, added: dict[str, Candidate]) -> dict[str, Candidate]:
        self._recall._hydrate(added, PLANE_GRAPH_ROWS)
        return added


def _baseline(n_tokens: int, relevance: Callable[[Candidate], float | None]) -> Scorer:
    """A single-leg baseline's score: the leg's own ``relevance`` (its components are the
    plane's terms)."""
    def score(c: Candidate, w: Weights, rec: float, importance: float) -> float:
        score_plane(c, w, n_tokens, rec, importance)
        return relevance(c) or 0.0
    return score


def _seeds(cands: dict[str, Candidate]) -> list[Candidate]:
    """The graph's seeds: the SEED_N best ranked candidates (ties by id)."""
    return sorted(cands.values(), key=lambda c: (c.best_rank, c.id))[:SEED_N]


def _pulled(mid: str, seed: str, etype: str, depth: int, seed_relevance: float) -> Candidate:
    """A memory the graph reached from ``seed`` at ``depth`` hops."""
    cand = Candidate(mid, graph_proximity=1.0 / (1 + depth), via=(seed, etype, depth))
    cand.seed_relevance = seed_relevance
    return cand


def _all_of(nearest: list[str], cos: dict[str, float], keyword_hits: set[str]) -> int:
    """vector: every one of ``nearest`` can change the answer."""
    return len(nearest)


def _one_per_key(ranked: list[Candidate]) -> list[Candidate]:
    """One memory per ``dedupe_key`` (the first in ``ranked``, best first); memories without a
    key are all kept."""
    kept, keys = [], set()
    for c in ranked:
        key = (c.row or {}).get("dedupe_key")
        if key is not None:
            if key in keys:
                continue
            keys.add(key)
        kept.append(c)
    return kept


def _best_matches(seeds: Sequence[Candidate]) -> frozenset[str]:
    """syncd: the seeds whose links count — the one with the highest relevance (ties by best
    rank, then id) and, when that one is an entity, the best statement too. A memory linked to
    the memory that best answers the query is likely about the same thing (its pitfall, its
    follow-up decision); one linked to the fifth-best match is a guess about a guess, and as a
    graph term of its own it lifted the neighbours of weak matches over the nearest memory of
    paraphrased questions. An entity is a name: what hangs off it is about the thing named, and
    what hangs off the best statement about it is too (a question naming a repository wants the
    pitfalls linked to what the store says of it). A placeholder (a name an edge mentioned
    before it was noted) answers nothing itself, so it is a best match only when every seed is
    one."""
    real = [c for c in seeds if not is_placeholder((c.row or {}).get("tags"))] or list(seeds)
    best = min(real, key=_by_relevance)
    if not _is_entity(best):
        return frozenset((best.id,))
    statements = [c for c in real if not _is_entity(c)]
    return frozenset((best.id, min(statements, key=_by_relevance).id) if statements
                     else (best.id,))


def _by_relevance(c: Candidate) -> tuple[float, int, str]:
    return (-_relevance(c), c.best_rank, c.id)


def _is_entity(c: Candidate) -> bool:
    return (c.row or {}).get("memory_type") == "entity"


def _successors_first(ranked: list[Candidate], as_of: str | None) -> list[Candidate]:
    """syncd: a superseded memory never ranks above the memory that superseded it when both
    are in the answer — the newer one says what is true now of what the older one said (a
    question that still matches the old wording best is asked of today). The successor moves
    up to just before it, and takes its score, so scores still read best first; chains of
    supersessions settle in as many passes as they are long."""
    ranked = list(ranked)
    for _ in range(len(ranked)):
        where = {c.id: i for i, c in enumerate(ranked)}
        moved = False
        for i, c in enumerate(ranked):
            row = c.row or {}
            successor = row.get("superseded_by")
            if successor in where and where[successor] > i and _superseded(row, as_of):
                newer = ranked.pop(where[successor])
                newer.score = max(newer.score, c.score)
                ranked.insert(i, newer)
                moved = True
                break
        if not moved:
            break
    return ranked


def _superseded(row: dict[str, Any], as_of: str | None) -> bool:
    """Whether a memory takes the superseded penalty: superseded or invalidated — at ``as_of``
    when the request asks about that instant (a memory current then was not superseded yet;
    timestamps are canonical, compared as the ``as_of`` filter compares them)."""
    invalid_at = row.get("invalid_at")
    if as_of is None:
        return bool(row.get("superseded_by") or invalid_at)
    return invalid_at is not None and invalid_at <= as_of


def _can_matter(nearest: list[str], cos: dict[str, float], keyword_hits: set[str]) -> int:
    """syncd: how many of ``nearest`` (best first) can change the answer. A memory stays only
    when its relevance reaches CANDIDATE_FLOOR, so one with a lower cosine stays only as a
    keyword hit — whose vector rank counts the memories before it. Past the last keyword hit,
    memories under the floor are dropped whatever their rows say: no need to read them."""
    if not keyword_hits <= set(nearest):
        return len(nearest)  # a keyword hit further out (or in a wider search) may get a rank
    end = len(nearest)
    while end and cos[nearest[end - 1]] < CANDIDATE_FLOOR and nearest[end - 1] not in keyword_hits:
        end -= 1
    return end


def _relevance(c: Candidate) -> float:
    semantic = max(0.0, c.cosine or 0.0)
    keyword = max(0.0, c.kw_raw or 0.0)
    return max(semantic, keyword) + 0.3 * min(semantic, keyword)


def _also_linked(cand: Candidate, proximity: float, seed_relevance: float) -> None:
    """A direct match that is also a seed's neighbour takes the graph term too (the best
    link's): it was scored as if the edge did not exist."""
    if proximity * seed_relevance > cand.graph_proximity * cand.seed_relevance:
        cand.graph_proximity, cand.seed_relevance = proximity, seed_relevance


def _cosine_of_the_rest(semantic: Semantic, cands: dict[str, Candidate]) -> None:
    """Give the keyword hits beyond the semantic leg's 50 their cosine (without a vector rank):
    in a store full of near-identical notes the 50 nearest can all be those notes, and a
    keyword hit counted as semantically unrelated was buried under them."""
    missing = [mid for mid, c in cands.items() if c.cosine is None]
    for mid, cosine in semantic.cosines(missing).items():
        cands[mid].cosine = cosine


def _retrieved(c: Candidate, fallback: bool, confident: bool) -> RetrievedMemory:
    row = c.row or {}
    via = Via(seed=c.via[0], type=c.via[1], depth=c.via[2]) if c.via else None
    parts = c.parts or {}
    return RetrievedMemory(
        id=c.id, memory_type=str(row.get("memory_type") or ""),
        title=_opt(row.get("title")), content_preview=str(row.get("content_preview") or ""),
        score=c.score, distance=cosine_distance(c.cosine),
        kw_score=c.kw_raw, graph_proximity=c.graph_proximity,
        importance=float(row.get("importance") or 0.0), realm=_opt(row.get("realm")),
        valid_at=_opt(row.get("valid_at")), invalid_at=_opt(row.get("invalid_at")), via=via,
        components=ScoreComponents(**parts) if parts else None, fallback=fallback,
        confident=confident, superseded_by=_opt(row.get("superseded_by")),
    )


def _opt(value: object) -> str | None:
    return None if value is None else str(value)

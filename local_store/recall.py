"""Hybrid recall over the local store: the control plane's algorithm (contract §6), and syncd's.

Pipeline (both modes): filters → semantic leg (exact cosine over the in-RAM index, 50) and
keyword leg (50) → candidate map with 0-based ranks → graph expansion from the top 10 seeds
(1–2 hops, proximity 1/(1+hops)) → blend → sort → truncate → ``context``.

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
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from local_store.errors import ValidationError
from local_store.ranking import (
    PLANE_WORD_SEP,
    Candidate,
    Weights,
    build_context,
    cosine_distance,
    coverage,
    dedupe_linked,
    fts_match,
    order,
    recency,
    score_plane,
    score_syncd,
    specific_words,
    tokenize,
)
from local_store.reader import RowMemo
from local_store.records import MAX_TAGS, MEMORY_TYPES, is_placeholder, parse_timestamp
from local_store.reference import Reference, generic_words
from local_store.vectors import VectorIndex, nearest_rows
from protocol.query import (
    Linked,
    QueryRequest,
    QueryResponse,
    RetrievedMemory,
    ScoreComponents,
    Via,
)
from protocol.settings import MemorySettings
from protocol.timestamp import TimestampError, parse_ns

# "keyword" and "vector" are single-leg baselines for the eval (no graph, ranked by the leg's own
# relevance: normalised BM25 × coverage, or cosine).
Mode = Literal["syncd", "plane", "keyword", "vector"]
Fetch = Callable[[str, Sequence[object]], list[Any]]


@dataclass(slots=True)
class Semantic:
    """The query's cosine against every indexed vector, with the ids in the same order — one
    locked snapshot of the index (``VectorIndex.snapshot``), so recall never sees it mid-update.
    The ids are the index's shared immutable tuple: no per-query copy.

    ``reference`` (the generic texts' vectors, ``reference.py``) and ``index`` (where the
    vectors are) let the confident tier compare a memory with generic text; without a
    reference, keyword evidence alone makes a memory confident."""

    ids: Sequence[str]
    sims: npt.NDArray[np.float32]
    vector: npt.NDArray[np.float32] | None = None
    reference: Reference | None = None
    index: VectorIndex | None = None

    def generic(self, ids: Sequence[str]) -> dict[str, float]:
        """Each of ``ids``' highest cosine with a generic text (those the index holds)."""
        if self.reference is None or self.index is None or not ids:
            return {}
        return self.index.derived(ids, self.reference.best)

    def cosines(self, ids: Sequence[str]) -> dict[str, float]:
        """The query's cosine with each of ``ids`` the index holds."""
        if self.index is None or self.vector is None or not ids:
            return {}
        return self.index.cosines(ids, self.vector, (tuple(self.ids), self.sims))

    def off_topic(self) -> float | None:
        """The query's highest cosine with a generic text that carries no programming topic
        (``reference.OFF_TOPIC_PARTS``); None without a reference."""
        if self.reference is None or self.vector is None:
            return None
        return self.reference.best_off_topic(self.vector)


CAND_K = 50
# A backstop, never reached in normal work: the query's future always settles (a refused or
# cancelled job fails it), but a reader thread must not wait forever on a bug.
SEMANTIC_WAIT_S = 60.0
SEED_N = 10
EXPAND_CAP = 200
MAX_HOPS = 2
MAX_SUCCESSIONS = 8  # syncd: how far a chain of supersessions is followed into the answer
FIRST_SAMPLE = 2  # semantic leg: look at 2×50 nearest first, then 8× more while filters drop
OVERSAMPLE = 8   # (or, in plane mode, while a memory further out could still blend into the 50)
RELEVANCE_WEIGHT = 0.7  # the plane's semantic leg ranks by 0.7·cos + 0.3·importance
IMPORTANCE_WEIGHT = 0.3
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
# plane mode's keyword leg counts a query's first PLANE_MAX_TOKENS distinct tokens (the plane
# counts them all): each is looked for in every row that passes the filters.
PLANE_MAX_TOKENS = 256
# A request's realms: far more than any scope names (the hook sends 3), far fewer than
# SQLite's 32,766 parameters (the graph's edge query holds them with up to 2×200 node ids).
MAX_REALMS = 256

ROW_COLUMNS = ("id", "memory_type", "title", "content_preview", "tags", "importance",
        "realm", "created_at", "valid_at", "invalid_at", "superseded_by", "dedupe_key")
ROW_SQL = ", ".join(f"m.{c}" for c in ROW_COLUMNS)
FTS_SQL = "SELECT rowid, -rank AS score FROM memories_fts WHERE memories_fts MATCH ?"


@dataclass(frozen=True, slots=True)
class Filters:
    realms: tuple[str, ...] = ()
    memory_type: str | None = None
    tags: tuple[str, ...] = ()
    importance_min: float | None = None
    as_of: str | None = None
    include_invalidated: bool = False
    space_agent: str | None = None

    def sql(self, *, for_graph: bool = False) -> tuple[str, list[object]]:
        """AND-ed predicates over ``memories m``. The graph (syncd) uses realm/status/validity
        and the space: another agent's private memory never arrives through an edge either."""
        where = ["m.deleted = 0", "m.status <> 'archived'"]
        params: list[object] = []
        if self.realms:
            where.append(f"m.realm IN ({','.join('?' * len(self.realms))})")
            params.extend(self.realms)
        if self.space_agent is not None:  # the plane's rule (contract §6, step 3)
            where.append("(m.space IS NULL OR m.space = 'public' OR m.space = ?)")
            params.append(f"private:{self.space_agent}")
        if not for_graph:
            if self.memory_type is not None:
                where.append("m.memory_type = ?")
                params.append(self.memory_type)
            if self.importance_min is not None:
                where.append("m.importance >= ?")
                params.append(self.importance_min)
            # A case-sensitive substring of the comma string, as the plane's LIKE on PostgreSQL
            # (SQLite's LIKE ignores ASCII case); % and _ are the tag's own characters (the
            # plane drops them). ``replace`` does the same on SQLite and PostgreSQL, so the
            # hub answers alike on both.
            for tag in self.tags:
                where.append("replace(m.tags, ?, '') <> m.tags")
                params.append(tag)
        if self.include_invalidated:
            pass
        elif self.as_of is not None:
            where.append("(m.invalid_at IS NULL OR m.invalid_at > ?) "
                         "AND (m.valid_at IS NULL OR m.valid_at <= ?)")
            params.extend([self.as_of, self.as_of])
        else:
            where.append("m.invalid_at IS NULL")
        return " AND ".join(where), params


def filters_from(request: QueryRequest) -> Filters:
    """The request's filters. ``realms`` is taken literally, as the plane does: ``[]`` is every
    realm, anything else is ``realm IN (…)`` — so ``[""]`` matches nothing (no memory has the
    realm "": a blank realm is saved as ``default``). More tags or realms than a memory can
    carry (``MAX_TAGS``, ``MAX_REALMS``) are refused: each tag is one SQL term, and SQLite
    refuses a query of ~1,000 terms."""
    if len(request.tags) > MAX_TAGS:
        raise ValidationError("tags", f"must have at most {MAX_TAGS} tags, got {len(request.tags)}")
    if len(request.realms) > MAX_REALMS:
        raise ValidationError(
            "realms", f"must have at most {MAX_REALMS} realms, got {len(request.realms)}")
    kind = None
    if request.memory_type is not None:
        kind = request.memory_type.strip().lower()
        kind = kind if kind in MEMORY_TYPES else "fact"
    as_of = None
    if request.as_of is not None and not request.include_invalidated:
        as_of = parse_timestamp(request.as_of, "as_of")
    tags = tuple(t for t in request.tags if t.strip())
    return Filters(realms=tuple(dict.fromkeys(request.realms)), memory_type=kind, tags=tags,
                   importance_min=request.importance_min, as_of=as_of,
                   include_invalidated=request.include_invalidated,
                   space_agent=request.space_agent)


def weights_from(s: MemorySettings) -> Weights:
    return Weights(w_rrf=s.w_rrf, w_semantic=s.w_semantic, w_keyword=s.w_keyword,
                   w_graph=s.w_graph, w_importance=s.w_importance, w_recency=s.w_recency,
                   rrf_k=s.rrf_k, half_life_days=s.half_life_days)


class Recall:
    """One recall request: synchronous, run on the store's reader thread in one hop (all its
    SQL and scoring). The query's similarities come ready, or as a future computed on another
    thread meanwhile, awaited only when the semantic leg needs them."""

    def __init__(self, fetch: Fetch, semantic: Semantic | Future[Semantic | None] | None,
                 settings: MemorySettings, now_ns: Callable[[], int] = time.time_ns,
                 memo: RowMemo | None = None) -> None:
        self._fetch = fetch
        self._semantic_source = semantic
        self._settings = settings
        self._now_ns = now_ns
        self._memo = memo  # rows read by earlier recalls, on the same connection and thread

    @property
    def _semantic(self) -> Semantic | None:
        """The query's similarities. Given as a future, they are being computed on another
        thread while the keyword leg runs (the matrix product is memory-bound and releases the
        GIL); the semantic leg waits for them here."""
        source = self._semantic_source
        return source.result(SEMANTIC_WAIT_S) if isinstance(source, Future) else source

    def run(self, request: QueryRequest, mode: Mode = "syncd", graph_allowed: bool = True,
            started: float | None = None) -> QueryResponse:
        started = time.perf_counter() if started is None else started
        s = self._settings
        limit = min(100, max(1, request.limit if request.limit is not None else s.default_limit))
        hops = min(MAX_HOPS, request.expand_hops if request.expand_hops is not None
                   else s.default_expand_hops)
        if not graph_allowed or mode in ("keyword", "vector"):
            hops = 0
        filters = filters_from(request)
        tokens = tokenize(request.query)
        if self._memo is not None:
            self._memo.fresh()
        cands: dict[str, Candidate] = {}
        strict_hit = False
        # The keyword leg goes first: its hits tell the semantic leg which rows it may skip.
        if mode != "vector" and tokens:
            strict_hit = self._keyword_leg(tokens, filters, mode, cands)
        if mode != "keyword":
            self._semantic_leg(filters, mode, cands)
        self._hydrate(cands, filters, mode)
        if mode == "syncd":
            cands = {k: c for k, c in cands.items() if _relevance(c) >= CANDIDATE_FLOOR}
            self._add_successors(cands, filters)
        linked: list[Linked] = []
        if hops >= 1 and cands:
            linked = self._expand(cands, filters, hops, limit, mode)
        ranked = self._score(cands.values(), tokens, mode, filters.as_of)
        fallback, matched = False, None
        if mode == "syncd":
            confident = self._confident(ranked[:limit], tokens, strict_hit)
            if request.confident_only:
                ranked = [c for c in ranked if c.id in confident]
                linked = linked if ranked else []
            elif not ranked:
                ranked = self._fallback(filters, limit)
                fallback = bool(ranked)
            matched = bool(confident)
        else:
            confident = set()
        memories = [_retrieved(c, mode, fallback, c.id in confident) for c in ranked[:limit]]
        linked = dedupe_linked(linked)
        took = int((time.perf_counter() - started) * 1000)
        return QueryResponse(memories=memories, linked=linked,
                             context=build_context(memories, linked, fallback, matched),
                             took_ms=took, fallback=True if fallback else None, matched=matched)

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

    # ------------------------------------------------------------------ legs

    def _semantic_leg(self, filters: Filters, mode: Mode, cands: dict[str, Candidate]) -> None:
        """Adds up to 50 candidates."""
        semantic = self._semantic
        if semantic is None or not semantic.ids:
            return
        sims, every = semantic.sims, semantic.ids
        where, params = filters.sql()
        if mode == "plane":
            ranked, cos, rows = self._plane_blend(sims, every, where, params)
        else:
            ranked, cos, rows = self._nearest_allowed(sims, every, where, params, mode, cands)
        for rank, mid in enumerate(ranked):
            cand = cands.setdefault(mid, Candidate(mid))
            cand.vec_rank, cand.cosine, cand.row = rank, cos[mid], rows[mid]
        if mode == "syncd":  # a keyword hit further out still has a cosine: its relevance
            _cosine_of_the_rest(semantic, cands)

    def _nearest_allowed(self, sims: npt.NDArray[np.float32], every: Sequence[str], where: str,
                         params: list[object], mode: Mode, cands: dict[str, Candidate],
                         ) -> tuple[list[str], dict[str, float], dict[str, dict[str, Any]]]:
        """Ranked by cosine alone, the first CAND_K that pass the filters (ids, cosines, rows)."""
        keyword_hits = set(cands)  # the keyword leg ran first
        want = min(len(every), CAND_K * FIRST_SAMPLE)
        looked_up: dict[str, dict[str, Any] | None] = {}
        while True:
            top = nearest_rows(sims, want)
            cos = dict(zip([every[i] for i in top.tolist()], sims[top].tolist(), strict=True))
            nearest = sorted(cos, key=lambda mid: (-cos[mid], mid))
            matter = _can_matter(nearest, cos, keyword_hits) if mode == "syncd" else len(nearest)
            allowed = self._first_allowed(nearest[:matter], CAND_K, where, params, looked_up)
            if len(allowed) >= CAND_K or want >= len(every) or matter < len(nearest):
                break
            want = min(len(every), want * OVERSAMPLE)
        return list(allowed)[:CAND_K], cos, allowed

    def _plane_blend(self, sims: npt.NDArray[np.float32], every: Sequence[str], where: str,
                     params: list[object],
                     ) -> tuple[list[str], dict[str, float], dict[str, dict[str, Any]]]:
        """The plane's semantic leg (contract §6.4): the 50 best by ``0.7·cos + 0.3·importance``
        among every row that passes the filters (ids, cosines, rows). Reads the importances of
        the nearest rows, widening until no row further out can blend into the 50
        (``_blend_settled``), or of every row in one scan once a round would read a quarter
        of them; then the rows of the 50."""
        want = min(len(every), CAND_K * FIRST_SAMPLE)
        importance: dict[str, float | None] = {}
        while True:
            if want * 4 >= len(every):
                want = len(every)
            top = nearest_rows(sims, want)
            cos = dict(zip([every[i] for i in top.tolist()], sims[top].tolist(), strict=True))
            if want >= len(every):
                found = dict(self._fetch(f"SELECT m.id, m.importance FROM memories m "
                                         f"WHERE {where}", params))
                importance = {mid: found.get(mid) for mid in cos}
            else:
                missing = [mid for mid in cos if mid not in importance]
                found = self._importances(missing, where, params)
                importance.update((mid, found.get(mid)) for mid in missing)
            key = {mid: RELEVANCE_WEIGHT * cos[mid] + IMPORTANCE_WEIGHT * imp
                   for mid in cos if (imp := importance[mid]) is not None}
            if want >= len(every) or _blend_settled(key, float(sims[top].min())):
                break
            want = min(len(every), want * OVERSAMPLE)
        ranked = heapq.nsmallest(CAND_K, key, key=lambda mid: (-key[mid], mid))
        rows = self._rows_for(ranked, where, params)
        return [mid for mid in ranked if mid in rows], cos, rows

    def _importances(self, ids: list[str], where: str, params: list[object]) -> dict[str, float]:
        """The importance of each of these ids whose row passes the filters."""
        out: dict[str, float] = {}
        for start in range(0, len(ids), 500):
            chunk = ids[start:start + 500]
            out.update(self._fetch(f"SELECT m.id, m.importance FROM memories m WHERE {where} "
                                   f"AND m.id IN ({','.join('?' * len(chunk))})",
                                   [*params, *chunk]))
        return out

    def _first_allowed(self, nearest: list[str], enough: int, where: str, params: list[object],
                       looked_up: dict[str, dict[str, Any] | None]) -> dict[str, dict[str, Any]]:
        """The ids of ``nearest`` that pass the filters, with their rows, in ``nearest``'s
        order: the first ``enough`` when they all pass (usually: half the row reads of reading
        all), else every one that passes. ``looked_up`` keeps each id's row (None: filtered
        out) for the next, wider call."""
        allowed: dict[str, dict[str, Any]] = {}
        for prefix in (nearest[:enough], nearest):
            missing = [mid for mid in prefix if mid not in looked_up]
            found = self._rows_for(missing, where, params)
            looked_up.update((mid, found.get(mid)) for mid in missing)
            allowed = {mid: row for mid in prefix if (row := looked_up[mid]) is not None}
            if len(allowed) >= enough:
                break
        return allowed

    def _rows_for(self, ids: list[str], where: str,
                  params: list[object]) -> dict[str, dict[str, Any]]:
        """The rows of these ids that pass the filters (filtering and hydrating in one query),
        from the memo when an earlier recall with the same filters read them."""
        memo = self._memo.rows(where, params) if self._memo is not None else {}
        missing = [mid for mid in ids if mid not in memo]
        read: dict[str, tuple[Any, ...] | None] = dict.fromkeys(missing)
        for start in range(0, len(missing), 500):
            chunk = missing[start:start + 500]
            for r in self._fetch(f"SELECT {ROW_SQL} FROM memories m WHERE {where} "
                                 f"AND m.id IN ({','.join('?' * len(chunk))})",
                                 [*params, *chunk]):
                read[r[0]] = tuple(r)
        if self._memo is not None:
            memo.update(read)
            self._memo.added(len(read))
        out: dict[str, dict[str, Any]] = {}
        for mid in ids:
            r = read[mid] if mid in read else memo[mid]
            if r is not None:
                out[mid] = dict(zip(ROW_COLUMNS, r, strict=True))
        return out

    def _keyword_leg(self, tokens: list[str], filters: Filters, mode: Mode,
                           cands: dict[str, Candidate]) -> bool:
        """Adds up to 50 candidates; returns whether one memory holds every word (strict)."""
        where, params = filters.sql()
        if mode == "plane":
            hits = self._plane_keyword(tokens, where, params)
            strict = bool(hits) and max(hit[1] for hit in hits) >= len(tokens)
        else:
            hits, strict = self._fts_keyword(tokens, where, params)
        for rank, (mid, raw, vote, row) in enumerate(hits):
            cand = cands.setdefault(mid, Candidate(mid))
            cand.kw_rank, cand.kw_raw, cand.kw_vote = rank, raw, vote
            cand.row = cand.row or row
        return strict

    def _plane_keyword(self, tokens: list[str], where: str,
                       params: list[object]) -> list[tuple[str, float, float, dict[str, Any] | None]]:
        """The plane's substring count (contract §6.5), one SQL function call per row
        (``ranking.plane_kw_score``: Unicode lower-casing, and no SQL term per token). Counts
        the first ``PLANE_MAX_TOKENS`` tokens only; ``keyword`` still divides by all of them."""
        words = PLANE_WORD_SEP.join(tokens[:PLANE_MAX_TOKENS])
        rows = self._fetch(
            f"SELECT id, kw FROM (SELECT m.id AS id, m.importance AS imp, "
            f"plane_kw_score(m.content, m.title, m.tags, ?) AS kw "
            f"FROM memories m WHERE {where}) AS hits WHERE kw > 0 ORDER BY kw DESC, imp DESC, id "
            f"LIMIT {CAND_K}", [words, *params])
        return [(r[0], float(r[1]), 1.0, None) for r in rows]

    def _fts_keyword(self, tokens: list[str], where: str, params: list[object],
                     ) -> tuple[list[tuple[str, float, float, dict[str, Any] | None]], bool]:
        for relaxed in (False, True):
            rows = self._keyword_rows(tokens, relaxed, where, params)
            if rows:
                # Relaxed (OR) hits matched only part of the question: coverage counts twice.
                power = 2 if relaxed else 1
                best = max(score for score, _ in rows) or 1.0
                out: list[tuple[str, float, float, dict[str, Any] | None]] = []
                specific = specific_words(tokens, generic_words()) if relaxed else []
                for score, row in rows:
                    text = f"{row['title'] or ''} {row['content']} {row['tags']}"
                    raw = max(0.0, score) / best * coverage(tokens, text) ** power
                    vote = 1.0 if not relaxed else coverage(specific, text) if specific else 0.0
                    out.append((row["id"], raw, vote, row))
                return out, not relaxed
        return [], False

    def _keyword_rows(self, tokens: list[str], relaxed: bool, where: str,
                      params: list[object]) -> list[tuple[float, dict[str, Any]]]:
        """Best keyword hits (score, row with content) that pass the filters; strict (AND) or
        relaxed (OR). Another backend overrides this one method (the hub on PostgreSQL)."""
        match = fts_match(tokens, relaxed=relaxed)
        return [] if match is None else self._fts_rows(match, where, params)

    def _fts_rows(self, match: str, where: str,
                  params: list[object]) -> list[tuple[float, dict[str, Any]]]:
        """Best BM25 hits that pass the filters. The keyword index finds its best hits first
        (``LIMIT``); only those rows are then filtered and hydrated. When the filters drop
        too many, the limit grows until the index has no more hits."""
        inner = CAND_K * 4
        while True:
            hits, tie = self._fts_hits(match, inner)
            found = self._passing_hits(hits, where, params)
            if tie is not None and not (len(found) >= CAND_K and found[CAND_K - 1][0] > tie):
                # Hits tied at the cut may be among the answer: take FTS5's own choice of them.
                hits = self._fetch(f"{FTS_SQL} ORDER BY rank LIMIT ?", [match, inner])
                found = self._passing_hits(hits, where, params)
            if len(found) >= CAND_K or len(hits) < inner or inner >= 1 << 20:
                return [(score, _keyword_row(r)) for score, r in found[:CAND_K]]
            inner *= 8

    def _fts_hits(self, match: str, limit: int) -> tuple[list[Any], float | None]:
        """The ``limit`` best BM25 hits (rowid, score) and, when the last of them ties with the
        next best hit, their score (which tied hits make the cut is then the sorter's choice).

        SQLite's sorter picks them: FTS5's own ``ORDER BY rank`` looks each returned hit up in
        the index again (~0.3 ms more at 100k memories, over 1 ms for a broad OR query)."""
        hits = self._fetch(f"{FTS_SQL} ORDER BY score DESC LIMIT ?", [match, limit + 1])
        cut_tied = len(hits) > limit and hits[limit][1] == hits[limit - 1][1]
        return hits[:limit], float(hits[limit][1]) if cut_tied else None

    def _passing_hits(self, hits: list[Any], where: str, params: list[object]) -> list[Any]:
        """(score, row) of the hits whose rows pass the filters, best first (ties by id): the
        best CAND_K of them at least, or all that pass when fewer do; each row is (rowid,
        content, *ROW_COLUMNS). The rows of the hits scoring at least the CAND_K-th best are
        read first, and the rest only when the filters drop some of those: every hit not read
        scores below each one read, so the best CAND_K that pass are the same either way (a
        keyword leg asks for 4×CAND_K hits, and read them all with their text, when the
        filters usually drop none)."""
        score = {int(r[0]): float(r[1]) for r in hits}
        ordered = sorted(score, key=lambda rowid: -score[rowid])
        first = ordered
        if len(ordered) > CAND_K:
            floor = score[ordered[CAND_K - 1]]
            first = [rowid for rowid in ordered if score[rowid] >= floor]
        found = self._hit_rows(first, where, params)
        if len(found) < CAND_K and len(first) < len(ordered):
            found += self._hit_rows(ordered[len(first):], where, params)
        found.sort(key=lambda r: (-score[r[0]], r[2]))
        return [(score[r[0]], r) for r in found]

    def _hit_rows(self, rowids: list[int], where: str, params: list[object]) -> list[Any]:
        """The rows (rowid, content, *ROW_COLUMNS) of these rowids that pass the filters."""
        found: list[Any] = []
        for start in range(0, len(rowids), 500):
            chunk = rowids[start:start + 500]
            found += self._fetch(
                f"SELECT m.rowid, m.content, {ROW_SQL} FROM memories m WHERE {where} "
                f"AND m.rowid IN ({','.join('?' * len(chunk))})", [*params, *chunk])
        return found

    # ------------------------------------------------------------------ rows, graph, scores

    def _hydrate(self, cands: dict[str, Candidate], filters: Filters, mode: Mode,
                       *, graph: bool = False) -> None:
        missing = [mid for mid, c in cands.items() if c.row is None]
        if graph and mode == "plane":
            where, params = "m.deleted = 0 AND m.invalid_at IS NULL", list[object]()
        elif graph:
            where, params = filters.sql(for_graph=True)
        else:
            where, params = "1 = 1", []
        for start in range(0, len(missing), 500):
            chunk = missing[start:start + 500]
            rows = self._fetch(
                f"SELECT {ROW_SQL} FROM memories m WHERE {where} "
                f"AND m.id IN ({','.join('?' * len(chunk))})", [*params, *chunk])
            for r in rows:
                cands[r[0]].row = dict(zip(ROW_COLUMNS, r, strict=True))

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
            self._hydrate(found, filters, "syncd", graph=True)
            found = {mid: c for mid, c in found.items() if c.row is not None}
            if not found:
                return
            semantic = self._semantic
            if semantic is not None:
                for mid, cosine in semantic.cosines(list(found)).items():
                    found[mid].cosine = cosine
            cands.update(found)

    def _expand(self, cands: dict[str, Candidate], filters: Filters, hops: int,
                      limit: int, mode: Mode) -> list[Linked]:
        seeds = sorted(cands.values(), key=lambda c: (c.best_rank, c.id))[:SEED_N]
        frontier = {c.id: c.id for c in seeds}  # node → the seed it came from
        # syncd: memories count as linked to the best matches only (``_best_matches``).
        best = _best_matches(seeds) if mode == "syncd" else None
        seen_edges: set[str] = set()
        linked: list[Linked] = []
        added: dict[str, Candidate] = {}
        for depth in range(1, hops + 1):
            if not frontier:
                break
            nodes = list(frontier)
            marks = ",".join("?" * len(nodes))
            sql = (f"SELECT id, src, dst, type, realm, target_namespace FROM edges "
                   f"WHERE (src IN ({marks}) OR dst IN ({marks}))")
            params: list[object] = [*nodes, *nodes]
            if mode != "plane":
                sql += " AND deleted = 0"
            if filters.realms:
                sql += f" AND realm IN ({','.join('?' * len(filters.realms))})"
                params.extend(filters.realms)
            sql += f" ORDER BY id LIMIT {EXPAND_CAP}" if mode != "plane" else f" LIMIT {EXPAND_CAP}"
            next_frontier: dict[str, str] = {}
            for eid, src, dst, etype, _realm, namespace in self._fetch(sql, params):
                if mode != "plane":
                    if eid in seen_edges:
                        continue
                    seen_edges.add(eid)
                for near, far in ((src, dst), (dst, src)):
                    if near not in frontier:
                        continue
                    if far.startswith("memory:"):
                        if best is not None and frontier[near] not in best:
                            continue
                        seed_rel = _relevance(cands[frontier[near]])
                        proximity = 1.0 / (1 + depth)
                        if mode == "syncd" and far in cands and far != frontier[near]:
                            _also_linked(cands[far], proximity, seed_rel)
                        if far in cands or far in added:
                            continue
                        cand = Candidate(far, graph_proximity=proximity,
                                         via=(frontier[near], etype, depth))
                        cand.seed_relevance = seed_rel
                        added[far] = cand
                        next_frontier[far] = frontier[near]
                    else:
                        linked.append(Linked(node_id=far, target_namespace=namespace,
                                             edge_type=etype, depth=depth))
                if len(cands) + len(added) > 200 or len(linked) > limit * 20:
                    break
            if mode != "plane":  # a memory the filters hide is no bridge to the next hop
                reached = {mid: added[mid] for mid in next_frontier}
                self._hydrate(reached, filters, mode, graph=True)
                next_frontier = {mid: seed for mid, seed in next_frontier.items()
                                 if reached[mid].row is not None}
            frontier = next_frontier
        if mode == "plane":  # syncd mode hydrated each hop's memories above
            self._hydrate(added, filters, mode, graph=True)
        for mid, cand in added.items():
            if cand.row is not None or mode == "plane":
                cands[mid] = cand
        return linked

    def _score(self, cands: Any, tokens: list[str], mode: Mode,
               as_of: str | None = None) -> list[Candidate]:
        w = weights_from(self._settings)
        now = self._now_ns()
        out = []
        for c in cands:
            row = c.row or {}
            importance = float(row.get("importance") or 0.0)
            rec = recency(_ns(row.get("created_at")), now, w.half_life_days) if row else 0.5
            if mode == "syncd":
                c.score = score_syncd(c, w, rec, importance, _superseded(row, as_of))
            else:
                c.score = score_plane(c, w, len(tokens), rec, importance)
            if mode == "vector":  # single-leg baselines rank by their own relevance only
                c.score = c.cosine or 0.0
            elif mode == "keyword":
                c.score = c.kw_raw or 0.0
            out.append(c)
        ranked = order(out)
        return _successors_first(_one_per_key(ranked), as_of) if mode == "syncd" else ranked

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


def _blend_settled(key: dict[str, float], cos_floor: float) -> bool:
    """plane: whether the 50 best blended keys (``0.7·cos + 0.3·importance``) so far are the
    store's. A memory not yet looked at has a cosine of at most ``cos_floor`` (the lowest among
    those looked at) and an importance of at most 1, so it cannot beat the 50th key when even
    that best case falls short of it."""
    if len(key) < CAND_K:
        return False
    fiftieth = heapq.nlargest(CAND_K, key.values())[-1]
    return RELEVANCE_WEIGHT * cos_floor + IMPORTANCE_WEIGHT * 1.0 < fiftieth


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


def _keyword_row(r: Sequence[Any]) -> dict[str, Any]:
    """A row from ``_passing_hits`` as a candidate row with its content (for coverage)."""
    row = dict(zip(ROW_COLUMNS, r[2:], strict=True))
    row["content"] = r[1]
    return row


def _ns(value: object) -> int | None:
    """Stored timestamps are canonical: read their fields directly (a memoised day plus
    integer arithmetic); anything else goes through the full parser."""
    if not isinstance(value, str):
        return None
    if len(value) == 35 and value.endswith("+00:00") and value[19] == ".":
        day = _DAY_NS.get(value[:10])
        if day is None:
            try:
                day = parse_ns(value[:10] + "T00:00:00Z")
            except TimestampError:
                return None
            if len(_DAY_NS) < 100_000:
                _DAY_NS[value[:10]] = day
        try:
            return (day + (int(value[11:13]) * 3600 + int(value[14:16]) * 60
                           + int(value[17:19])) * 1_000_000_000 + int(value[20:29]))
        except ValueError:
            return None
    try:
        return parse_ns(value)
    except TimestampError:
        return None


_DAY_NS: dict[str, int] = {}


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


def _retrieved(c: Candidate, mode: Mode, fallback: bool, confident: bool) -> RetrievedMemory:
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

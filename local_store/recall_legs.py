"""Recall's candidate legs: what a query finds by its words and by its meaning, under its filters.

The legs read; they never rank the answer (``recall.py`` does, one strategy per mode).

  * Keyword leg, two kinds: syncd's on FTS5/BM25 (``_fts_keyword``: every token quoted, strict
    AND, relaxed to OR without stopwords when AND finds nothing), and the plane's substring
    count (``_plane_keyword``, contract §6.5) over its first ``PLANE_MAX_TOKENS`` tokens.
    Another backend swaps in its own keyword index by overriding ``_keyword_rows`` (the hub on
    PostgreSQL).
  * Semantic leg, two kinds: the ``CAND_K`` nearest by cosine alone that pass the filters
    (``_nearest_allowed``), and the plane's ``0.7·cos + 0.3·importance`` blend over every row
    that passes them (``_plane_blend``, contract §6.4). Both read only as many rows as can
    still change the answer, and answer as reading them all would (tests/local_store/
    test_recall_fast_paths.py).
  * The query's similarities (``Semantic``) are one locked snapshot of the vector index; given
    as a future, they are computed on another thread while the keyword leg runs.
  * Rows are filtered and hydrated in one query, ``IN`` lists of ``db.IN_LIST`` ids, and taken
    from the reader's memo when an earlier recall with the same filters read them.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from local_store.db import chunks, marks
from local_store.errors import ValidationError
from local_store.ranking import PLANE_WORD_SEP, Candidate, coverage, fts_match, specific_words
from local_store.reader import RowMemo
from local_store.records import MAX_TAGS, MEMORY_TYPES, parse_timestamp
from local_store.reference import Reference, generic_words
from local_store.vectors import VectorIndex, nearest_rows
from protocol.query import QueryRequest

Fetch = Callable[[str, Sequence[object]], list[Any]]
# (id, raw score, RRF vote weight, row or None): one keyword hit, best first.
KeywordHit = tuple[str, float, float, dict[str, Any] | None]
# (ids best first, cosine of every id looked at, row of each ranked id): one semantic ranking.
SemanticRanking = tuple[list[str], dict[str, float], dict[str, dict[str, Any]]]


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
FIRST_SAMPLE = 2  # semantic leg: look at 2×50 nearest first, then 8× more while filters drop
OVERSAMPLE = 8   # (or, in plane mode, while a memory further out could still blend into the 50)
RELEVANCE_WEIGHT = 0.7  # the plane's semantic leg ranks by 0.7·cos + 0.3·importance
IMPORTANCE_WEIGHT = 0.3
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


class Legs:
    """The reads of one recall request, on the store's reader thread (``recall.Recall``)."""

    def __init__(self, fetch: Fetch, semantic: Semantic | Future[Semantic | None] | None,
                 memo: RowMemo | None = None) -> None:
        self._fetch = fetch
        self._semantic_source = semantic
        self._memo = memo  # rows read by earlier recalls, on the same connection and thread

    @property
    def _semantic(self) -> Semantic | None:
        """The query's similarities. Given as a future, they are being computed on another
        thread while the keyword leg runs (the matrix product is memory-bound and releases the
        GIL); the semantic leg waits for them here."""
        source = self._semantic_source
        return source.result(SEMANTIC_WAIT_S) if isinstance(source, Future) else source

    # ------------------------------------------------------------------ semantic leg

    def _semantic_leg(self, filters: Filters, cands: dict[str, Candidate],
                      ranking: Callable[..., SemanticRanking]) -> Semantic | None:
        """Adds up to 50 candidates, ranked by ``ranking`` (``_nearest_allowed`` or
        ``_plane_blend``); returns the similarities it used (None: no semantic leg)."""
        semantic = self._semantic
        if semantic is None or not semantic.ids:
            return None
        where, params = filters.sql()
        ranked, cos, rows = ranking(semantic.sims, semantic.ids, where, params, cands)
        for rank, mid in enumerate(ranked):
            cand = cands.setdefault(mid, Candidate(mid))
            cand.vec_rank, cand.cosine, cand.row = rank, cos[mid], rows[mid]
        return semantic

    def _nearest_allowed(self, sims: npt.NDArray[np.float32], every: Sequence[str], where: str,
                         params: list[object], cands: dict[str, Candidate],
                         matter: Callable[[list[str], dict[str, float], set[str]], int],
                         ) -> SemanticRanking:
        """Ranked by cosine alone, the first CAND_K that pass the filters (ids, cosines, rows).
        ``matter`` says how many of the nearest (best first) can change the answer, given the
        keyword leg's hits: only those are read."""
        keyword_hits = set(cands)  # the keyword leg ran first
        want = min(len(every), CAND_K * FIRST_SAMPLE)
        looked_up: dict[str, dict[str, Any] | None] = {}
        while True:
            top = nearest_rows(sims, want)
            cos = dict(zip([every[i] for i in top.tolist()], sims[top].tolist(), strict=True))
            nearest = sorted(cos, key=lambda mid: (-cos[mid], mid))
            can_matter = matter(nearest, cos, keyword_hits)
            allowed = self._first_allowed(nearest[:can_matter], CAND_K, where, params, looked_up)
            if len(allowed) >= CAND_K or want >= len(every) or can_matter < len(nearest):
                break
            want = min(len(every), want * OVERSAMPLE)
        return list(allowed)[:CAND_K], cos, allowed

    def _plane_blend(self, sims: npt.NDArray[np.float32], every: Sequence[str], where: str,
                     params: list[object], cands: dict[str, Candidate]) -> SemanticRanking:
        """The plane's semantic leg (contract §6.4): the 50 best by ``0.7·cos + 0.3·importance``
        among every row that passes the filters (ids, cosines, rows). Reads the importances of
        the nearest rows, widening until no row further out can blend into the 50
        (``_blend_settled``), or of every row in one scan once a round would read a quarter
        of them; then the rows of the 50. The keyword leg's ``cands`` change nothing here."""
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
        for chunk in chunks(ids):
            out.update(self._fetch(f"SELECT m.id, m.importance FROM memories m WHERE {where} "
                                   f"AND m.id IN ({marks(chunk)})", [*params, *chunk]))
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

    # ------------------------------------------------------------------ rows

    def _rows_for(self, ids: list[str], where: str,
                  params: list[object]) -> dict[str, dict[str, Any]]:
        """The rows of these ids that pass the filters (filtering and hydrating in one query),
        from the memo when an earlier recall with the same filters read them."""
        memo = self._memo.rows(where, params) if self._memo is not None else {}
        missing = [mid for mid in ids if mid not in memo]
        read: dict[str, tuple[Any, ...] | None] = dict.fromkeys(missing)
        for chunk in chunks(missing):
            for r in self._fetch(f"SELECT {ROW_SQL} FROM memories m WHERE {where} "
                                 f"AND m.id IN ({marks(chunk)})", [*params, *chunk]):
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

    def _hydrate(self, cands: dict[str, Candidate], where: str = "1 = 1",
                 params: Sequence[object] = ()) -> None:
        """Give the candidates without a row theirs, when it passes ``where``."""
        missing = [mid for mid, c in cands.items() if c.row is None]
        for chunk in chunks(missing):
            rows = self._fetch(
                f"SELECT {ROW_SQL} FROM memories m WHERE {where} "
                f"AND m.id IN ({marks(chunk)})", [*params, *chunk])
            for r in rows:
                cands[r[0]].row = dict(zip(ROW_COLUMNS, r, strict=True))

    # ------------------------------------------------------------------ keyword leg

    def _plane_keyword(self, tokens: list[str], where: str, params: list[object],
                       ) -> list[KeywordHit]:
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
                     ) -> tuple[list[KeywordHit], bool]:
        """syncd's keyword hits, and whether they are strict (one memory holds every word)."""
        for relaxed in (False, True):
            rows = self._keyword_rows(tokens, relaxed, where, params)
            if rows:
                # Relaxed (OR) hits matched only part of the question: coverage counts twice.
                power = 2 if relaxed else 1
                best = max(score for score, _ in rows) or 1.0
                out: list[KeywordHit] = []
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
        for chunk in chunks(rowids):
            found += self._fetch(
                f"SELECT m.rowid, m.content, {ROW_SQL} FROM memories m WHERE {where} "
                f"AND m.rowid IN ({marks(chunk)})", [*params, *chunk])
        return found


def add_keyword_hits(cands: dict[str, Candidate], hits: list[KeywordHit]) -> None:
    """The keyword leg's hits as candidates, with their keyword ranks (up to 50)."""
    for rank, (mid, raw, vote, row) in enumerate(hits):
        cand = cands.setdefault(mid, Candidate(mid))
        cand.kw_rank, cand.kw_raw, cand.kw_vote = rank, raw, vote
        cand.row = cand.row or row


def _blend_settled(key: dict[str, float], cos_floor: float) -> bool:
    """plane: whether the 50 best blended keys (``0.7·cos + 0.3·importance``) so far are the
    store's. A memory not yet looked at has a cosine of at most ``cos_floor`` (the lowest among
    those looked at) and an importance of at most 1, so it cannot beat the 50th key when even
    that best case falls short of it."""
    if len(key) < CAND_K:
        return False
    fiftieth = heapq.nlargest(CAND_K, key.values())[-1]
    return RELEVANCE_WEIGHT * cos_floor + IMPORTANCE_WEIGHT * 1.0 < fiftieth


def _keyword_row(r: Sequence[Any]) -> dict[str, Any]:
    """A row from ``_passing_hits`` as a candidate row with its content (for coverage)."""
    row = dict(zip(ROW_COLUMNS, r[2:], strict=True))
    row["content"] = r[1]
    return row

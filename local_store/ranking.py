"""Pure ranking functions for recall: tokenising, FTS query building, fusion, the blend, and the
context text. No I/O; table-driven tests in tests/local_store/test_ranking.py.

Two scorers share the candidate pipeline (contract §6):
  * ``plane``: the control plane's exact blend —
    ``w_rrf·rrf + w_semantic·sem + w_keyword·kw + w_graph·graph + w_importance·imp
    + w_recency·recency`` with 0-based ranks in ``1/(rrf_k + rank)``.
  * ``syncd`` (default): relevance first. ``rel = max(sem, kw) + 0.3·min(sem, kw)`` (raw cosine
    and coverage-weighted, per-query-normalised BM25), plus the RRF votes, a graph term (links
    of the best match only, ``recall._expand``) and a penalty for superseded memories; that sum
    is then scaled by importance and recency, ``×(1 + 0.1·w_importance·imp + 0.1·w_recency·rec)``.
    A prior re-weighs evidence and is not evidence itself: added as terms of their own, they
    lifted weak matches over the nearest memory of paraphrased questions, whose cosines differ
    by a few hundredths, while scaled they reorder close matches and never outrank relevance
    (PRIOR-ART "Recall").
    An entity (``memory_type`` "entity") is a name, not a statement: it takes no graph term,
    since every memory that names it links to it, and no recency, since its node is made when
    the name is first met and stays while the facts about it change.
"""

from __future__ import annotations

import functools
import math
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from protocol.query import Linked, RetrievedMemory
from protocol.timestamp import TimestampError, parse_ns

_SPLIT = re.compile(r"[^\w]+|_+", re.UNICODE)
NS_PER_DAY = 86_400 * 1_000_000_000
LN2 = math.log(2.0)

# Words that carry no topic in a question; dropped when the strict keyword query is relaxed.
STOPWORDS = frozenset("""
a about after all also am an and any are as at be been before being but by can could did do
does doing done for from had has have having how i if in into is it its just me my no not now of
on or our out over should so some than that the their them then there these they this those to
too under up us use used using was we were what when where which while who whom why will with
would you your does did get got make made new current currently still anymore please tell know
""".split())


def tokenize(text: str) -> list[str]:
    """The plane's tokeniser: split on non-alphanumerics, keep ≥ 2 chars, lower-case, dedup
    (first occurrence first). Linear (a dict, not a list lookup per word: a pasted log has
    thousands of words)."""
    seen: dict[str, None] = {}
    for piece in _SPLIT.split(text):
        token = piece.lower()
        if len(token) >= 2:
            seen.setdefault(token, None)
    return list(seen)


def fts_match(tokens: Sequence[str], *, relaxed: bool) -> str | None:
    """An FTS5 MATCH expression with every token quoted, so no input is FTS syntax.

    Strict: all non-stopword tokens (all tokens if every one is a stopword), AND-ed.
    Relaxed: any non-stopword token (OR). None when nothing is left.
    """
    words = fts_words(tokens, relaxed=relaxed)
    if not words:
        return None
    quoted = ['"' + t.replace('"', '""') + '"' for t in words]
    return (" OR " if relaxed else " AND ").join(quoted)


def fts_words(tokens: Sequence[str], *, relaxed: bool) -> list[str]:
    """The words a keyword query looks for (at most 32), by ``fts_match``'s rules."""
    words = [t for t in tokens if t not in STOPWORDS]
    if not words and not relaxed:
        words = list(tokens)
    return words[:32]


def keyword_words(text: str) -> str:
    """Text as the words the tokeniser sees (split the same way, lower-cased, repeats kept): what
    a keyword index must hold for ``tokenize``d queries to find it."""
    return " ".join(piece for piece in _SPLIT.split(text.lower()) if piece)


def rrf(vec_rank: int | None, kw_rank: int | None, k: float) -> float:
    total = 0.0
    for rank in (vec_rank, kw_rank):
        if rank is not None:
            total += 1.0 / (k + rank)
    return total


def cosine_distance(cosine: float | None) -> float | None:
    """``1 − cos`` in [0, 2], as the plane's (and pgvector's) ``cosine_distance``: float32
    rounding puts a vector's cosine with itself a hair above 1, which must not read as a
    negative distance."""
    return None if cosine is None else min(2.0, max(0.0, 1.0 - cosine))


def recency(created_ns: int | None, now_ns: int, half_life_days: float) -> float:
    """``exp(−ln2·age/half_life)`` on whole days' seconds as the plane does; 0.5 if unknown."""
    if created_ns is None:
        return 0.5
    half = half_life_days if half_life_days > 0 else 30.0
    age_seconds = (now_ns - created_ns) // 1_000_000_000
    if age_seconds <= 0:
        return 1.0
    return math.exp(-LN2 * (age_seconds / 86_400) / half)


def stamp_ns(value: object) -> int | None:
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


def coverage(tokens: Sequence[str], text: str) -> float:
    """Fraction of the words the keyword query looked for (``fts_words``: the non-stopword
    tokens, at most 32) that occur in ``text``, compared as the keyword index compares them
    (``fold``): FTS5 finds "creme" in "Crème", so coverage counts it. Bounded like the query
    itself (over every distinct token of a pasted log it cost milliseconds per hit).

    Runs for every keyword hit, so a word is looked up in the lower-cased text first; only the
    words missing there are folded and looked up in the folded text, which is built only when
    the text is not ASCII (ASCII folds to its lower case, so an ASCII word missing from ASCII
    text stays missing). ASCII text costs what it did
    before folding."""
    words = fts_words(tokens, relaxed=False)
    if not words:
        return 0.0
    lowered = text.lower()
    missing = [t for t in words if t not in lowered]
    ascii_text = text.isascii()
    if missing and not (ascii_text and all(t.isascii() for t in missing)):
        folded = lowered if ascii_text else fold(text)
        missing = [t for t in missing if fold(t) not in folded]
    return (len(words) - len(missing)) / len(words)


def specific_words(tokens: Sequence[str], common: frozenset[str]) -> list[str]:
    """The query's specific words: its keyword words (``fts_words``) not in ``common``. The
    share of them a text holds is ``coverage(specific_words(…), text)``."""
    return [t for t in fts_words(tokens, relaxed=False) if t not in common]


def fold(text: str) -> str:
    """Text as the keyword index's ``unicode61 remove_diacritics 2`` folds it (the index also
    stems with ``porter``, schema 0008; ``coverage`` compares unstemmed words, so "score" counts
    in "scores" but not the other way round — stemming it too buried vector answers under
    partial hits on the whole corpus):
    compatibility-decomposed (NFKD), combining marks dropped, case-folded — "Crème Brûlée" →
    "creme brulee". Marks outside the BMP are kept (FTS5 folds Latin diacritics only, so this
    already folds more than it does). ASCII text is only lower-cased."""
    if text.isascii():
        return text.lower()
    return _marks().sub("", unicodedata.normalize("NFKD", text)).casefold()


@functools.cache
def _marks() -> re.Pattern[str]:
    """The BMP's combining marks as one character class (built on first use). Kept
    within the BMP, ``re`` tests a character with one bitmap lookup; a class that also holds
    the supplementary planes' marks is a list of ranges tried one by one, much slower."""
    marks = [cp for cp in range(0x10000) if unicodedata.combining(chr(cp))]
    ranges: list[str] = []
    start = prev = marks[0]
    for cp in [*marks[1:], -1]:
        if cp == prev + 1:
            prev = cp
            continue
        ranges.append(re.escape(chr(start)) + (f"-{re.escape(chr(prev))}" if prev > start else ""))
        start = prev = cp
    return re.compile(f"[{''.join(ranges)}]+")


PLANE_WORD_SEP = "\x1f"


def plane_kw_score(content: str | None, title: str | None, tags: str | None,
                   words: str) -> int:
    """The plane's ``kw_score`` of one row (contract §6.5): how many of ``words`` (tokens
    joined by ``PLANE_WORD_SEP``; a token never holds it) occur in the content, title or tags
    lower-cased as the plane lower-cases them — Unicode, not SQLite's ASCII-only ``lower()``.
    Registered as a deterministic SQL function on recall's connections (``reader.py``)."""
    text = f"{content or ''}\x00{title or ''}\x00{tags or ''}".lower()
    return sum(1 for t in _split_words(words) if t in text)


@functools.lru_cache(maxsize=8)
def _split_words(words: str) -> tuple[str, ...]:
    return tuple(words.split(PLANE_WORD_SEP))


@dataclass(slots=True)
class Candidate:
    """One memory on its way through recall; fields fill in as the legs and graph run."""

    id: str
    vec_rank: int | None = None
    kw_rank: int | None = None
    cosine: float | None = None
    kw_raw: float | None = None  # plane: matched-token count; syncd: normalised BM25 × coverage
    kw_vote: float = 1.0  # syncd: the weight of the keyword rank's RRF vote (``score_syncd``)
    graph_proximity: float = 0.0
    via: tuple[str, str, int] | None = None
    seed_relevance: float = 1.0  # syncd: graph-pulled memories inherit their seed's relevance
    row: dict[str, Any] | None = None
    score: float = 0.0
    parts: dict[str, float] = field(default_factory=dict)

    @property
    def best_rank(self) -> int:
        """The better of the two legs' ranks (1,000,000 when neither ranked it). Every sort of
        the candidates reads it, several times a recall each."""
        vec, kw = self.vec_rank, self.kw_rank
        if vec is None:
            return 1_000_000 if kw is None else kw
        return vec if kw is None or vec < kw else kw


@dataclass(frozen=True, slots=True)
class Weights:
    w_rrf: float
    w_semantic: float
    w_keyword: float
    w_graph: float
    w_importance: float
    w_recency: float
    rrf_k: float
    half_life_days: float


def score_plane(c: Candidate, w: Weights, n_tokens: int, recency_value: float,
                importance: float) -> float:
    semantic = min(1.0, max(0.0, c.cosine)) if c.cosine is not None else 0.0
    keyword = min(1.0, max(0.0, c.kw_raw / max(n_tokens, 1))) if c.kw_raw is not None else 0.0
    fused = rrf(c.vec_rank, c.kw_rank, w.rrf_k)
    c.parts = {"rrf": fused, "semantic": semantic, "keyword": keyword,
               "graph": c.graph_proximity, "importance": importance, "recency": recency_value,
               "penalty": 0.0}
    return (w.w_rrf * fused + w.w_semantic * semantic + w.w_keyword * keyword
            + w.w_graph * c.graph_proximity + w.w_importance * importance
            + w.w_recency * recency_value)


SUPERSEDED_PENALTY = 0.3
SYNCD_IMPORTANCE_SCALE = 0.1
SYNCD_RECENCY_SCALE = 0.1
SYNCD_GRAPH_SCALE = 0.5


def score_syncd(c: Candidate, w: Weights, recency_value: float, importance: float,
                superseded: bool) -> float:
    """Evidence scaled by the priors (module docstring). The keyword
    rank's RRF vote is weighted by ``c.kw_vote``: whole for a strict hit, and for a hit of the
    relaxed (OR) query the share of the query's specific words it holds (``specific_words``).
    A partial match on common words ("version", "live", "team") is no evidence — as a whole
    vote it put such matches above the nearest memory of paraphrases, which share no word with
    their answer — while one that holds the name or identifier the query asks about is."""
    semantic = min(1.0, max(0.0, c.cosine)) if c.cosine is not None else 0.0
    keyword = min(1.0, max(0.0, c.kw_raw)) if c.kw_raw is not None else 0.0
    relevance = max(semantic, keyword) + 0.3 * min(semantic, keyword)
    fused = rrf(c.vec_rank, None, w.rrf_k) + c.kw_vote * rrf(None, c.kw_rank, w.rrf_k)
    penalty = SUPERSEDED_PENALTY if superseded else 0.0
    name = (c.row or {}).get("memory_type") == "entity"  # no graph term, no recency (above)
    graph = 0.0 if name else c.graph_proximity
    recency_value = 0.0 if name else recency_value
    c.parts = {"rrf": fused, "semantic": semantic, "keyword": keyword,
               "graph": graph, "importance": importance, "recency": recency_value,
               "penalty": penalty}
    evidence = (relevance + w.w_rrf * fused
                + SYNCD_GRAPH_SCALE * w.w_graph * graph * c.seed_relevance - penalty)
    prior = (1.0 + SYNCD_IMPORTANCE_SCALE * w.w_importance * importance
             + SYNCD_RECENCY_SCALE * w.w_recency * recency_value)
    return evidence * prior if evidence > 0 else evidence


def order(candidates: Iterable[Candidate]) -> list[Candidate]:
    """Score descending; ties by best rank, then id — deterministic everywhere."""
    return sorted(candidates, key=lambda c: (-c.score, c.best_rank, c.id))


FALLBACK_HEADING = "No memory matched the query. The most important recent memories:\n"
UNCONFIDENT_HEADING = ("No memory matched the query with confidence. The nearest memories, "
                       "which may not answer it:\n")
LESS_CERTAIN_HEADING = "\nLess certain matches:\n"


def build_context(memories: Sequence[RetrievedMemory], linked: Sequence[Linked],
                  fallback: bool = False, matched: bool | None = None) -> str:
    """The plane's ``context`` text, byte for byte (contract §6 step 12) — but for syncd's
    answers, whose headings say how sure they are: an agent handed the text alone would take
    "Relevant memories:" at its word. A fallback answer says that nothing matched; an answer
    with no ``confident`` memory (``matched`` False) that none surely answers the query; one
    with some lists them first, then the rest as less certain. ``matched`` None (the plane's
    algorithm) lists them all as relevant."""
    if not memories:
        return ""
    if fallback:
        groups = [(FALLBACK_HEADING, list(memories))]
    elif matched is None:
        groups = [("Relevant memories:\n", list(memories))]
    elif not matched:
        groups = [(UNCONFIDENT_HEADING, list(memories))]
    else:
        groups = [("Relevant memories:\n", [m for m in memories if m.confident]),
                  (LESS_CERTAIN_HEADING, [m for m in memories if not m.confident])]
    lines: list[str] = []
    for heading, group in groups:
        if group:
            lines.append(heading)
            lines.extend(_context_line(m) for m in group)
    if linked:
        lines.append("\nConnected resources/traces:\n")
        for link in linked[:20]:
            lines.append(f"- {link.node_id} ({link.target_namespace or ''}) via {link.edge_type}\n")
    return "".join(lines)


_FRACTION = re.compile(r"(T[0-9]{2}:[0-9]{2}:[0-9]{2})[.,][0-9]+")


def _to_the_second(stamp: str) -> str:
    """An RFC 3339 stamp as a person reads it in the context: no fraction of a second (the
    stored ``valid_at`` has nanoseconds, which every line of an injected prompt repeated)."""
    return _FRACTION.sub(r"\1", stamp, count=1)


def _context_line(m: RetrievedMemory) -> str:
    if m.invalid_at:
        validity = f" (invalidated {_to_the_second(m.invalid_at)})"
    elif m.valid_at:
        validity = f" (since {_to_the_second(m.valid_at)})"
    else:
        validity = ""
    via = f" [via {m.via.type}]" if m.via is not None else ""
    return f"- [{m.memory_type}] {m.content_preview}{validity}{via} (score {m.score:.2f}) {m.id}\n"


def dedupe_linked(linked: list[Linked], cap: int = 50) -> list[Linked]:
    """Stable sort by depth, drop adjacent equal node ids (as the plane), then cap."""
    out: list[Linked] = []
    for link in sorted(linked, key=lambda item: item.depth):
        if out and out[-1].node_id == link.node_id:
            continue
        out.append(link)
    return out[:cap]

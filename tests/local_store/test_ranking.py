"""Pure ranking functions, table-driven."""

from __future__ import annotations

import math

import msgspec
import pytest

from local_store.ranking import (
    Candidate,
    build_context,
    cosine_distance,
    coverage,
    dedupe_linked,
    fts_match,
    recency,
    rrf,
    tokenize,
)
from protocol.query import Linked, RetrievedMemory, Via

DAY = 86_400 * 1_000_000_000


@pytest.mark.parametrize(("text", "tokens"), [
    ("How do I deploy?", ["how", "do", "deploy"]),
    ("InvoiceService.finalize E1042", ["invoiceservice", "finalize", "e1042"]),
    ("src/billing/invoice.py", ["src", "billing", "invoice", "py"]),
    ("BILLING_DB_URL billing", ["billing", "db", "url"]),
    ("a b c", []),
    ('"NEAR( * unbalanced "quote', ["near", "unbalanced", "quote"]),
    ("Ünïcode café", ["ünïcode", "café"]),
])
def test_tokenize_like_the_plane(text: str, tokens: list[str]) -> None:
    assert tokenize(text) == tokens


@pytest.mark.parametrize(("tokens", "relaxed", "expected"), [
    (["deploy", "billing"], False, '"deploy" AND "billing"'),
    (["how", "do", "deploy"], True, '"deploy"'),
    (["how", "do", "deploy"], False, '"deploy"'),
    (["how", "do"], False, '"how" AND "do"'),
    (["how", "do"], True, None),
    ([], False, None),
    (['we"ird'], False, '"we""ird"'),
])
def test_fts_match_quotes_every_token(tokens: list[str], relaxed: bool,
                                      expected: str | None) -> None:
    assert fts_match(tokens, relaxed=relaxed) == expected


def test_rrf_uses_zero_based_ranks() -> None:
    assert rrf(0, None, 60) == pytest.approx(1 / 60)
    assert rrf(0, 0, 60) == pytest.approx(2 / 60)
    assert rrf(None, None, 60) == 0.0


@pytest.mark.parametrize(("age_days", "half", "expected"), [
    (0, 30, 1.0), (-1, 30, 1.0), (30, 30, 0.5), (60, 30, 0.25), (30, 0, 0.5),
])
def test_recency(age_days: float, half: float, expected: float) -> None:
    now = 1_800_000_000 * 1_000_000_000
    assert recency(now - int(age_days * DAY), now, half) == pytest.approx(expected)
    assert recency(None, now, half) == 0.5
    assert math.isclose(recency(now - DAY // 2, now, 30), math.exp(-math.log(2) * 0.5 / 30))


@pytest.mark.parametrize(("cosine", "distance"), [
    (None, None), (1.0000001, 0.0), (1.0, 0.0), (0.25, 0.75), (-1.0, 2.0), (-1.0000001, 2.0),
])
def test_cosine_distance_stays_in_the_planes_range(cosine: float | None,
                                                   distance: float | None) -> None:
    assert cosine_distance(cosine) == (None if distance is None else pytest.approx(distance))


def test_coverage_ignores_stopwords() -> None:
    assert coverage(["how", "deploy", "billing"], "Deploy the app") == 0.5
    assert coverage(["how", "do"], "how do I") == 1.0  # all stopwords: they count


def test_coverage_is_over_the_words_the_keyword_query_used() -> None:
    tokens = [f"w{i:02d}x" for i in range(40)]  # the keyword query looks for the first 32
    assert coverage(tokens, " ".join(tokens[:32])) == 1.0
    assert coverage(tokens, " ".join(tokens[32:])) == 0.0


def test_context_format_is_the_planes() -> None:
    m1 = RetrievedMemory(id="memory:1", memory_type="fact", title=None, content_preview="A",
                         score=1.234, distance=None, kw_score=None, graph_proximity=0.0,
                         importance=0.5, realm="p", valid_at="V", invalid_at=None, via=None)
    m2 = RetrievedMemory(id="memory:2", memory_type="decision", title=None, content_preview="B",
                         score=0.5, distance=None, kw_score=None, graph_proximity=0.5,
                         importance=0.5, realm="p", valid_at="V", invalid_at="I",
                         via=Via(seed="memory:1", type="RELATES_TO", depth=1))
    linked = [Linked(node_id="github::repo:x", target_namespace="github",
                     edge_type="REFERENCES", depth=1),
              Linked(node_id="n", target_namespace=None, edge_type="T", depth=2)]
    assert build_context([m1, m2], linked) == (
        "Relevant memories:\n"
        "- [fact] A (since V) (score 1.23) memory:1\n"
        "- [decision] B (invalidated I) [via RELATES_TO] (score 0.50) memory:2\n"
        "\nConnected resources/traces:\n"
        "- github::repo:x (github) via REFERENCES\n"
        "- n () via T\n")
    assert build_context([], linked) == ""


def test_context_stamps_are_shown_to_the_second() -> None:
    memory = RetrievedMemory(id="memory:1", memory_type="fact", title=None,
                             content_preview="A", score=1.0, distance=None, kw_score=None,
                             graph_proximity=0.0, importance=0.5, realm="p",
                             valid_at="2026-12-02T14:11:34.290608744+00:00", invalid_at=None,
                             via=None)
    assert build_context([memory], []) == (
        "Relevant memories:\n- [fact] A (since 2026-12-02T14:11:34+00:00) (score 1.00) memory:1\n")
    gone = msgspec.structs.replace(memory, invalid_at="2026-12-03T01:02:03.5Z")
    assert "(invalidated 2026-12-03T01:02:03Z)" in build_context([gone], [])


def test_linked_dedupes_adjacent_after_depth_sort() -> None:
    a1 = Linked(node_id="a", target_namespace=None, edge_type="T", depth=2)
    a2 = Linked(node_id="a", target_namespace=None, edge_type="T", depth=1)
    b = Linked(node_id="b", target_namespace=None, edge_type="T", depth=1)
    assert [x.node_id for x in dedupe_linked([a1, b, a2])] == ["b", "a"]


def test_best_rank() -> None:
    assert Candidate("x", vec_rank=3, kw_rank=1).best_rank == 1

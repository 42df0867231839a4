"""Recall quality on the synthetic coding-memory corpus (bench/data/recall_corpus.json).

Loads the corpus into a fresh store (memories with their ages, supersessions as invalidations
with INVALIDATES edges, entities, edges), runs every query in four modes — keyword-only,
vector-only, the control plane's exact algorithm, and syncd's default — and prints recall@5,
recall@10, MRR (over queries with relevant memories) and the nonsense-query false-hit rate
(share of nonsense queries that return any memory not marked as a fallback), in groups:

  * ``nonsense`` (23): syncd's cosine gate was tuned on them;
  * ``heldout`` (99): written after that tuning, as an out-of-sample check (39 blind, by a
    session that never saw the recall code) — and then used, with ``nonsense``, to set the
    off-topic gate (``OFF_TOPIC_GATE``), so no longer out of sample;
  * ``heldout set 2`` (45, ``"set": 2``): written blind by another such session after the
    off-topic gate's threshold was fixed; run with it, then again after ``QUERY_COSINE_SURE``
    was added (one more cleared the gates);
  * ``heldout set 3`` (25, ``"set": 3``): short search-box queries, written blind by a third
    session, with 40 short real ones; it decided for ``QUERY_COSINE_SURE``;
  * ``heldout set 4`` (60, ``"set": 4``): five kinds of nonsense, with 40 paraphrases and 20
    short keyword queries, written blind by a fourth session and run once on the gates as they
    stood (no gate was set on it);
  * ``heldout set 5`` (40, ``"set": 5``): agent-style lookups, with 40 paraphrases and 20
    keyword queries, written blind by a fifth session after the RRF change for relaxed hits
    (``ranking.score_syncd``) and run once;
  * ``heldout set 6`` (40, ``"set": 6``): questions a developer in these projects could ask
    whose answer the store does not hold (most about software, services or decisions next to
    what it does hold), with 40 paraphrases and 20 keyword queries, written blind by a sixth
    session and run once on the code as it stood;
  * ``heldout set 7`` (40, ``"set": 7``): five kinds (software the store never mentions, agent
    tasks about absent decisions, generic programming, everyday, gibberish or puns), with 40
    paraphrases and 20 keyword queries, written blind by a seventh session and run once on the
    same code.

The blind sets' answered queries are reported apart in ``--by-kind`` ("paraphrase set 2", ...),
with each set's MRR over its answered queries, and so is syncd's false-hit rate per kind of
blind held-out query (the part of its note after " — ": gibberish, everyday off-topic, software
the store never mentions, ...).

    .venv/bin/python bench/recall_eval.py [--embedder minilm|hashing] [--by-kind] [--corpus F]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from local_store import HashingEmbedder, Store  # noqa: E402
from local_store.embed import Embedder  # noqa: E402
from local_store.records import entity_content  # noqa: E402
from protocol.rows import EdgeRow, NodeRow  # noqa: E402
from protocol.timestamp import format_ns  # noqa: E402

MODES = ("keyword", "vector", "plane", "syncd")
DAY_NS = 86_400 * 1_000_000_000


def load_embedder(name: str) -> Embedder:
    if name == "hashing":
        return HashingEmbedder()
    from local_store.embed_minilm import MiniLMEmbedder
    return MiniLMEmbedder()


async def load_corpus(store: Store, corpus: dict[str, Any], now_ns: int) -> dict[str, str]:
    """Write the corpus through ``apply`` (so ages are real); returns key → memory id."""
    ids: dict[str, str] = {}
    items: list[tuple[str, dict[str, Any], str]] = []
    for m in corpus["memories"]:
        items.append((m["key"], m, m["content"]))
    for e in corpus["entities"]:
        content = entity_content(e["name"], e.get("kind"), e.get("properties") or {}, None, None)
        items.append((e["key"], {**e, "memory_type": "entity", "title": e["name"],
                                 "tags": [f"kind:{e['kind']}"] if e.get("kind") else []},
                      content))
    for key, _, _ in items:
        ids[key] = f"memory:{uuid.uuid5(uuid.NAMESPACE_URL, key)}"
    superseded = {s["old"]: s["new"] for s in corpus.get("supersessions", [])}
    vectors = store.embedder.embed([content for _, _, content in items])
    nodes = []
    for (key, m, content), vector in zip(items, vectors, strict=True):
        stamp = format_ns(now_ns - int(float(m.get("age_days", 0)) * DAY_NS))
        invalid_at = superseded_by = None
        if key in superseded:
            newer = next(x for x in corpus["memories"] if x["key"] == superseded[key])
            invalid_at = format_ns(now_ns - int(float(newer.get("age_days", 0)) * DAY_NS))
            superseded_by = ids[superseded[key]]
        nodes.append(NodeRow(
            id=ids[key], labels="Memory", realm=m.get("realm", "default"),
            memory_type=m.get("memory_type", "fact"), title=m.get("title"), content=content,
            tags=",".join(m.get("tags") or []), importance=float(m.get("importance", 0.5)),
            status="active", embedding=[float(x) for x in vector], created_at=stamp,
            updated_at=stamp, valid_at=stamp, invalid_at=invalid_at, superseded_by=superseded_by,
            topic_key=m.get("topic_key")))
    edges = [EdgeRow(src=ids[e["src"]], dst=ids.get(e["dst"], e["dst"]), type=e["type"],
                     realm=next((n.realm for n in nodes if n.id == ids[e["src"]]), None),
                     created_at=format_ns(now_ns)) for e in corpus.get("edges", [])]
    edges += [EdgeRow(src=ids[new], dst=ids[old], type="INVALIDATES",
                      created_at=format_ns(now_ns)) for old, new in superseded.items()]
    result = await store.apply(nodes, edges, model=store.embedder.model_id)
    if result.problems:
        raise SystemExit(f"corpus rows rejected: {result.problems[:3]}")
    return ids


async def evaluate(embedder_name: str, by_kind: bool, corpus: dict[str, Any]) -> None:
    embedder = load_embedder(embedder_name)
    with tempfile.TemporaryDirectory() as tmp:
        store = await Store.open(Path(tmp), embedder=embedder)
        try:
            t0 = time.perf_counter()
            ids = await load_corpus(store, corpus, time.time_ns())
            load_s = time.perf_counter() - t0
            stats: dict[str, dict[str, list[float]]] = {m: {} for m in MODES}
            latency: dict[str, list[float]] = {m: [] for m in MODES}
            blind_hits: dict[str, list[bool]] = {}  # syncd's, per blind held-out kind
            for q in corpus["queries"]:
                relevant = {ids[k] for k in q["relevant"]}
                for mode in MODES:
                    t = time.perf_counter()
                    res = await store.recall({"query": q["query"], "realms": q.get("realms", []),
                                              "limit": 10, "include_invalidated": q.get(
                                                  "include_invalidated", False)},
                                             mode=mode)  # type: ignore[arg-type]
                    latency[mode].append((time.perf_counter() - t) * 1000)
                    got = [m.id for m in res.memories if not m.fallback]
                    row = stats[mode].setdefault(_group(q), [])
                    row.append(_metrics(got, relevant))  # type: ignore[arg-type]
                    if mode == "syncd" and (kind := blind_kind(q)) is not None:
                        blind_hits.setdefault(kind, []).append(bool(got))
        finally:
            await store.close()
    print(f"corpus: {len(corpus['memories'])} memories, {len(corpus['entities'])} entities, "
          f"{len(corpus['edges'])} edges, {len(corpus['queries'])} queries; embedder "
          f"{embedder.model_id}; load {load_s:.1f} s")
    no_answer = no_answer_columns(corpus["queries"])
    _print_table(stats, latency, no_answer)
    if by_kind:
        _print_by_kind(stats, no_answer)
        _print_by_set(stats, no_answer)
        _print_blind_kinds(blind_hits)


# Groups with no relevant memory, and their columns: the tuning set, the first held-out set,
# and each blind set written later (``"set": n``), found in the corpus (``no_answer_columns``).
NO_ANSWER = {"nonsense": "nonsense hit", "heldout": "held-out hit"}


def no_answer_columns(queries: list[dict[str, Any]]) -> dict[str, str]:
    """``NO_ANSWER`` plus a "blind-n hit" column for each blind set's held-out queries."""
    blind = sorted({q["set"] for q in queries if q["kind"] == "heldout" and "set" in q})
    return NO_ANSWER | {f"heldout set {n}": f"blind-{n} hit" for n in blind}


def blind_kind(q: dict[str, Any]) -> str | None:
    """A blind held-out query's kind, as its note names it after " — " ("set 4: gibberish");
    None for any other query."""
    if q["kind"] != "heldout" or "set" not in q:
        return None
    _, dash, kind = str(q.get("note", "")).partition(" — ")
    return f"set {q['set']}: {kind.strip()}" if dash and kind.strip() else None


def _group(q: dict[str, Any]) -> str:
    """A query's kind, with a later blind set apart (``"set": 2``: "paraphrase set 2")."""
    return f"{q['kind']} set {q['set']}" if "set" in q else str(q["kind"])


def _metrics(got: list[str], relevant: set[str]) -> tuple[float, float, float, float]:
    if not relevant:
        return (float("nan"), float("nan"), float("nan"), 1.0 if got else 0.0)
    r5 = len(relevant & set(got[:5])) / len(relevant)
    r10 = len(relevant & set(got[:10])) / len(relevant)
    rr = next((1.0 / (i + 1) for i, mid in enumerate(got[:10]) if mid in relevant), 0.0)
    return (r5, r10, rr, float("nan"))


def _mean(values: list[float]) -> float:
    vals = [v for v in values if v == v]
    return sum(vals) / len(vals) if vals else float("nan")


def _print_table(stats: dict[str, dict[str, list[Any]]], latency: dict[str, list[float]],
                 no_answer: dict[str, str]) -> None:
    print(f"{'mode':<10}{'recall@5':>10}{'recall@10':>11}{'MRR':>8}"
          + "".join(f"{column:>14}" for column in no_answer.values()) + f"{'p50 ms':>9}")
    for mode in MODES:
        rows = [r for kind, items in stats[mode].items() if kind not in no_answer for r in items]
        hits = [_mean([r[3] for r in stats[mode].get(group, [])]) for group in no_answer]
        lat = sorted(latency[mode])
        print(f"{mode:<10}{_mean([r[0] for r in rows]):>10.3f}{_mean([r[1] for r in rows]):>11.3f}"
              f"{_mean([r[2] for r in rows]):>8.3f}" + "".join(f"{hit:>14.3f}" for hit in hits)
              + f"{lat[len(lat) // 2]:>9.2f}")


def _print_by_kind(stats: dict[str, dict[str, list[Any]]], no_answer: dict[str, str]) -> None:
    kinds = sorted({k for mode in MODES for k in stats[mode] if k not in no_answer})
    print("\nMRR by query kind")
    print(f"{'kind':<18}" + "".join(f"{m:>10}" for m in MODES) + f"{'n':>5}")
    for kind in kinds:
        cells = "".join(f"{_mean([r[2] for r in stats[m][kind]]):>10.3f}" for m in MODES)
        print(f"{kind:<18}{cells}{len(stats['syncd'][kind]):>5}")


def _print_by_set(stats: dict[str, dict[str, list[Any]]], no_answer: dict[str, str]) -> None:
    """MRR over each set's answered queries (set 1: the queries with no ``"set"``, on which the
    gates were tuned; each later set was written blind and run once)."""
    rr: dict[str, dict[int, list[float]]] = {mode: {} for mode in MODES}
    for mode in MODES:
        for group, rows in stats[mode].items():
            if group not in no_answer:
                _, marker, number = group.rpartition(" set ")
                rr[mode].setdefault(int(number) if marker else 1, []).extend(r[2] for r in rows)
    print("\nMRR by set (answered queries; set 1 tuned the gates)")
    print(f"{'set':<18}" + "".join(f"{m:>10}" for m in MODES) + f"{'n':>5}")
    for number in sorted(rr["syncd"]):
        cells = "".join(f"{_mean(rr[m][number]):>10.3f}" for m in MODES)
        print(f"{number:<18}{cells}{len(rr['syncd'][number]):>5}")


def _print_blind_kinds(hits: dict[str, list[bool]]) -> None:
    """syncd's false hits per kind of blind held-out query, with the counts."""
    if not hits:
        return
    print("\nsyncd false hits by kind of blind held-out query")
    width = max(len(kind) for kind in hits) + 2
    for kind in sorted(hits, key=lambda k: (int(k.split(":")[0].split()[1]), k)):
        got = hits[kind]
        print(f"{kind:<{width}}{sum(got):>4} of {len(got):<4}{sum(got) / len(got):>7.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--embedder", choices=("minilm", "hashing"), default="minilm")
    parser.add_argument("--by-kind", action="store_true")
    parser.add_argument("--corpus", type=Path, default=ROOT / "bench/data/recall_corpus.json")
    args = parser.parse_args()
    try:
        corpus = json.loads(args.corpus.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        parser.error(f"--corpus: cannot read {args.corpus} as a JSON corpus ({exc})")
    if not isinstance(corpus, dict) or not {"memories", "queries"} <= corpus.keys():
        parser.error(f"--corpus: {args.corpus} is not a corpus (an object with "
                     f"\"memories\" and \"queries\"; bench/data/check_corpus.py checks one)")
    asyncio.run(evaluate(args.embedder, args.by_kind, corpus))


if __name__ == "__main__":
    main()

"""Recall quality on the synthetic coding-memory corpus (bench/data/recall_corpus.json), in
both of syncd's tiers.

Loads the corpus into a fresh store (memories with their ages, supersessions as invalidations
with INVALIDATES edges, entities, edges) and runs every query in four modes — keyword-only,
vector-only, the control plane's exact algorithm, and syncd's default:

  * explicit search, every mode: recall@5, recall@10 and MRR over the queries with relevant
    memories (fallback memories count as misses);
  * syncd's confident tier, what the prompt hook, ``memoryContext`` and ``verify_memory``
    inject unasked (``confident_only``): for answerable queries the share whose answer is
    among the first two confident memories ("injected"); for queries with no answer the share
    that get any confident memory ("false injection"), per group below and over all of them.

``--stress`` runs the queries on stores of other compositions built from the corpus (many
near-identical templated notes beside it, one realm alone, a tiny store, a large one) and prints
both tiers for each, and the share of (query, memory) pairs found in both that kept the
``confident`` flag they had in the corpus store: it depends on the query, the memory and fixed
generic text only (``local_store/reference.py``), so it should read 1.000.

Groups of queries with no answer. The blind sets were each written by a session that never saw
the recall code and run once on the code of their day, when one gate decided both what search
returned and what was injected; no constant of the confident tier was fitted on any of them:

  * ``nonsense`` (23): the old match gate's cosine threshold was tuned on them;
  * ``heldout`` (99): written after that tuning, as an out-of-sample check (39 blind, by a
    session that never saw the recall code) — and then used, with ``nonsense``, to set the
    old off-topic gate (since removed), so no longer out of sample;
  * ``heldout set 2`` (45, ``"set": 2``): written blind by another such session after the
    old off-topic gate's threshold was fixed;
  * ``heldout set 3`` (25, ``"set": 3``): short search-box queries, written blind by a third
    session, with 40 short real ones (a second cosine threshold of the old gate was set on it);
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
with each set's MRR over its answered queries, and so is syncd's false-injection rate per kind
of blind held-out query (the part of its note after " — "): gibberish, everyday off-topic,
software the store never mentions, ...

    .venv/bin/python bench/recall_eval.py [--embedder minilm|hashing] [--by-kind] [--stress]
                                          [--corpus F]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
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
    vectors = await asyncio.to_thread(store.embedder.embed,
                                      [content for _, _, content in items])
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
    result = await store.replication.apply(nodes, edges, model=store.embedder.model_id)
    if result.problems:
        raise SystemExit(f"corpus rows rejected: {result.problems[:3]}")
    return ids


@dataclass
class Run:
    """One store's answers: per mode and query group, (recall@5, recall@10, RR) of each
    answerable query; syncd's confident tier per group (injected, or falsely injected); the
    ``confident`` flag of each (query, memory) pair syncd returned; latencies."""

    stats: dict[str, dict[str, list[tuple[float, float, float]]]] = field(
        default_factory=lambda: {m: {} for m in MODES})
    injected: dict[str, list[bool]] = field(default_factory=dict)
    flags: dict[tuple[str, str], bool] = field(default_factory=dict)
    latency: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in MODES})
    blind: dict[str, list[bool]] = field(default_factory=dict)  # false injections per kind


async def run_queries(store: Store, ids: dict[str, str], queries: list[dict[str, Any]],
                      modes: tuple[str, ...] = MODES) -> Run:
    run = Run()
    for q in queries:
        relevant = {ids[k] for k in q["relevant"]}
        for mode in modes:
            t = time.perf_counter()
            res = await store.recall.query({"query": q["query"], "realms": q.get("realms", []),
                                      "limit": 10, "include_invalidated": q.get(
                                          "include_invalidated", False)},
                                     mode=mode)  # type: ignore[arg-type]
            run.latency[mode].append((time.perf_counter() - t) * 1000)
            got = [m.id for m in res.memories if not m.fallback]
            if relevant:
                run.stats[mode].setdefault(_group(q), []).append(_metrics(got, relevant))
            if mode != "syncd":
                continue
            confident = [m.id for m in res.memories if m.confident]
            run.flags.update(((q["id"], m.id), m.confident) for m in res.memories)
            hit = bool(relevant & set(confident[:2])) if relevant else bool(confident)
            run.injected.setdefault(_group(q), []).append(hit)
            if (kind := blind_kind(q)) is not None:
                run.blind.setdefault(kind, []).append(hit)
    return run


async def evaluate(embedder_name: str, by_kind: bool, stress: bool,
                   corpus: dict[str, Any]) -> None:
    embedder = load_embedder(embedder_name)
    with tempfile.TemporaryDirectory() as tmp:
        store = await Store.open(Path(tmp), embedder=embedder)
        try:
            t0 = time.perf_counter()
            ids = await load_corpus(store, corpus, time.time_ns())
            load_s = time.perf_counter() - t0
            run = await run_queries(store, ids, corpus["queries"])
        finally:
            await store.close()
    print(f"corpus: {len(corpus['memories'])} memories, {len(corpus['entities'])} entities, "
          f"{len(corpus['edges'])} edges, {len(corpus['queries'])} queries; embedder "
          f"{embedder.model_id}; load {load_s:.1f} s")
    no_answer = no_answer_columns(corpus["queries"])
    _print_table(run)
    _print_confident(run, no_answer)
    if by_kind:
        _print_by_kind(run, no_answer)
        _print_by_set(run.stats, no_answer)
        _print_blind_kinds(run.blind)
    if stress:
        await _print_stress(embedder, corpus, run)


# Groups with no relevant memory, and their names: the tuning set, the first held-out set, and
# each blind set written later (``"set": n``), found in the corpus (``no_answer_columns``).
NO_ANSWER = {"nonsense": "nonsense", "heldout": "held-out"}


def no_answer_columns(queries: list[dict[str, Any]]) -> dict[str, str]:
    """``NO_ANSWER`` plus a "blind-n" group for each blind set's held-out queries."""
    blind = sorted({q["set"] for q in queries if q["kind"] == "heldout" and "set" in q})
    return NO_ANSWER | {f"heldout set {n}": f"blind-{n}" for n in blind}


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


def _metrics(got: list[str], relevant: set[str]) -> tuple[float, float, float]:
    r5 = len(relevant & set(got[:5])) / len(relevant)
    r10 = len(relevant & set(got[:10])) / len(relevant)
    rr = next((1.0 / (i + 1) for i, mid in enumerate(got[:10]) if mid in relevant), 0.0)
    return (r5, r10, rr)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _answered(run: Run, mode: str) -> list[tuple[float, float, float]]:
    return [r for rows in run.stats[mode].values() for r in rows]


def _print_table(run: Run) -> None:
    print("\nexplicit search")
    print(f"{'mode':<10}{'recall@5':>10}{'recall@10':>11}{'MRR':>8}{'p50 ms':>9}{'p95 ms':>9}")
    for mode in MODES:
        rows, lat = _answered(run, mode), sorted(run.latency[mode])
        print(f"{mode:<10}{_mean([r[0] for r in rows]):>10.3f}{_mean([r[1] for r in rows]):>11.3f}"
              f"{_mean([r[2] for r in rows]):>8.3f}{lat[len(lat) // 2]:>9.2f}"
              f"{lat[int(len(lat) * 0.95)]:>9.2f}")


def _confident_rows(run: Run, no_answer: dict[str, str]) -> list[tuple[str, int, float]]:
    """(group, n, share): answerable queries whose answer is injected, then the false
    injections of each group with no answer and of all of them."""
    answerable = [hit for group, hits in run.injected.items() if group not in no_answer
                  for hit in hits]
    rows = [("answerable: answer injected", len(answerable), _mean([float(h) for h in answerable]))]
    everything: list[bool] = []
    for group, name in no_answer.items():
        hits = run.injected.get(group, [])
        everything += hits
        rows.append((f"{name}: false injection", len(hits), _mean([float(h) for h in hits])))
    rows.append(("all no-answer: false injection", len(everything),
                 _mean([float(h) for h in everything])))
    return rows


def _print_confident(run: Run, no_answer: dict[str, str]) -> None:
    print("\nsyncd confident tier (what is injected unasked; the first 2 confident memories)")
    print(f"{'group':<34}{'n':>5}{'share':>8}")
    for name, n, share in _confident_rows(run, no_answer):
        print(f"{name:<34}{n:>5}{share:>8.3f}")


def _print_by_kind(run: Run, no_answer: dict[str, str]) -> None:
    kinds = sorted({k for mode in MODES for k in run.stats[mode] if k not in no_answer})
    print("\nMRR by query kind (injected: syncd's confident tier)")
    print(f"{'kind':<18}" + "".join(f"{m:>10}" for m in MODES) + f"{'injected':>10}{'n':>5}")
    for kind in kinds:
        cells = "".join(f"{_mean([r[2] for r in run.stats[m][kind]]):>10.3f}" for m in MODES)
        injected = _mean([float(h) for h in run.injected[kind]])
        print(f"{kind:<18}{cells}{injected:>10.3f}{len(run.stats['syncd'][kind]):>5}")


def _print_by_set(stats: dict[str, dict[str, list[Any]]], no_answer: dict[str, str]) -> None:
    """MRR over each set's answered queries (set 1: the queries with no ``"set"``, on which the
    old gates were tuned; each later set was written blind)."""
    rr: dict[str, dict[int, list[float]]] = {mode: {} for mode in MODES}
    for mode in MODES:
        for group, rows in stats[mode].items():
            if group not in no_answer:
                _, marker, number = group.rpartition(" set ")
                rr[mode].setdefault(int(number) if marker else 1, []).extend(r[2] for r in rows)
    print("\nMRR by set (answered queries; set 1 tuned the old gates)")
    print(f"{'set':<18}" + "".join(f"{m:>10}" for m in MODES) + f"{'n':>5}")
    for number in sorted(rr["syncd"]):
        cells = "".join(f"{_mean(rr[m][number]):>10.3f}" for m in MODES)
        print(f"{number:<18}{cells}{len(rr['syncd'][number]):>5}")


def _print_blind_kinds(hits: dict[str, list[bool]]) -> None:
    """syncd's false injections per kind of blind held-out query, with the counts."""
    if not hits:
        return
    print("\nsyncd false injections by kind of blind held-out query")
    width = max(len(kind) for kind in hits) + 2
    for kind in sorted(hits, key=lambda k: (int(k.split(":")[0].split()[1]), k)):
        got = hits[kind]
        print(f"{kind:<{width}}{sum(got):>4} of {len(got):<4}{sum(got) / len(got):>7.3f}")


# --stress: near-identical notes as agents write them (one per service and fact), never about
# the corpus's own services.
STRESS_SERVICES = [f"{a}-{b}" for a in ("amber", "basalt", "cedar", "delta", "ember", "fjord",
                                       "granite", "harbor", "indigo", "juniper", "kestrel",
                                       "lumen", "marble", "nimbus", "onyx", "pylon")
                   for b in ("gateway", "indexer", "relay", "scheduler", "ledgerd", "mailer",
                             "tracker", "vault", "courier", "sentinel")]
STRESS_TEMPLATES = (
    "{svc} exposes Prometheus metrics on port {port}.",
    "{svc} answers its health check at GET /healthz on port {port}.",
    "{svc} logs JSON to stdout; Loki keeps them for {days} days.",
    "{svc} runs {replicas} replicas in the shared Kubernetes cluster.",
    "On-call for {svc} is the {team} team; page them through PagerDuty.",
    "{svc} reads its settings from /etc/{svc}/config.yaml at start-up.",
    "{svc} retries failed calls {replicas} times with exponential backoff.",
    "The Grafana dashboard for {svc} is named '{svc} overview'.",
)
STRESS_TEAMS = ("platform", "payments", "growth", "data", "identity", "search")


def templated_notes(n: int) -> list[str]:
    """``n`` distinct templated notes, deterministic: every template for one service, then the
    next service (and round again with other numbers once all are used)."""
    notes = []
    for i in range(n):
        service = STRESS_SERVICES[(i // len(STRESS_TEMPLATES)) % len(STRESS_SERVICES)]
        lap = i // (len(STRESS_TEMPLATES) * len(STRESS_SERVICES))
        notes.append(STRESS_TEMPLATES[i % len(STRESS_TEMPLATES)].format(
            svc=service if not lap else f"{service}-{lap}", port=9100 + i % 97,
            days=7 + i % 24, replicas=2 + i % 5, team=STRESS_TEAMS[i % len(STRESS_TEAMS)]))
    return notes


def sub_corpus(corpus: dict[str, Any], keys: set[str]) -> dict[str, Any]:
    """The corpus cut to the memories and entities of ``keys``, with the edges, supersessions
    and answerable queries among them (and every query with no answer)."""
    every = {m["key"] for m in corpus["memories"]} | {e["key"] for e in corpus["entities"]}
    return {
        "memories": [m for m in corpus["memories"] if m["key"] in keys],
        "entities": [e for e in corpus["entities"] if e["key"] in keys],
        # an edge to a node outside the corpus (a file, a trace) stays with its source
        "edges": [e for e in corpus.get("edges", []) if e["src"] in keys
                  and (e["dst"] in keys or e["dst"] not in every)],
        "supersessions": [s for s in corpus.get("supersessions", [])
                          if s["old"] in keys and s["new"] in keys],
        "queries": [q for q in corpus["queries"] if set(q["relevant"]) <= keys],
    }


async def add_templated(store: Store, n: int, now_ns: int) -> None:
    """``n`` templated notes beside what the store holds, embedded a batch at a time."""
    notes = templated_notes(n)
    stamp = format_ns(now_ns)
    for start in range(0, n, 512):
        batch = notes[start:start + 512]
        vectors = await asyncio.to_thread(store.embedder.embed, batch)
        await store.replication.apply([NodeRow(
            id=f"memory:{uuid.uuid5(uuid.NAMESPACE_URL, 'stress:' + note)}", labels="Memory",
            realm="global", memory_type="fact", content=note, tags="ops", importance=0.5,
            status="active", embedding=[float(x) for x in vector], created_at=stamp,
            updated_at=stamp, valid_at=stamp) for note, vector in zip(batch, vectors,
                                                                       strict=True)],
            [], model=store.embedder.model_id)


async def _print_stress(embedder: Embedder, corpus: dict[str, Any], base: Run) -> None:
    every = {m["key"] for m in corpus["memories"]} | {e["key"] for e in corpus["entities"]}
    realm = "billing-api"
    one_realm = {k for k in every if next(
        x.get("realm", "default") for x in corpus["memories"] + corpus["entities"]
         if x["key"] == k) == realm}
    tiny = set(sorted(k for k in one_realm if not k.startswith("ent-"))[:30])
    size = len(every)
    cases = [("corpus", corpus, 0), ("80% templated", corpus, 4 * size),
             (f"one realm ({realm})", sub_corpus(corpus, one_realm), 0),
             ("tiny (30 memories)", sub_corpus(corpus, tiny), 0),
             ("large (+10,000 templated)", corpus, 10_000)]
    no_answer = no_answer_columns(corpus["queries"])
    print("\nstore composition (explicit MRR; confident tier: answer injected, false "
          "injection; confident flags kept from the corpus store)")
    print(f"{'store':<28}{'memories':>9}{'answ.':>7}{'MRR':>7}{'injected':>10}{'no-ans.':>8}"
          f"{'false':>7}{'nonsense':>10}{'flags kept':>12}")
    for name, cut, extra in cases:
        with tempfile.TemporaryDirectory() as tmp:
            store = await Store.open(Path(tmp), embedder=embedder)
            try:
                now = time.time_ns()
                ids = await load_corpus(store, cut, now)
                if extra:
                    await add_templated(store, extra, now)
                run = (base if name == "corpus" else
                       await run_queries(store, ids, cut["queries"], modes=("syncd",)))
                held = len(cut["memories"]) + len(cut["entities"]) + extra
            finally:
                await store.close()
        rows = {row[0]: row for row in _confident_rows(run, no_answer)}
        answerable = rows["answerable: answer injected"]
        nothing = rows["all no-answer: false injection"]
        nonsense = rows["nonsense: false injection"]
        shared = [pair for pair in run.flags if pair in base.flags]
        kept = _mean([float(run.flags[p] == base.flags[p]) for p in shared])
        mrr = _mean([r[2] for r in _answered(run, "syncd")])
        print(f"{name:<28}{held:>9}{answerable[1]:>7}{mrr:>7.3f}{answerable[2]:>10.3f}"
              f"{nothing[1]:>8}{nothing[2]:>7.3f}{nonsense[2]:>10.3f}{kept:>12.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--embedder", choices=("minilm", "hashing"), default="minilm")
    parser.add_argument("--by-kind", action="store_true")
    parser.add_argument("--stress", action="store_true",
                        help="also run the queries on stores of other compositions")
    parser.add_argument("--corpus", type=Path, default=ROOT / "bench/data/recall_corpus.json")
    args = parser.parse_args()
    try:
        corpus = json.loads(args.corpus.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        parser.error(f"--corpus: cannot read {args.corpus} as a JSON corpus ({exc})")
    if not isinstance(corpus, dict) or not {"memories", "queries"} <= corpus.keys():
        parser.error(f"--corpus: {args.corpus} is not a corpus (an object with "
                     f"\"memories\" and \"queries\"; bench/data/check_corpus.py checks one)")
    asyncio.run(evaluate(args.embedder, args.by_kind, args.stress, corpus))


if __name__ == "__main__":
    main()

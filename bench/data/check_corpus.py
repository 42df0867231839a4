"""Validate bench/data/recall_corpus.json and print its counts.

Usage: python bench/data/check_corpus.py [path/to/recall_corpus.json]

Exits 1 (after listing every problem) when a rule is broken. The rules:

* >= 330 memories over >= 4 realms; the six stored memory types (fact, decision, preference,
  learning, summary, procedure) all present, and >= 25 entities (the seventh type, ``entity``).
  Memory content is 1-4 sentences; keys unique across memories and entities; no duplicate content.
* >= 20 supersessions (old and new are memories of one realm, old is older), >= 40 edges
  (src a memory, dst a memory or entity, type REFERENCES | RELATES_TO | DEPENDS_ON).
* >= 130 queries with per-kind minimums; every relevant key exists and lies inside the query's
  realm filter; only ``nonsense`` and ``heldout`` queries have no relevant key. ``heldout``
  queries are nonsense written after syncd's match gates were tuned on the others, and never
  used to tune them: the eval reports their false-hit rate apart (an out-of-sample check).
* Per kind (words are lower-cased ``[a-z0-9]+`` runs minus STOPWORDS; two words match when equal
  after crude suffix stripping or when both have >= 5 letters and share the first 5, which is
  stricter than the store's unstemmed FTS5 ``unicode61`` tokenizer):
  - paraphrase: shares no word with any relevant memory's title, content or tags;
  - identifier / path: every identifier-like (path-like) token of the query occurs verbatim in
    every relevant item and in no other memory or entity;
  - current: a relevant memory is the new side of a supersession, none is an old side, and the
    old side shares a word with the query (so it is a real trap);
  - history: as current, asked with ``include_invalidated`` (so the superseded memory is
    ranked too, and the trap can fire: without it every mode's default filter drops it);
  - realm: has a realm filter, and some memory outside the filter shares >= 2 words with it;
  - graph: each relevant item shares <= 1 word with the query but is joined by an edge to a
    non-relevant seed sharing >= 2 words with it;
  - keyword: each relevant item shares >= 1 word with the query exactly (no stemming).
"""

import json
import re
import sys
from collections import Counter
from pathlib import Path

MEMORY_TYPES = ("fact", "decision", "preference", "learning", "summary", "procedure")
EDGE_TYPES = {"REFERENCES", "RELATES_TO", "DEPENDS_ON"}
KINDS = ("paraphrase", "identifier", "path", "current", "realm", "graph", "nonsense", "keyword",
         "heldout", "history")
KIND_MIN = {"paraphrase": 35, "identifier": 20, "path": 15, "current": 15, "realm": 15,
            "graph": 10, "nonsense": 20, "heldout": 60}
NO_ANSWER = ("nonsense", "heldout")  # the kinds whose queries have no relevant memory

STOPWORDS = set("""
a about above after again against all also am an and any are aren't as at be because been before
being below between both but by can can't cannot could couldn't did didn't do does doesn't doing
don't down during each either else ever every few for from further get gets getting got had hadn't
has hasn't have haven't having he her here hers herself him himself his how i if in into is isn't
it it's its itself just ll may me might more most must my myself no nor not now of off on
once one only or other ought our ours ourselves out over own per re same shall she should shouldn't
so some such than that that's the their theirs them themselves then there these they this those
through to too under until up upon us use used uses using ve very via was wasn't we were weren't
what what's when where which while who whom whose why will with within without won't would
wouldn't yet you your yours yourself yourselves s t d m o y
anything everything something nothing someone anyone everyone
""".split())

TOKEN_RE = re.compile(r"[a-z0-9]+")
SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9`\"'(<~/#@*])")
SUFFIXES = ("ations", "ation", "ings", "ing", "ies", "ied", "ers", "er", "ed", "es", "ly", "s")
IDENT_RE = re.compile(r"[A-Z].*[A-Z]|[_\d]|[a-z][A-Z]|\w\.\w")
PATH_EXT_RE = re.compile(r"\.(py|ts|tsx|js|mjs|json|ya?ml|md|html|toml|Dockerfile)/?$")


def words(text: str) -> set[str]:
    return {w for w in TOKEN_RE.findall(text.lower()) if len(w) > 1 and w not in STOPWORDS}


def stem(w: str) -> str:
    for suf in SUFFIXES:
        if w.endswith(suf) and len(w) - len(suf) >= 3:
            base = w[: -len(suf)]
            return base + "y" if suf in ("ies", "ied") else base
    return w


def shared(a: set[str], b: set[str]) -> set[str]:
    """Words of ``a`` that match some word of ``b`` (stem-equal or same 5-letter prefix)."""
    stems_b = {stem(w) for w in b}
    prefixes_b = {w[:5] for w in b if len(w) >= 5}
    return {w for w in a if stem(w) in stems_b or (len(w) >= 5 and w[:5] in prefixes_b)}


def split_tokens(query: str) -> list[str]:
    out = []
    for tok in query.split():
        tok = tok.strip("?,!;:\"'").rstrip(".")
        if tok:
            out.append(tok)
    return out


def is_path(tok: str) -> bool:
    return "/" in tok or bool(PATH_EXT_RE.search(tok))


def main() -> int:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("recall_corpus.json")
    data = json.loads(path.read_text())
    errors: list[str] = []

    def err(msg: str) -> None:
        errors.append(msg)

    for top in ("memories", "supersessions", "entities", "edges", "queries"):
        if not isinstance(data.get(top), list):
            err(f"top-level '{top}' missing or not a list")
    if errors:
        print("\n".join(errors))
        return 1

    # ---------- memories ----------
    mems = {}
    seen_content: dict[str, str] = {}
    for i, m in enumerate(data["memories"]):
        key = m.get("key")
        label = f"memory[{i}] {key!r}"
        if not isinstance(key, str) or not key:
            err(f"{label}: bad key")
            continue
        if key in mems:
            err(f"{label}: duplicate key")
        mems[key] = m
        if m.get("memory_type") not in MEMORY_TYPES:
            err(f"{label}: memory_type {m.get('memory_type')!r} not one of {MEMORY_TYPES}")
        if not isinstance(m.get("realm"), str) or not m["realm"]:
            err(f"{label}: bad realm")
        content = m.get("content")
        if not isinstance(content, str) or not content.strip():
            err(f"{label}: empty content")
            continue
        n_sent = len(SENTENCE_SPLIT.split(content.strip()))
        if not 1 <= n_sent <= 4:
            err(f"{label}: {n_sent} sentences (want 1-4)")
        norm = " ".join(content.lower().split())
        if norm in seen_content:
            err(f"{label}: same content as {seen_content[norm]!r}")
        seen_content[norm] = key
        if not isinstance(m.get("tags"), list) or not all(isinstance(t, str) for t in m["tags"]):
            err(f"{label}: tags must be a list of strings")
        imp = m.get("importance")
        if not isinstance(imp, (int, float)) or not 0 <= imp <= 1:
            err(f"{label}: importance {imp!r} not in [0, 1]")
        age = m.get("age_days")
        if not isinstance(age, int) or age < 0:
            err(f"{label}: age_days {age!r} not a non-negative int")
        if m.get("title") is not None and not isinstance(m["title"], str):
            err(f"{label}: title must be a string or null")
        if m.get("topic_key") is not None and not isinstance(m["topic_key"], str):
            err(f"{label}: topic_key must be a string or null")
    realms = {m["realm"] for m in mems.values() if isinstance(m.get("realm"), str)}

    # ---------- entities ----------
    ents = {}
    for i, e in enumerate(data["entities"]):
        key = e.get("key")
        label = f"entity[{i}] {key!r}"
        if not isinstance(key, str) or not key:
            err(f"{label}: bad key")
            continue
        if key in ents or key in mems:
            err(f"{label}: duplicate key")
        ents[key] = e
        if e.get("realm") not in realms:
            err(f"{label}: realm {e.get('realm')!r} has no memories")
        for field in ("name", "kind"):
            if not isinstance(e.get(field), str) or not e[field]:
                err(f"{label}: bad {field}")
        if not isinstance(e.get("properties"), dict):
            err(f"{label}: properties must be an object")

    def text_of(key: str) -> str:
        if key in mems:
            m = mems[key]
            return " ".join([m.get("title") or "", m["content"], " ".join(m.get("tags") or [])])
        e = ents[key]
        props = " ".join(f"{k} {v}" for k, v in e.get("properties", {}).items())
        return f"{e['name']} {e['kind']} {props}"

    def raw_of(key: str) -> str:
        """Verbatim searchable text (content for memories; name + property values for entities)."""
        if key in mems:
            return mems[key]["content"]
        e = ents[key]
        return " ".join([e["name"], *(str(v) for v in e.get("properties", {}).values())])

    def realm_of(key: str) -> str:
        return (mems.get(key) or ents.get(key))["realm"]

    all_keys = list(mems) + list(ents)
    word_cache = {k: words(text_of(k)) for k in all_keys}

    # ---------- supersessions ----------
    old_of_new: dict[str, str] = {}
    olds: set[str] = set()
    for i, s in enumerate(data["supersessions"]):
        old, new = s.get("old"), s.get("new")
        label = f"supersession[{i}] {old!r}->{new!r}"
        if old not in mems or new not in mems:
            err(f"{label}: unknown memory key")
            continue
        if old == new:
            err(f"{label}: old == new")
        if old in olds:
            err(f"{label}: {old!r} superseded twice")
        olds.add(old)
        old_of_new[new] = old
        if mems[old]["realm"] != mems[new]["realm"]:
            err(f"{label}: realms differ")
        if not mems[old]["age_days"] > mems[new]["age_days"]:
            err(f"{label}: old age_days must be larger than new")
        if not isinstance(s.get("reason"), str) or not s["reason"]:
            err(f"{label}: missing reason")

    # ---------- edges ----------
    adjacency: dict[str, set[str]] = {k: set() for k in all_keys}
    seen_edges = set()
    for i, e in enumerate(data["edges"]):
        src, dst, typ = e.get("src"), e.get("dst"), e.get("type")
        label = f"edge[{i}] {src!r}-{typ}->{dst!r}"
        if src not in mems:
            err(f"{label}: src is not a memory key")
            continue
        if dst not in mems and dst not in ents:
            err(f"{label}: unknown dst")
            continue
        if typ not in EDGE_TYPES:
            err(f"{label}: bad type")
        if src == dst:
            err(f"{label}: self loop")
        if (src, dst, typ) in seen_edges:
            err(f"{label}: duplicate")
        seen_edges.add((src, dst, typ))
        adjacency[src].add(dst)
        adjacency[dst].add(src)

    # ---------- queries ----------
    qids = set()
    seen_q = set()
    kind_count: Counter[str] = Counter()
    for q in data["queries"]:
        qid, text, kind = q.get("id"), q.get("query"), q.get("kind")
        label = f"query {qid!r} ({kind}) {text!r}"
        if not isinstance(qid, str) or qid in qids:
            err(f"{label}: missing or duplicate id")
        qids.add(qid)
        if kind not in KINDS:
            err(f"{label}: unknown kind")
            continue
        kind_count[kind] += 1
        if not isinstance(text, str) or not text.strip():
            err(f"{label}: empty query")
            continue
        qrealms = q.get("realms", [])
        if not isinstance(qrealms, list) or any(r not in realms for r in qrealms):
            err(f"{label}: realms {qrealms!r} must be known realms")
            continue
        sig = (text, tuple(sorted(qrealms)), bool(q.get("include_invalidated")))
        if sig in seen_q:
            err(f"{label}: duplicate query text with the same realm filter")
        seen_q.add(sig)
        rel = q.get("relevant")
        if not isinstance(rel, list) or len(set(rel)) != len(rel):
            err(f"{label}: relevant must be a list of distinct keys")
            continue
        missing = [k for k in rel if k not in mems and k not in ents]
        if missing:
            err(f"{label}: unknown relevant keys {missing}")
            continue
        if kind in NO_ANSWER:
            if rel:
                err(f"{label}: {kind} query must have no relevant keys")
            continue
        if not rel:
            err(f"{label}: no relevant keys")
            continue
        if qrealms and any(realm_of(k) not in qrealms for k in rel):
            err(f"{label}: relevant key outside realm filter {qrealms}")
        scope = [k for k in all_keys if not qrealms or realm_of(k) in qrealms]
        qw = words(text)

        if kind == "paraphrase":
            for k in rel:
                common = shared(qw, word_cache[k])
                if common:
                    err(f"{label}: shares {sorted(common)} with {k!r}")
        elif kind in ("identifier", "path"):
            toks = split_tokens(text)
            if kind == "path":
                needles = [t for t in toks if is_path(t)]
            else:
                needles = [t for t in toks if IDENT_RE.search(t) and not is_path(t)]
            if not needles:
                err(f"{label}: no {kind}-like token found")
            for n in needles:
                for k in rel:
                    if n not in raw_of(k):
                        err(f"{label}: {n!r} not verbatim in relevant {k!r}")
                others = [k for k in scope if k not in rel and n in raw_of(k)]
                if others:
                    err(f"{label}: {n!r} also occurs in non-relevant {others}")
        elif kind in ("current", "history"):
            if not any(k in old_of_new for k in rel):
                err(f"{label}: no relevant key is the new side of a supersession")
            if any(k in olds for k in rel):
                err(f"{label}: a superseded (old) memory is marked relevant")
            for k in rel:
                if k in old_of_new and not shared(qw, word_cache[old_of_new[k]]):
                    err(f"{label}: old memory {old_of_new[k]!r} shares no word with the query")
        elif kind == "realm":
            if not qrealms:
                err(f"{label}: realm query needs a realm filter")
            outside = [k for k in mems if mems[k]["realm"] not in qrealms
                       and len(shared(qw, word_cache[k])) >= 2]
            if not outside:
                err(f"{label}: no same-topic memory outside the filter (>= 2 shared words)")
        elif kind == "graph":
            for k in rel:
                if len(shared(qw, word_cache[k])) > 1:
                    err(f"{label}: relevant {k!r} shares {sorted(shared(qw, word_cache[k]))} "
                        "(graph targets may share at most 1 word)")
                seeds = [s for s in adjacency[k] if s not in rel
                         and len(shared(qw, word_cache[s])) >= 2]
                if not seeds:
                    err(f"{label}: relevant {k!r} has no linked seed sharing >= 2 words")
        elif kind == "keyword":
            for k in rel:
                if not qw & word_cache[k]:
                    err(f"{label}: shares no exact (unstemmed) word with relevant {k!r}")

    # ---------- totals ----------
    type_count = Counter(m["memory_type"] for m in mems.values())
    realm_count = Counter(m["realm"] for m in mems.values())
    if len(mems) < 330:
        err(f"only {len(mems)} memories (want >= 330)")
    if len(realms) < 4:
        err(f"only {len(realms)} realms (want >= 4)")
    for t in MEMORY_TYPES:
        if not type_count[t]:
            err(f"no memory of type {t!r}")
    if len(ents) < 25:
        err(f"only {len(ents)} entities (want >= 25)")
    if len(data["supersessions"]) < 20:
        err(f"only {len(data['supersessions'])} supersessions (want >= 20)")
    if len(data["edges"]) < 40:
        err(f"only {len(data['edges'])} edges (want >= 40)")
    if len(data["queries"]) < 130:
        err(f"only {len(data['queries'])} queries (want >= 130)")
    for kind, need in KIND_MIN.items():
        if kind_count[kind] < need:
            err(f"only {kind_count[kind]} {kind} queries (want >= {need})")

    print(f"memories: {len(mems)}")
    print("  by realm: " + ", ".join(f"{r}={n}" for r, n in sorted(realm_count.items())))
    print("  by type:  " + ", ".join(f"{t}={type_count[t]}" for t in MEMORY_TYPES)
          + f", entity={len(ents)} (in 'entities')")
    print(f"entities: {len(ents)}  supersessions: {len(data['supersessions'])}  "
          f"edges: {len(data['edges'])} "
          f"({', '.join(f'{t}={n}' for t, n in sorted(Counter(e['type'] for e in data['edges']).items()))})")
    filtered = sum(1 for q in data["queries"] if q.get("realms"))
    print(f"queries: {len(data['queries'])} ({filtered} with a realm filter)")
    print("  by kind: " + ", ".join(f"{k}={kind_count[k]}" for k in KINDS))
    if errors:
        print(f"\n{len(errors)} problem(s):")
        for e in errors:
            print("  - " + e)
        return 1
    print("OK: all rules hold")
    return 0


if __name__ == "__main__":
    sys.exit(main())

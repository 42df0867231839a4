"""Recall through the store: every filter, point-in-time, hops, hostile input, fallback."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from local_store import HashingEmbedder, Store, StoreClosedError, ValidationError
from local_store.embed import Vectors
from protocol.rows import NodeRow
from protocol.timestamp import format_ns
from tests.conftest import FakeWall
from tests.store_probe import dump_tables


async def ids(store: Store, query: str, **kw: object) -> list[str]:
    mode = kw.pop("mode", "syncd")
    res = await store.recall.query({"query": query, **kw}, mode=mode)  # type: ignore[arg-type]
    return [m.id for m in res.memories if not m.fallback]


async def relate(store: Store, src: dict[str, Any], dst: dict[str, Any]) -> None:
    """A ``RELATES_TO`` edge between two saved memories."""
    await store.graph.link({"memory_id": src["id"], "target_node_id": dst["node_id"],
                      "relationship_type": "RELATES_TO"})


@pytest.fixture
async def seeded(store: Store) -> dict[str, str]:
    out = {}
    for key, args in {
        "deploy_p": {"content": "deploy billing with make release", "realm": "p",
                     "memory_type": "procedure", "tags": ["deploy", "ci"], "importance": 0.9},
        "deploy_q": {"content": "deploy billing with helm upgrade", "realm": "q",
                     "tags": ["deploy"], "importance": 0.2},
        "db": {"content": "billing database is postgres", "realm": "p", "memory_type": "fact"},
        "archived": {"content": "deploy billing by ftp upload", "realm": "p"},
    }.items():
        out[key] = (await store.memories.save(args))["node_id"]
    await store.memories.update_status(out["archived"], "archived")
    return out


async def test_realm_type_tag_importance_filters(store: Store, seeded: dict[str, str]) -> None:
    assert await ids(store, "deploy billing", realms=["q"]) == [seeded["deploy_q"]]
    assert await ids(store, "deploy billing", memory_type="procedure") == [seeded["deploy_p"]]
    facts = await ids(store, "deploy billing", memory_type="Nonsense")  # unknown → fact
    assert set(facts) == {seeded["db"], seeded["deploy_q"]}
    assert await ids(store, "deploy billing", tags=["ci"]) == [seeded["deploy_p"]]
    assert await ids(store, "deploy billing", importance_min=0.8) == [seeded["deploy_p"]]
    everything = await ids(store, "deploy billing", limit=100)
    assert seeded["archived"] not in everything
    assert set(everything) == {seeded["deploy_p"], seeded["deploy_q"], seeded["db"]}


async def test_limit_is_clamped_and_defaults_from_settings(store: Store) -> None:
    for i in range(12):
        await store.memories.save({"content": f"note {i} about widgets"})
    assert len(await ids(store, "widgets", limit=0)) == 1
    assert len(await ids(store, "widgets")) == 8
    await store.settings.put({"default_limit": 3})
    assert len(await ids(store, "widgets")) == 3
    assert len(await ids(store, "widgets", limit=500)) == 12


async def mysql_then_postgres(store: Store, clock: FakeWall) -> tuple[Any, Any, str]:
    """"we use mysql for billing", superseded two hours later by postgres: the old and new
    memories, and an instant between them."""
    old = await store.memories.save({"content": "we use mysql for billing"})
    clock.advance(3600)
    between = format_ns(clock.now_ns)
    clock.advance(3600)
    new = await store.memories.save({"content": "we use postgres for billing"})
    await store.graph.judge(new["id"], old["id"], "supersedes")
    return old, new, between


async def test_invalidated_and_as_of(tmp_path: Path, wall: object) -> None:
    clock = FakeWall()
    store = await Store.open(tmp_path, wall=clock)
    try:
        old, new, between = await mysql_then_postgres(store, clock)
        assert await ids(store, "mysql billing") == [new["node_id"]]
        got = await ids(store, "mysql billing", include_invalidated=True)
        assert set(got) == {new["node_id"], old["node_id"]}
        assert await ids(store, "mysql billing", as_of=between) == [old["node_id"]]
        with pytest.raises(ValidationError) as exc:
            await store.recall.query({"query": "x", "as_of": "last week"})
        assert exc.value.field == "as_of"
    finally:
        await store.close()


async def test_superseded_memory_is_penalised(store: Store) -> None:
    old = await store.memories.save({"content": "billing runs on mysql five"})
    new = await store.memories.save({"content": "billing runs on postgres fifteen"})
    await store.graph.judge(new["id"], old["id"], "supersedes")
    res = await store.recall.query({"query": "billing runs on mysql", "include_invalidated": True})
    by_id = {m.id: m for m in res.memories}
    assert by_id[old["node_id"]].components is not None
    assert by_id[old["node_id"]].components.penalty > 0
    assert by_id[old["node_id"]].superseded_by == new["node_id"]


async def test_graph_hops_and_linked(store: Store) -> None:
    seed = await store.memories.save({"content": "alpha service owns invoices", "realm": "p"})
    hop1 = await store.memories.save({"content": "unrelated words one", "realm": "p"})
    hop2 = await store.memories.save({"content": "unrelated words two", "realm": "p"})
    other_realm = await store.memories.save({"content": "unrelated words three", "realm": "z"})
    await relate(store, seed, hop1)
    await relate(store, hop1, hop2)
    await relate(store, seed, other_realm)
    await store.graph.link({"memory_id": seed["id"], "target_node_id": "github::repo:alpha",
                      "target_namespace": "github"})
    q = "alpha service invoices"
    assert await ids(store, q, expand_hops=0, realms=["p"]) == [seed["node_id"]]
    one = await store.recall.query({"query": q, "expand_hops": 1, "realms": ["p"]})
    assert [m.id for m in one.memories] == [seed["node_id"], hop1["node_id"]]
    assert one.memories[1].via is not None and one.memories[1].via.depth == 1
    assert one.memories[1].graph_proximity == pytest.approx(0.5)
    assert [(x.node_id, x.target_namespace) for x in one.linked] == [
        ("github::repo:alpha", "github")]
    two = await store.recall.query({"query": q, "expand_hops": 7, "realms": ["p"]})
    assert [m.id for m in two.memories] == [seed["node_id"], hop1["node_id"], hop2["node_id"]]
    assert two.memories[2].graph_proximity == pytest.approx(1 / 3)
    assert "[via RELATES_TO]" in two.context
    # other realm: the edge lives in realm p but its far end is in realm z — filtered out
    assert other_realm["node_id"] not in [m.id for m in two.memories]
    # the plane leaks it (no filter on graph-pulled memories)
    plane = await store.recall.query({"query": q, "expand_hops": 1, "realms": ["p"]}, mode="plane")
    assert other_realm["node_id"] in [m.id for m in plane.memories]
    unfiltered = await ids(store, q, expand_hops=1)
    assert other_realm["node_id"] in unfiltered



async def test_space_agent_hides_other_agents_private_memories(store: Store) -> None:
    """``space_agent`` keeps memories with no space, ``public`` and ``private:<agent>`` — in
    the legs, through the graph and in the fallback; without it there is no space filter
    (both as the plane, contract §6 step 3)."""
    alice = await store.memories.save({"content": "launch plan draft for alice", "space": "private:alice"})
    bob = await store.memories.save({"content": "launch plan notes for bob", "space": "private:bob"})
    public = await store.memories.save({"content": "launch plan for everyone", "space": "public"})
    plain = await store.memories.save({"content": "unrelated words here"})
    await relate(store, public, alice)
    await relate(store, public, plain)
    seen = await ids(store, "launch plan", space_agent="bob", expand_hops=1)
    assert alice["node_id"] not in seen  # neither as a hit nor through the edge
    assert {bob["node_id"], public["node_id"], plain["node_id"]} <= set(seen)
    assert alice["node_id"] in await ids(store, "launch plan", space_agent="alice")
    assert alice["node_id"] in await ids(store, "launch plan")
    fallback = await store.recall.query({"query": "zzqx wvbn", "space_agent": "carol", "limit": 10})
    assert fallback.fallback and alice["node_id"] not in [m.id for m in fallback.memories]
    assert bob["node_id"] not in [m.id for m in fallback.memories]



async def test_the_graph_never_walks_through_a_memory_the_filters_hide(store: Store) -> None:
    """A memory hidden by the filters (another agent's private one, an archived one) is not a
    bridge: what lies behind it, memory or linked resource, does not come back through it."""
    public = await store.memories.save({"content": "launch plan for everyone", "space": "public"})
    alice = await store.memories.save({"content": "zz qq private", "space": "private:alice"})
    behind = await store.memories.save({"content": "unrelated words here", "space": "public"})
    await relate(store, public, alice)
    await relate(store, alice, behind)
    await store.graph.link({"memory_id": alice["id"], "target_node_id": "doc:alice-diary",
                      "target_namespace": "docs"})
    res = await store.recall.query({"query": "launch plan", "space_agent": "bob", "expand_hops": 2})
    assert not {alice["node_id"], behind["node_id"]} & {m.id for m in res.memories}
    assert "doc:alice-diary" not in [x.node_id for x in res.linked]
    as_alice = await store.recall.query({"query": "launch plan", "space_agent": "alice",
                                   "expand_hops": 2})
    assert behind["node_id"] in [m.id for m in as_alice.memories]  # the control
    assert "doc:alice-diary" in [x.node_id for x in as_alice.linked]
    await store.memories.update_status(alice["node_id"], "archived")
    res = await store.recall.query({"query": "launch plan", "space_agent": "alice", "expand_hops": 2})
    assert behind["node_id"] not in [m.id for m in res.memories]


async def test_a_tag_filter_is_a_literal_substring(store: Store) -> None:
    """``_`` and ``%`` in a tag filter are the tag's own characters: ``ci_cd`` finds ``ci_cd``
    (the filter used to drop them and look for ``cicd``) and not ``ciXcd``."""
    hit = (await store.memories.save({"content": "deploy billing service", "tags": ["ci_cd"]}))
    await store.memories.save({"content": "deploy billing worker", "tags": ["ciXcd"]})
    await store.memories.save({"content": "deploy billing cron", "tags": ["100%"]})
    assert await ids(store, "deploy billing", tags=["ci_cd"]) == [hit["node_id"]]
    assert len(await ids(store, "deploy billing", tags=["100%"])) == 1
    assert await ids(store, "deploy billing", tags=["cicd"]) == []


async def test_a_tag_filter_is_case_sensitive_as_the_planes(store: Store) -> None:
    """The plane's ``tags LIKE '%tag%'`` runs on PostgreSQL, where LIKE minds case (SQLite's
    ignores ASCII case): ``CI`` does not find ``ci``, and ``Straße`` finds only itself."""
    lower = (await store.memories.save({"content": "deploy billing service", "tags": ["ci"]}))
    upper = (await store.memories.save({"content": "deploy billing worker", "tags": ["CI", "Straße"]}))
    assert await ids(store, "deploy billing", tags=["CI"]) == [upper["node_id"]]
    assert await ids(store, "deploy billing", tags=["ci"]) == [lower["node_id"]]
    assert await ids(store, "deploy billing", tags=["straße"]) == []
    assert await ids(store, "deploy billing", tags=["Straße", "CI"]) == [upper["node_id"]]


async def test_a_pulled_vector_of_any_length_ranks_by_its_cosine(store: Store) -> None:
    """The index holds unit vectors (a dot product is the cosine): a pulled vector of norm 10
    is scaled as it enters, so it no longer outranks an exact match (distance 0 for both)."""
    emb = HashingEmbedder()
    q = emb.embed(["alpha beta gamma"])[0]
    mix = 0.6 * q + 0.8 * emb.embed(["delta epsilon"])[0]
    mix = mix / np.linalg.norm(mix)
    s = format_ns(1_780_000_000_000_000_000)
    exact = NodeRow(id="memory:a", content="zzzz", updated_at=s, created_at=s,
                    embedding=[float(x) for x in q])
    long = NodeRow(id="memory:b", content="yyyy", updated_at=s, created_at=s,
                   embedding=[float(x) * 10 for x in mix])
    assert (await store.replication.apply([exact, long], [], model=emb.model_id)).applied_nodes == 2
    res = await store.recall.query({"query": "alpha beta gamma"})
    got = {m.id: m.distance for m in res.memories}
    assert res.memories[0].id == "memory:a"
    assert got["memory:b"] == pytest.approx(1 - float(q @ mix), abs=1e-3)
    await store.close()
    reopened = await Store.open(store.data_dir, embedder=emb)  # loaded from the blobs too
    try:
        first = (await reopened.recall.query({"query": "alpha beta gamma"})).memories[0]
        assert first.id == "memory:a"
    finally:
        await reopened.close()


async def test_graph_is_skipped_when_not_allowed(store: Store) -> None:
    seed = await store.memories.save({"content": "gamma queue retries"})
    far = await store.memories.save({"content": "zzz"})
    await store.graph.link({"memory_id": seed["id"], "target_node_id": far["node_id"]})
    res = await store.recall.query({"query": "gamma queue", "expand_hops": 2}, graph=False)
    assert [m.id for m in res.memories] == [seed["node_id"]]


@pytest.mark.parametrize("query", [
    '"', "*", "NEAR(", 'unbalanced "quote', "a AND OR NOT", "col:umn", "^start", "-", "(",
    "x" * 10_000, "deploy " * 2000, "",
])
async def test_fts_hostile_input_never_errors(store: Store, seeded: dict[str, str],
                                              query: str) -> None:
    for mode in ("syncd", "plane"):
        res = await store.recall.query({"query": query}, mode=mode)  # type: ignore[arg-type]
        assert isinstance(res.took_ms, int)


async def test_empty_store(store: Store) -> None:
    res = await store.recall.query({"query": "anything"})
    assert (res.memories, res.linked, res.context) == ([], [], "")


async def test_fallback_when_nothing_matches(store: Store) -> None:
    low = await store.memories.save({"content": "weekly standup is on tuesdays", "importance": 0.1})
    high = await store.memories.save({"content": "never force push to main", "importance": 0.9})
    res = await store.recall.query({"query": "qwzx plorf"})
    assert res.fallback is True
    assert [m.id for m in res.memories] == [high["node_id"], low["node_id"]]
    assert all(m.fallback and m.score == 0.0 for m in res.memories)
    # The context says so: an agent handed the text alone must not take them as relevant.
    assert res.context.startswith("No memory matched the query. The most important recent "
                                  "memories:\n- [fact] never force push to main")
    assert "Relevant memories" not in res.context
    plane = await store.recall.query({"query": "qwzx plorf"}, mode="plane")
    assert plane.fallback is None
    found = await store.recall.query({"query": "force push"})
    assert found.fallback is None and found.context.startswith("Relevant memories:\n- [fact]")


async def test_dedupe_key_collapses_in_syncd_mode(store: Store) -> None:
    rows = [NodeRow(id=f"memory:dup{i}", content="Deploy with make release", realm="p",
                    updated_at=format_ns(1_780_000_000_000_000_000 + i)) for i in range(2)]
    await store.replication.apply(rows, [], model="other")
    await store.embedding.reembed_missing()
    syncd = await ids(store, "deploy make release")
    plane = await ids(store, "deploy make release", mode="plane")
    assert len(plane) == 2
    assert len(syncd) == 2  # remote rows carry no dedupe_key: both stay
    await store.memories.save({"content": "deploy   with MAKE release", "realm": "q"})
    assert len(await ids(store, "deploy make release")) == 3


async def test_index_follows_writes_and_reembedding(store: Store) -> None:
    res = await store.memories.save({"content": "zebra crossing rules"})
    assert res["node_id"] in store.index
    await store.memories.delete(res["id"])
    assert res["node_id"] not in store.index
    await store.replication.apply([NodeRow(id="memory:r1", content="remote zebra", embedding=[0.5] * 384,
                               updated_at=format_ns(1_780_000_000_000_000_000))], [],
                      model="bge-small-en-v1.5")
    assert "memory:r1" not in store.index  # another model's vector is never compared
    assert await ids(store, "zebra") == ["memory:r1"]  # keyword leg still finds it
    assert await store.embedding.reembed_missing() == 1
    assert "memory:r1" in store.index
    assert await store.embedding.reembed_missing() == 0


async def test_index_is_rebuilt_at_start(tmp_path: Path) -> None:
    store = await Store.open(tmp_path, embedder=HashingEmbedder())
    saved = [(await store.memories.save({"content": f"fact number {i}"}))["node_id"] for i in range(5)]
    await store.close()
    store = await Store.open(tmp_path, embedder=HashingEmbedder())
    try:
        assert sorted(store.index.ids) == sorted(saved)
        other = await Store.open(tmp_path / "x", embedder=HashingEmbedder(dim=64))
        assert len(other.index) == 0
        await other.close()
    finally:
        await store.close()


async def test_bad_request_names_the_field(store: Store) -> None:
    with pytest.raises(ValidationError) as exc:
        await store.recall.query({"query": "x", "limit": -1})
    assert exc.value.field == "limit"
    with pytest.raises(ValidationError) as exc:
        await store.recall.query({"limit": 3})
    assert "query" in exc.value.message


async def test_settings_patch_and_bad_settings(store: Store) -> None:
    before = await dump_tables(store)
    with pytest.raises(ValidationError) as exc:
        await store.settings.put({"w_graph": "high"})
    assert exc.value.field == "w_graph"
    assert await dump_tables(store) == before
    merged = await store.settings.put({"w_graph": 0.7, "hitl": {"enabled": True}})
    assert merged.w_graph == 0.7 and merged.w_recency == 0.3 and merged.hitl.enabled is True


@pytest.mark.parametrize(("patch", "field"), [
    ({"w_rrf": float("nan")}, "w_rrf"), ({"half_life_days": float("inf")}, "half_life_days"),
    ({"hitl": {"confidence_threshold": float("-inf")}}, "hitl.confidence_threshold"),
    ({"rrf_k": 0}, "rrf_k"), ({"rrf_k": -5.5}, "rrf_k")])
async def test_settings_that_would_break_recall_or_the_store_are_refused(
        store: Store, patch: dict[str, object], field: str) -> None:
    """A non-finite number would be stored as null and stop the settings decoding; an
    ``rrf_k`` of 0 or below divides by zero in RRF. Refused, naming the field; nothing
    changes, and recall still answers."""
    await store.memories.save({"content": "deploy with make release"})
    before = await dump_tables(store)
    with pytest.raises(ValidationError) as exc:
        await store.settings.put(patch)
    assert exc.value.field == field
    assert await dump_tables(store) == before
    assert (await store.recall.query({"query": "deploy release"})).memories


async def test_settings_an_older_syncd_stored_unreadable_take_their_defaults(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A NaN stored before it was refused comes back as null: the store still opens, that
    field takes its default, the others keep their values, and a warning says so."""
    store = await Store.open(tmp_path, embedder=HashingEmbedder())
    await store.settings.put({"w_graph": 0.7, "hitl": {"enabled": True}})
    await store._write(lambda w: w.set_meta("settings", json.dumps({
        **msgspec.to_builtins(store.settings.current), "w_rrf": None,
        "hitl": {"enabled": True, "confidence_threshold": None}})))
    await store.close()
    with caplog.at_level(logging.WARNING, logger="local_store"):
        store = await Store.open(tmp_path, embedder=HashingEmbedder())
    try:
        assert (store.settings.current.w_rrf, store.settings.current.w_graph) == (1.0, 0.7)
        assert store.settings.current.hitl.enabled and store.settings.current.hitl.confidence_threshold == 0.6
        assert "stored settings partly unreadable" in caplog.text
    finally:
        await store.close()


class GatedEmbedder(HashingEmbedder):
    """Embeds a query only once the keyword leg has run (``keyword_ran``), or fails after 10 s:
    recall must embed on its own thread while the keyword leg runs, not before it."""

    def __init__(self) -> None:
        super().__init__()
        self.keyword_ran = threading.Event()
        self.gate = False
        self.broken = False

    def embed(self, texts: list[str]) -> Vectors:
        if self.broken:
            raise RuntimeError("embedder broke")
        if self.gate and not self.keyword_ran.wait(10):
            raise AssertionError("the query was embedded before the keyword leg ran")
        return super().embed(texts)


async def test_query_embedding_overlaps_the_keyword_leg(tmp_path: Path) -> None:
    embedder = GatedEmbedder()
    store = await Store.open(tmp_path, embedder=embedder)
    try:
        saved = (await store.memories.save({"content": "rotate the signing keys every quarter"}))["node_id"]
        fetch = store._recall_reader.fetch

        def watched(sql: str, params: Sequence[object] = ()) -> list[Any]:
            rows = fetch(sql, params)
            if "memories_fts MATCH" in sql:
                embedder.keyword_ran.set()
            return rows

        store._recall_reader.fetch = watched  # type: ignore[method-assign]
        embedder.gate = True
        res = await store.recall.query({"query": "signing keys"})
        assert [m.id for m in res.memories] == [saved]
        assert res.memories[0].distance is not None  # the semantic leg ran with the vector
        # An embedder that fails leaves the answer to the keyword leg (no hang, no error:
        # tests/local_store/test_embedder_failure.py), and the next recall embeds again.
        embedder.broken = True
        res = await store.recall.query({"query": "signing keys"})
        assert [m.id for m in res.memories] == [saved] and res.memories[0].distance is None
        assert store.embedder_error == "RuntimeError: embedder broke"
        embedder.broken = False
        res = await store.recall.query({"query": "signing keys"})
        assert [m.id for m in res.memories] == [saved] and res.memories[0].distance is not None
    finally:
        await store.close()


async def test_a_query_job_refused_or_cancelled_fails_the_recall_without_a_hang(
        tmp_path: Path) -> None:
    """The keyword leg starts before the query's job is queued and then waits for it: a job
    the query thread refuses (shut down) or drops (cancelled at close) must fail the recall."""
    store = await Store.open(tmp_path, embedder=HashingEmbedder())
    try:
        await store.memories.save({"content": "rotate the signing keys every quarter"})
        release = threading.Event()
        store._query_pool.submit(release.wait, 10)  # occupies the query thread
        queued = asyncio.ensure_future(store.recall.query({"query": "signing keys"}))
        await asyncio.sleep(0.05)
        assert not queued.done()  # its job waits behind the blocker
        store._query_pool.shutdown(wait=False, cancel_futures=True)
        release.set()
        with pytest.raises(StoreClosedError, match="closed during recall"):
            await asyncio.wait_for(queued, 10)
        with pytest.raises(RuntimeError, match="after shutdown"):
            await asyncio.wait_for(store.recall.query({"query": "signing keys"}), 10)
        keyword = await store.recall.query({"query": "signing keys"}, mode="keyword")
        assert len(keyword.memories) == 1  # no query job: the keyword leg alone still works
    finally:
        await store.close()


class TableEmbedder(HashingEmbedder):
    """Chosen vectors for chosen texts (the queries below); the hashing vector otherwise."""

    def __init__(self, table: dict[str, np.ndarray]) -> None:
        super().__init__()
        self.table = table

    def embed(self, texts: list[str]) -> Vectors:
        hashed = super().embed(texts)
        return np.stack([self.table.get(text, row) for text, row in zip(texts, hashed,
                                                                      strict=True)])


async def pull_with_vectors(store: Store, memories: list[tuple[str, str, np.ndarray]]) -> None:
    """Apply ``(name, content, vector)`` as pulled rows (``memory:<name>``, importance 0.5,
    one timestamp), with these vectors of the store's model."""
    stamp = format_ns(1_700_000_000_000_000_000)
    rows = [NodeRow(id=f"memory:{name}", labels="Memory", content=content, importance=0.5,
                    status="active", embedding=[float(x) for x in vector], created_at=stamp,
                    updated_at=stamp, valid_at=stamp) for name, content, vector in memories]
    result = await store.replication.apply(rows, [], model=store.embedder.model_id)
    assert result.applied_nodes == len(rows) and not result.problems


async def test_a_relaxed_keyword_hit_gets_no_rrf_vote(tmp_path: Path) -> None:
    """A query no memory holds every word of is answered by the relaxed (OR) keyword query.
    Its hit, A, shares one word of five and lies a little further from the query than B
    (cosine 0.48 against 0.50): its keyword score (coverage squared) counts, but its keyword
    rank is no second RRF vote, which would have put it above B. A strict hit's rank is one."""
    axes = np.eye(384, dtype=np.float32)
    query = axes[0]
    near_b = 0.50 * axes[0] + np.sqrt(1 - 0.50 ** 2) * axes[1]
    near_a = 0.48 * axes[0] + np.sqrt(1 - 0.48 ** 2) * axes[2]
    embedder = TableEmbedder({"zeta omega kappa lambda sigma": query, "zeta": query})
    store = await Store.open(tmp_path, embedder=embedder)
    try:
        await pull_with_vectors(store, [("a", "zeta notes about the build", near_a),
                                        ("b", "the release checklist", near_b)])

        relaxed = await store.recall.query({"query": "zeta omega kappa lambda sigma"})
        assert [m.id for m in relaxed.memories] == ["memory:b", "memory:a"]
        a = relaxed.memories[1].components
        assert a is not None and a.keyword == pytest.approx(1 / 25)
        assert a.rrf == pytest.approx(1 / 61)  # its vector rank (1) only

        strict = await store.recall.query({"query": "zeta"})
        assert strict.memories[0].id == "memory:a"
        a = strict.memories[0].components
        assert a is not None and a.rrf == pytest.approx(1 / 61 + 1 / 60)  # both ranks vote
    finally:
        await store.close()


async def test_a_partial_keyword_hit_is_returned_when_it_passes_the_floor(
        tmp_path: Path) -> None:
    """No memory holds every word and no vector is near (cosine 0): explicit search returns a
    partial (relaxed) hit, ranked but not confident, when its keyword relevance — coverage
    squared — reaches the floor (0.15: two words of three, one of two), and the fallback when
    it holds fewer (one of three: 0.11)."""
    axes = np.eye(384, dtype=np.float32)
    queries = ["faiss nprobe recall", "faiss nprobe zebra", "nprobe zebra"]
    embedder = TableEmbedder({q: axes[0] for q in queries})
    store = await Store.open(tmp_path, embedder=embedder)
    try:
        await pull_with_vectors(store, [
            ("ann", "nprobe had to go from 16 to 64 to recover recall", axes[1]),
            ("other", "the release checklist", axes[2])])
        for query in ("faiss nprobe recall", "nprobe zebra"):
            answer = await store.recall.query({"query": query})
            assert not answer.fallback and answer.memories[0].id == "memory:ann", query
            assert answer.matched is False and not answer.memories[0].confident, query
        answer = await store.recall.query({"query": "faiss nprobe zebra"})
        assert answer.fallback and all(m.fallback for m in answer.memories)
    finally:
        await store.close()


async def test_keyword_leg_matches_other_inflections_of_a_word(store: Store) -> None:
    """The keyword index stems (schema 0008): the plural, -ing and -ed forms of a question's
    words find the memory, and a deleted memory stays out of the rebuilt index."""
    kept = (await store.memories.save({"content": "The fraud score threshold for manual review is 0.87"}))
    gone = (await store.memories.save({"content": "The fraud score threshold was 0.80 before"}))
    await store.memories.delete(gone["node_id"])
    for query in ("fraud scores thresholds", "reviewing scored frauds"):
        assert await ids(store, query, mode="keyword") == [kept["node_id"]], query

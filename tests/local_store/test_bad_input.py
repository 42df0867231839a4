"""Bad input at the store's entry points (an input-validation review): each case is refused with
a ``ValidationError`` naming the field and leaves the store byte-for-byte unchanged — never an
internal error (UnicodeEncodeError, TypeError, OverflowError), never a silent acceptance.

"Unchanged" is a full ``iterdump`` of the database read through a separate connection (schema,
FTS index and change feed included). A remote batch is the exception to "refused": one bad row
is reported (index, field) and the rest apply (``apply.py``'s rules).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from local_store import HashingEmbedder, Store, ValidationError, apply
from protocol.rows import EdgeRow, NodeRow

S = "\ud800"  # a lone surrogate: Python's json (the MCP fallback decoder) reads one from "\ud800"
STAMP = "2024-01-01T00:00:00Z"


def _iterdump(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


async def full_dump(store: Store) -> list[str]:
    """Every statement of the database, read through a separate connection."""
    return await asyncio.to_thread(_iterdump, store.db_path)


async def seeded(store: Store) -> dict[str, str]:
    a = await store.memories.save({"content": "alpha", "references": ["x::y"]})
    b = await store.memories.save({"content": "beta"})
    return {"a": a["node_id"], "b": b["node_id"]}


async def refused(store: Store, call: Callable[[], Awaitable[Any]], field: str) -> None:
    """``call()`` raises a ValidationError naming ``field`` and changes nothing."""
    before = await full_dump(store)
    with pytest.raises(ValidationError) as exc:
        await call()
    assert exc.value.field == field
    assert await full_dump(store) == before


def strict_json(text: str) -> object:
    def no_constant(name: str) -> object:
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=no_constant)


# ---------------------------------------------------------------------- ids (finding 1)

ID_CALLS: dict[str, tuple[Callable[[Store, dict[str, str]], Awaitable[Any]], str]] = {
    "get": (lambda s, i: s.memories.get(S), "memory_id"),
    "delete": (lambda s, i: s.memories.delete("memory:" + S), "memory_id"),
    "update_status": (lambda s, i: s.memories.update_status(S, "active"), "memory_id"),
    "update_importance": (lambda s, i: s.memories.update_importance(S, 0.3), "memory_id"),
    "judge target": (lambda s, i: s.graph.judge(i["a"], S, "supersedes"), "target_id"),
    "judge source": (lambda s, i: s.graph.judge(S, i["a"], "merged"), "memory_id"),
}


@pytest.mark.parametrize("name", sorted(ID_CALLS))
async def test_a_memory_id_holding_a_lone_surrogate_is_refused(store: Store, name: str) -> None:
    """``normalise_memory_id`` let it through to sqlite3, which raised UnicodeEncodeError."""
    ids = await seeded(store)
    call, field = ID_CALLS[name]
    await refused(store, lambda: call(store, ids), field)


# ---------------------------------------------------------------------- recall (findings 2, 3)

@pytest.mark.parametrize(("request_args", "field"), [
    ({"query": "alpha", "realms": [S]}, "realms[0]"),
    ({"query": "alpha", "tags": ["ok", S]}, "tags[1]"),
    ({"query": "alpha", "space_agent": "agent" + S}, "space_agent"),
])
async def test_a_recall_filter_holding_a_lone_surrogate_is_refused(
        store: Store, request_args: dict[str, object], field: str) -> None:
    """The recall reader's SQL raised UnicodeEncodeError (``list_memories`` already refused
    the same values)."""
    await seeded(store)
    await refused(store, lambda: store.recall.query(request_args), field)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
async def test_recall_importance_min_must_be_finite(store: Store, value: float) -> None:
    """NaN was accepted, and the recall silently found nothing (every comparison with NaN is
    false); importance is refused as NaN everywhere else."""
    await seeded(store)
    await refused(store, lambda: store.recall.query({"query": "alpha", "importance_min": value}),
                  "importance_min")


# ---------------------------------------------------------------------- JSON fields (4, 5, 6)

@pytest.mark.parametrize(("args", "column"), [
    ({"content": "x", "provenance": '{"n": NaN}'}, "provenance"),  # text: reaches HTTP/MCP
    ({"content": "x", "provenance": '{"n": Infinity}'}, "provenance"),
    ({"content": "x", "provenance": {"n": float("nan")}}, "provenance"),
    ({"content": "x", "source_uris": [float("inf")]}, "source_uris"),
    ({"content": "x", "mentions": {"n": float("-inf")}}, "mentions"),
])
async def test_json_fields_are_never_stored_as_invalid_json(
        store: Store, args: dict[str, object], column: str) -> None:
    """``stamp_provenance``/``json_text`` wrote ``NaN``/``Infinity`` tokens (Python's
    ``json.dumps`` default), which no strict reader — the plane's — accepts. Refused (naming
    the field, nothing written) or stored as valid JSON; never stored invalid."""
    await seeded(store)
    before = await full_dump(store)
    try:
        saved = await store.memories.save(args)
    except ValidationError as exc:
        assert exc.field == column
        assert await full_dump(store) == before
        return
    rows = await store._fetch(f"SELECT {column} FROM memories WHERE id = ?", (saved["node_id"],))
    strict_json(rows[0][0])


@pytest.mark.parametrize("column", ["provenance", "source_uris", "mentions"])
@pytest.mark.parametrize("value", [{1: "a", "b": 2}, {"a": {1, 2}}],
                         ids=["mixed key types", "a set"])
async def test_an_object_json_cannot_hold_is_refused(
        store: Store, column: str, value: object) -> None:
    """``json.dumps(sort_keys=True)`` raised TypeError ('<' not supported between 'str' and
    'int'; a set is not JSON serializable) out of ``save``."""
    await seeded(store)
    await refused(store, lambda: store.memories.save({"content": "x", column: value}), column)


async def test_save_many_reports_a_bad_provenance_item_and_saves_the_rest(store: Store) -> None:
    """The TypeError escaped ``build_save``, so the valid item was not saved either."""
    result = await store.memories.save_many([{"content": "ok"},
                                    {"content": "x", "provenance": {1: "a", "b": 2}}])
    assert result["count"] == 1 and result["ids"][0] is not None and result["ids"][1] is None
    assert len(result["errors"]) == 1 and "memories[1].provenance" in result["errors"][0]


# ---------------------------------------------------------------------- session summary (7)

@pytest.mark.parametrize(("files", "field"), [
    ([None], "files[0]"), ([{"path": "a.py"}], "files[0]"), ([["a.py"]], "files[0]"),
    (["a.py", 1, True], "files[1]"),
])
async def test_session_summary_list_items_must_be_strings(
        store: Store, files: list[object], field: str) -> None:
    """Each item went through ``str()``: the memory stored Python reprs ('Files: None',
    "Files: {'path': 'a.py'}", 'Files: a.py, 1, True')."""
    await seeded(store)
    await refused(store, lambda: store.memories.session_summary({"goal": "g", "files": files}), field)


# ---------------------------------------------------------------------- ingest_entity (8, 9)

@pytest.mark.parametrize("properties", ["", 0, False, []])
async def test_ingest_entity_refuses_falsy_properties_that_are_not_an_object(
        store: Store, properties: object) -> None:
    """``clean.get("properties") or {}`` made any falsy value ``{}``, so "" / 0 / false / []
    were accepted while [1] was refused."""
    await seeded(store)
    await refused(store, lambda: store.graph.ingest_entity({"name": "n", "properties": properties}),
                  "properties")


@pytest.mark.parametrize(("link", "field"), [
    ({"target_node_id": "x", "relationship_type": 5}, "links[0].relationship_type"),
    ({"target_node_id": "x", "target_namespace": 5}, "links[0].target_namespace"),
])
async def test_ingest_entity_link_errors_name_the_link(
        store: Store, link: dict[str, object], field: str) -> None:
    """They named the bare 'relationship_type' / 'target_namespace', although the target's
    error is 'links[0].target_node_id'."""
    await seeded(store)
    await refused(store, lambda: store.graph.ingest_entity({"name": "n", "links": [link]}), field)


# ---------------------------------------------------------------------- not an object (10)

NOT_OBJECT: dict[str, Callable[[Store], Awaitable[Any]]] = {
    "link(None)": lambda s: s.graph.link(None),  # type: ignore[arg-type]
    "link([])": lambda s: s.graph.link([]),  # type: ignore[arg-type]
    "ingest_entity(None)": lambda s: s.graph.ingest_entity(None),  # type: ignore[arg-type]
    "session_summary(None)": lambda s: s.memories.session_summary(None),  # type: ignore[arg-type]
    "put_settings(None)": lambda s: s.settings.put(None),  # type: ignore[arg-type]
    "put_settings([])": lambda s: s.settings.put([]),  # type: ignore[arg-type]
    "recall(None)": lambda s: s.recall.query(None),  # type: ignore[arg-type]
    "recall('abc')": lambda s: s.recall.query("abc"),  # type: ignore[arg-type]
    "list_memories('x')": lambda s: s.memories.list_memories("x"),  # type: ignore[arg-type]
}


@pytest.mark.parametrize("name", sorted(NOT_OBJECT))
async def test_arguments_that_are_not_an_object_are_refused_as_body(
        store: Store, name: str) -> None:
    """``save(None)`` answered ValidationError('body'); these raised AttributeError / TypeError
    / ValueError — and ``put_settings([])`` was accepted and wrote the settings row."""
    await seeded(store)
    await refused(store, lambda: NOT_OBJECT[name](store), "body")


# ---------------------------------------------------------------------- settings counts (11)

@pytest.mark.parametrize(("patch", "field"), [
    ({"min_events": 2**64}, "min_events"),
    ({"default_limit": 10**30}, "default_limit"),
    ({"dreaming": {"interval_secs": 10**30}}, "dreaming.interval_secs"),
])
async def test_settings_counts_beyond_u64_are_refused(
        store: Store, patch: dict[str, object], field: str) -> None:
    """They were accepted and persisted, although the plane's serde (u64) refuses them as it
    refuses a negative count; u64's largest is still accepted."""
    await refused(store, lambda: store.settings.put(patch), field)
    assert (await store.settings.put({"min_events": 2**64 - 1})).min_events == 2**64 - 1


# ---------------------------------------------------------------------- apply (12)

@pytest.fixture(params=["helper", "inline"])
def hashing(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Wire rows hashed in the store's helper thread (big batches) and in the writer's own."""
    monkeypatch.setattr(apply, "HELPER_FROM", 1 if request.param == "helper" else 10**9)


def _node(**changes: object) -> NodeRow:
    base: dict[str, Any] = {"id": "memory:remote-bad", "content": "remote",
                            "updated_at": STAMP, "origin": "o"}
    base.update(changes)
    return NodeRow(**base)


@pytest.mark.parametrize(("bad", "field"), [
    (_node(content="x" + S), "content"),
    (_node(title=S), "title"),
    (_node(provenance='{"a":"' + S + '"}'), "provenance"),
    (_node(origin=S), "origin"),
    (_node(id="memory:" + S), "id"),
    (_node(importance=10**400), "importance"),
    (_node(importance="0.5"), "importance"),
])
@pytest.mark.usefixtures("hashing")
async def test_apply_reports_a_bad_node_row_and_applies_the_rest(
        store: Store, bad: NodeRow, field: str) -> None:
    """They raised UnicodeEncodeError / OverflowError / TypeError out of the whole batch."""
    good = _node(id="memory:remote-good", content="fine")
    result = await store.replication.apply([good, bad], [], model=store.embedder.model_id)
    assert result.applied_nodes == 1
    assert [(p.index, p.field) for p in result.problems] == [(1, field)]
    msgspec.json.encode([p.id for p in result.problems])  # a report the daemon can send
    assert (await store.memories.get("memory:remote-good"))["content"] == "fine"


@pytest.mark.parametrize(("bad", "field"), [
    (EdgeRow(src="memory:a" + S, dst="x", type="REL", created_at=STAMP), "src"),
    (EdgeRow(src="memory:a", dst="x", type="REL" + S, created_at=STAMP), "type"),
    (EdgeRow(src="memory:a", dst="x", type="REL", realm=S, created_at=STAMP), "realm"),
    (EdgeRow(src="memory:a", dst="x", type="REL", props='{"a":"' + S + '"}', created_at=STAMP),
     "props"),
])
@pytest.mark.usefixtures("hashing")
async def test_apply_reports_a_bad_edge_row_and_applies_the_rest(
        store: Store, bad: EdgeRow, field: str) -> None:
    good = EdgeRow(src="memory:a", dst="y", type="REL", created_at=STAMP)
    result = await store.replication.apply([], [good, bad], model=store.embedder.model_id)
    assert result.applied_edges == 1
    assert [(p.index, p.field) for p in result.problems] == [(1, field)]


async def test_provenance_text_with_a_number_beyond_float_range_is_kept_not_refused(
        tmp_path: Path) -> None:
    """``stamp_provenance`` wraps text that is "JSON only to Python" (NaN, Infinity) as text,
    but ``{"score": 1e400}`` — valid JSON text — parses to ``inf`` through ``json.loads``'s
    float path (not ``parse_constant``), and ``strict_json`` then refuses the whole save:
    "provenance: must be valid JSON". Before this change it saved. Either wrap it as text (as
    the plane's strict parser, which refuses out-of-range numbers, leaves it) or keep it."""
    s = await Store.open(tmp_path / "data", embedder=HashingEmbedder())
    try:
        saved = await s.memories.save({"content": "a note", "provenance": '{"score": 1e400}'})
        assert saved["saved"]
    finally:
        await s.close()


@pytest.mark.parametrize(("given", "stored"), [(1.7, 1.0), (-3, 0.0)])
async def test_update_importance_says_when_it_clamps(store: Store, given: float,
                                                     stored: float) -> None:
    """``save`` reports a clamped importance in ``coerced``; ``update_importance`` clamped
    silently."""
    mid = (await store.memories.save({"content": "a note to weigh"}))["node_id"]
    result = await store.memories.update_importance(mid, given)
    assert result["importance"] == stored
    assert result["coerced"] == {"importance": f"importance {given:g} is outside 0..1: "
                                               f"stored as {stored:g}"}
    assert "coerced" not in await store.memories.update_importance(mid, 0.4)

"""RELIABILITY L7 at the store level: every error path leaves the store byte-for-byte unchanged.

Each case runs one failing call against a store holding a few memories and edges, and compares a
full dump of every table (meta included, so not even the clock or local_seq moved) before/after.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from local_store import NotFoundError, Store, StoreError, ValidationError
from local_store.records import MAX_CONTENT_CHARS
from tests.store_probe import dump_tables

Case = Callable[[Store, dict[str, str]], Awaitable[Any]]

CASES: dict[str, tuple[Case, type[StoreError], str | None]] = {
    "save without content": (lambda s, ids: s.memories.save({"title": "t"}), ValidationError, "content"),
    "save private only": (lambda s, ids: s.memories.save({"content": "<private>x"}), ValidationError,
                          "content"),
    "save bad tags": (lambda s, ids: s.memories.save({"content": "x", "tags": [1]}), ValidationError,
                      "tags[0]"),
    "save bad valid_at": (lambda s, ids: s.memories.save({"content": "x", "valid_at": "soon"}),
                          ValidationError, "valid_at"),
    "save bad provenance": (lambda s, ids: s.memories.save({"content": "x", "provenance": 5}),
                            ValidationError, "provenance"),
    "save_many not a list": (lambda s, ids: s.memories.save_many("x"),  # type: ignore[arg-type]
                             ValidationError, "memories"),
    "save_many all bad": (lambda s, ids: s.memories.save_many([{"content": 1}]), None, None),  # type: ignore[dict-item]
    "status unknown": (lambda s, ids: s.memories.update_status(ids["a"], "done"), ValidationError,
                       "status"),
    "status missing id": (lambda s, ids: s.memories.update_status("memory:none", "active"), NotFoundError,
                          None),
    "status empty id": (lambda s, ids: s.memories.update_status("", "active"), ValidationError,
                        "memory_id"),
    "importance NaN": (lambda s, ids: s.memories.update_importance(ids["a"], float("nan")),
                       ValidationError, "importance"),
    "importance string": (lambda s, ids: s.memories.update_importance(ids["a"], "1"), ValidationError,
                          "importance"),
    "importance missing": (lambda s, ids: s.memories.update_importance(ids["a"], None), ValidationError,
                           "importance"),
    "judge self": (lambda s, ids: s.graph.judge(ids["a"], ids["a"], "supersedes"), ValidationError,
                   "target_id"),
    "judge missing target": (lambda s, ids: s.graph.judge(ids["a"], "memory:x", "supersedes"),
                             NotFoundError, None),
    "judge missing source": (lambda s, ids: s.graph.judge("memory:x", ids["a"], "merged"),
                             NotFoundError, None),
    "judge no verdict": (lambda s, ids: s.graph.judge(ids["a"], ids["b"], ""), ValidationError,
                         "verdict"),
    "entity no name": (lambda s, ids: s.graph.ingest_entity({"kind": "service"}), ValidationError,
                       "name"),
    "entity bad properties": (lambda s, ids: s.graph.ingest_entity({"name": "n", "properties": [1]}),
                              ValidationError, "properties"),
    "entity bad link": (lambda s, ids: s.graph.ingest_entity({"name": "n", "links": [{"x": 1}]}),
                        ValidationError, "links[0].target_node_id"),
    "link missing memory": (lambda s, ids: s.graph.link({"memory_id": "memory:x",
                                                    "target_node_id": "t"}), NotFoundError, None),
    "link no target": (lambda s, ids: s.graph.link({"memory_id": ids["a"]}), ValidationError,
                       "target_node_id"),
    "summary empty": (lambda s, ids: s.memories.session_summary({"goal": "  "}), ValidationError, "goal"),
    "delete missing": (lambda s, ids: s.memories.delete("memory:nope", hard=True), NotFoundError, None),
    "get missing": (lambda s, ids: s.memories.get("memory:nope"), NotFoundError, None),
    "list bad status": (lambda s, ids: s.memories.list_memories({"status": "x"}), ValidationError,
                        "status"),
    "list falsy tags": (lambda s, ids: s.memories.list_memories({"tags": ""}), ValidationError, "tags"),
    "importance beyond float": (lambda s, ids: s.memories.update_importance(ids["a"], 10**400),
                                ValidationError, "importance"),
    "save importance beyond float": (lambda s, ids: s.memories.save({"content": "x", "importance": 10**400}),
                                     ValidationError, "importance"),
    "save deep provenance": (lambda s, ids: s.memories.save({"content": "x", "provenance": nested(100)}),
                             ValidationError, "provenance"),
    "save deep provenance text": (
        lambda s, ids: s.memories.save({"content": "x", "provenance": "[" * 5000 + "]" * 5000}),
        ValidationError, "provenance"),
    "save deep source_uris text": (
        lambda s, ids: s.memories.save({"content": "x", "source_uris": "[" * 5000 + '"\\u0041"'
                               + "]" * 5000}), ValidationError, "source_uris"),
    "entity kind with comma": (lambda s, ids: s.graph.ingest_entity({"name": "n", "kind": "a,b"}),
                               ValidationError, "kind"),
    "entity kind too long": (lambda s, ids: s.graph.ingest_entity({"name": "n", "kind": "k" * 300}),
                             ValidationError, "kind"),
    "entity over the content limit": (
        lambda s, ids: s.graph.ingest_entity({"name": "n", "properties": {"p": "x" * MAX_CONTENT_CHARS}}),
        ValidationError, "properties"),
    "summary over the content limit": (
        lambda s, ids: s.memories.session_summary({"goal": "g" * 60_000, "instructions": "i" * 60_000,
                                          "discoveries": "d" * 60_000,
                                          "accomplished": "a" * 65_000,
                                          "next_steps": "n" * 60_000}),
        ValidationError, "accomplished"),
}


def nested(depth: int) -> object:
    """An object ``depth`` levels deep: ``{"a": {"a": … 1}}``."""
    value: object = 1
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize("name", sorted(CASES))
async def test_error_leaves_store_unchanged(store: Store, name: str) -> None:
    a = await store.memories.save({"content": "alpha", "references": ["x::y"]})
    b = await store.memories.save({"content": "beta"})
    ids = {"a": a["id"], "b": b["id"]}
    call, error, field = CASES[name]
    before = await dump_tables(store)
    if error is None:
        result = await call(store, ids)
        assert result["count"] == 0 and result["errors"]
    else:
        with pytest.raises(error) as exc:
            await call(store, ids)
        if field is not None:
            assert isinstance(exc.value, ValidationError) and exc.value.field == field
    assert await dump_tables(store) == before

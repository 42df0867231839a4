"""memory_note and record_learning over the real daemon: arguments are redacted before they are
checked or used (RELIABILITY P1, P7), every argument is checked before the first write (L7), tags
parse as ``save_memory`` parses them, and edge targets resolve in the note's own realm."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.store_probe import dump_tables
from tests.syncd.conftest import Daemon

NOTE = "/v1/agent/memory/tools/memory_note"
LEARNING = "/v1/agent/memory/tools/record_learning"


async def tool(daemon: Daemon, path: str, args: dict[str, Any]) -> tuple[int, Any]:
    status, body, _ = await daemon.call("POST", path, json=args)
    return status, body


async def stored(daemon: Daemon, tmp_path: Path) -> bytes:
    """Everything the store holds: every table's rows and the bytes of its data files."""
    files = b"".join(p.read_bytes() for p in sorted((tmp_path / "data").iterdir())
                     if p.is_file())
    return repr(await dump_tables(daemon.store)).encode() + files


async def refused(daemon: Daemon, path: str, args: dict[str, Any], field: str) -> Any:
    """A 422 naming ``field`` that leaves the store exactly as it was."""
    before = await dump_tables(daemon.store)
    status, body = await tool(daemon, path, args)
    assert status == 422 and body["error"]["field"] == field, (status, body)
    assert await dump_tables(daemon.store) == before
    return body


# ---------------------------------------------------------------------- privacy


async def test_private_spans_in_every_note_argument_are_never_stored_or_echoed(
        daemon: Daemon, tmp_path: Path) -> None:
    """The summary, tags and realm are redacted; the type, the name, an edge's target, its
    type and its relation make topic keys and edge ids, so a private span there is refused
    (two notes would both become ``bob-redacted`` and merge), naming the field and writing
    nothing."""
    canaries = {f: f"notecanary{f}4417" for f in ("type", "name", "summary", "tag", "to",
                                                   "totype", "rel", "realm")}

    def hide(field: str, visible: str) -> str:
        return f"{visible} <private>{canaries[field]}</private>"

    note = {"type": "person", "name": "Bob", "summary": hide("summary", "a friend"),
            "tags": [hide("tag", "team")], "realm": hide("realm", "work"),
            "edges": [{"to": "Acme", "to_type": "org", "type": "works_at"}]}
    replies = []
    for field, where in (("type", "type"), ("name", "name"), ("to", "edges[0].to"),
                         ("totype", "edges[0].to_type"), ("rel", "edges[0].type")):
        args = json.loads(json.dumps(note))
        if where.startswith("edges"):
            key = where.rsplit(".", 1)[1]
            args["edges"][0][key] = hide(field, args["edges"][0][key])
        else:
            args[where] = hide(field, args[where])
        replies.append(await refused(daemon, NOTE, args, where))
    status, body = await tool(daemon, NOTE, note)
    assert status == 200, body
    assert body["name"] == "Bob" and body["edges"][0]["type"] == "WORKS_AT"
    node = await daemon.store.memories.get(body["node_id"])
    assert node["topic_key"] == "note/person/bob" and node["realm"] == "work [redacted]"
    reply = json.dumps([body, *replies]).lower()
    kept = (await stored(daemon, tmp_path)).lower()
    for field, canary in canaries.items():
        assert canary not in reply, field
        assert canary.encode() not in kept, field


@pytest.mark.parametrize("args, field", [
    ({"name": "<private>notecanary9001</private>"}, "name"),
    ({"summary": " <PRIVATE reason='x'>notecanary9001</PRIVATE> "}, "summary"),
    ({"type": "<private>notecanary9001"}, "type"),
    ({"edges": [{"to": "Acme"}, {"to": "notecanary9001</private>"}]}, "edges[1].to"),
])
async def test_a_name_or_summary_empty_after_redaction_is_refused(
        daemon: Daemon, tmp_path: Path, args: dict[str, Any], field: str) -> None:
    body = await refused(daemon, NOTE, {"type": "person", "name": "Bob", "summary": "a friend",
                                        **args}, field)
    assert "notecanary9001" not in json.dumps(body)
    assert b"notecanary9001" not in await stored(daemon, tmp_path)


# ---------------------------------------------------------------------- nothing written on error


@pytest.mark.parametrize("args, field", [
    ({"edges": "not-a-list"}, "edges"),
    ({"edges": [{"to": "Acme"}, 5]}, "edges[1]"),
    ({"edges": [{"to": "Acme"}, {"type": "knows"}]}, "edges[1].to"),
    ({"edges": [{"to": "Acme"}, {"to": "Zed", "type": 7}]}, "edges[1].type"),
    ({"edges": [{"to": "Acme"}, {"to": "Zed", "to_type": "a,b"}]}, "edges[1].to_type"),
    ({"edges": [{"to": "Acme"}, {"to": "Zed", "to_type": "t" * 300}]}, "edges[1].to_type"),
    ({"edges": [{"to": "Acme"}, {"to": "z" * 600}]}, "edges[1].to"),
    ({"name": "n" * 600}, "name"),
    ({"tags": [1]}, "tags[0]"),
])
async def test_any_bad_argument_writes_nothing(daemon: Daemon, args: dict[str, Any],
                                               field: str) -> None:
    await refused(daemon, NOTE, {"type": "person", "name": "Bob", "summary": "a friend", **args},
                  field)


# ---------------------------------------------------------------------- tags


@pytest.mark.parametrize("tags", [5, "urgent", {"a": "b"}])
async def test_tags_must_be_a_list_as_for_save_memory(daemon: Daemon, tags: object) -> None:
    await refused(daemon, NOTE, {"type": "person", "name": "Al", "summary": "hi", "tags": tags},
                  "tags")
    status, body = await tool(daemon, "/v1/agent/memory/tools/save_memory",
                              {"content": "hi", "tags": tags})
    assert status == 422 and body["error"]["field"] == "tags"


async def test_tags_follow_the_kind_tag(daemon: Daemon) -> None:
    status, body = await tool(daemon, NOTE, {"type": "person", "name": "Al", "summary": "hi",
                                             "tags": [" urgent ", "urgent", ""]})
    assert status == 200, body
    assert (await daemon.store.memories.get(body["node_id"]))["tags"] == ["kind:person", "urgent"]
    await refused(daemon, NOTE, {"type": "person", "name": "Al", "summary": "hi", "tags": 5},
                  "tags")


# ---------------------------------------------------------------------- realms


async def test_edge_targets_resolve_in_the_notes_own_realm(daemon: Daemon) -> None:
    status, work_bob = await tool(daemon, NOTE, {"type": "person", "name": "Bobby",
                                                 "summary": "colleague", "realm": "work"})
    assert status == 200, work_bob
    status, carol = await tool(daemon, NOTE, {"type": "person", "name": "Carol",
                                              "summary": "x", "edges": [{"to": "bobby"}]})
    assert status == 200, carol
    stub = await daemon.store.memories.get(carol["edges"][0]["node_id"])
    assert stub["id"] != work_bob["node_id"] and stub["realm"] == "default", stub
    status, dave = await tool(daemon, NOTE, {"type": "person", "name": "Dave", "summary": "x",
                                             "realm": "work", "edges": [{"to": "BOBBY"}]})
    assert status == 200 and dave["edges"][0]["node_id"] == work_bob["node_id"], dave


# ---------------------------------------------------------------------- record_learning


async def test_learning_length_is_measured_after_redaction(daemon: Daemon,
                                                           tmp_path: Path) -> None:
    hidden = "learncanary" + "k" * 5000
    status, body = await tool(daemon, LEARNING,
                              {"content": f"rotate the key <private>{hidden}</private> monthly"})
    assert status == 200, (status, body)
    assert (await daemon.store.memories.get(body["id"]))["content"] == "rotate the key [redacted] monthly"
    assert b"learncanary" not in await stored(daemon, tmp_path)
    assert "learncanary" not in json.dumps(body)
    await refused(daemon, LEARNING, {"content": "x" * 4001}, "content")
    body = await refused(daemon, LEARNING, {"content": f"<private>{hidden}</private>"},
                         "content")
    assert "after removing <private>" in body["error"]["message"]


async def test_a_private_conversation_id_is_refused_not_echoed(daemon: Daemon) -> None:
    """``conversationId`` comes back in every result: one holding a private span is refused
    (a key, so not rewritten), and the refusal does not echo it."""
    body = await refused(daemon, "/v1/agent/memory/tools/save_memory", {
        "content": "hi", "conversationId": "c-<private>convcanary5120</private>"},
        "conversationId")
    assert "convcanary5120" not in json.dumps(body)
    status, answer = await tool(daemon, "/v1/agent/memory/tools/save_memory",
                                {"content": "hi", "conversationId": "c-1"})
    assert status == 200 and answer["conversationId"] == "c-1"


async def test_an_edge_finds_its_target_among_more_entities_than_a_page(
        daemon: Daemon) -> None:
    """The target is looked for through every entity of the realm: with 600 newer ones, an
    edge to the oldest links it instead of adding a duplicate stub."""
    status, acme = await tool(daemon, NOTE, {"type": "org", "name": "Acme", "summary": "a co"})
    assert status == 200
    for start in range(0, 600, 200):
        await daemon.store.memories.save_many([{"content": f"entity {i}", "title": f"Thing {i}",
                                       "memory_type": "entity"} for i in range(start, start + 200)])
    status, bob = await tool(daemon, NOTE, {"type": "person", "name": "Bob", "summary": "hi",
                                            "edges": [{"to": "ACME", "type": "works_at"}]})
    assert status == 200 and bob["edges"][0]["node_id"] == acme["node_id"]

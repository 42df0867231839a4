"""memory_note's placeholders: an edge to a name not noted yet makes a placeholder node, and the
name's own note — of any type, in the same realm — takes that node over, so there is one node
with every edge still attached, never a stub beside the note. Also the edge schema an agent reads
and the errors naming ``edges[i].field``. Real stores in ``tmp_path``, called through the tool
table as the daemon calls it."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from local_store import HashingEmbedder, Store, ValidationError
from local_store.records import PLACEHOLDER_TAG
from syncd.tools import TOOLS, Surfacer
from tests.store_probe import dump_tables


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with await Store.open(tmp_path / "data", embedder=HashingEmbedder()) as opened:
        yield opened


async def note(store: Store, **args: Any) -> dict[str, Any]:
    result = await Surfacer().call(store, "memory_note", args)
    assert isinstance(result, dict)
    return result


async def entities(store: Store, realm: str = "default") -> list[dict[str, Any]]:
    return (await store.memories.list_memories({"memory_type": "entity", "realm": realm}))["rows"]


async def edges_into(store: Store, node_id: str) -> list[tuple[str, str]]:
    return [(e["src"], e["type"]) for e in (await store.memories.get(node_id))["edges"]
            if e["dst"] == node_id]


# ---------------------------------------------------------------------- adoption


async def test_a_note_of_another_type_adopts_the_placeholder_its_edge_made(
        store: Store) -> None:
    billing = await note(store, type="service", name="billing", summary="Bills users.",
                         edges=[{"to": "rabbitmq-main", "type": "USES"}])
    stub_id = billing["edges"][0]["node_id"]
    stub = await store.memories.get(stub_id)
    assert stub["tags"] == ["kind:concept", PLACEHOLDER_TAG]
    assert stub["topic_key"] == "note/concept/rabbitmq-main"

    rabbit = await note(store, type="service", name="RabbitMQ main",
                        summary="The main message broker.", tags=["infra"])
    assert rabbit["node_id"] == stub_id and rabbit["adopted"] is True
    node = await store.memories.get(stub_id)
    assert node["content"] == "RabbitMQ main: The main message broker."
    assert node["title"] == "RabbitMQ main"
    assert node["tags"] == ["kind:service", "infra"]
    assert node["topic_key"] == "note/service/rabbitmq-main"
    assert await edges_into(store, stub_id) == [(billing["node_id"], "USES")]
    assert sorted(e["title"] for e in await entities(store)) == ["RabbitMQ main", "billing"]


async def test_a_note_of_the_placeholders_own_type_takes_it_over_by_its_topic_key(
        store: Store) -> None:
    billing = await note(store, type="service", name="billing", summary="Bills users.",
                         edges=[{"to": "postgres", "to_type": "database"}])
    stub_id = billing["edges"][0]["node_id"]
    pg = await note(store, type="database", name="Postgres", summary="The main database.")
    assert pg["node_id"] == stub_id
    assert (await store.memories.get(stub_id))["tags"] == ["kind:database"]
    assert len(await entities(store)) == 2


async def test_noting_the_adopter_again_merges_into_the_same_node(store: Store) -> None:
    billing = await note(store, type="service", name="billing", summary="Bills users.",
                         edges=[{"to": "rabbitmq-main", "type": "USES"}])
    first = await note(store, type="service", name="rabbitmq-main", summary="The broker.")
    again = await note(store, type="service", name="RabbitMQ-Main", summary="The broker, v2.")
    assert again["node_id"] == first["node_id"] == billing["edges"][0]["node_id"]
    assert "adopted" not in again
    node = await store.memories.get(first["node_id"])
    assert node["content"] == "RabbitMQ-Main: The broker, v2."
    assert await edges_into(store, node["id"]) == [(billing["node_id"], "USES")]
    assert len(await entities(store)) == 2


async def test_a_note_of_another_type_than_a_real_note_does_not_take_it_over(
        store: Store) -> None:
    """Only a placeholder is adopted: two real notes of one name and different types stay
    two nodes, each its own."""
    concept = await note(store, type="concept", name="billing", summary="Charging for use.")
    service = await note(store, type="service", name="billing", summary="Bills users.")
    assert service["node_id"] != concept["node_id"]
    assert (await store.memories.get(concept["node_id"]))["content"] == "billing: Charging for use."


async def test_an_edge_links_to_an_existing_real_note_of_another_type(store: Store) -> None:
    rabbit = await note(store, type="service", name="rabbitmq-main", summary="The broker.")
    billing = await note(store, type="service", name="billing", summary="Bills users.",
                         edges=[{"to": "RabbitMQ Main", "type": "uses", "to_type": "queue"}])
    assert billing["edges"] == [{"to": "RabbitMQ Main", "type": "USES",
                                 "node_id": rabbit["node_id"]}]
    node = await store.memories.get(rabbit["node_id"])
    assert PLACEHOLDER_TAG not in node["tags"] and node["content"] == "rabbitmq-main: The broker."
    assert len(await entities(store)) == 2


async def test_a_placeholder_never_overwrites_a_note_holding_its_topic_key(
        store: Store) -> None:
    """The edge's own lookup goes by title; a memory saved under the placeholder's topic key
    with another title is not found so, and the placeholder is then linked to it instead of
    being written over it."""
    saved = await store.memories.save({"content": "Postgres 16, the main database.",
                                       "title": "main db", "memory_type": "entity",
                                       "topic_key": "note/concept/postgres"})
    billing = await note(store, type="service", name="billing", summary="Bills users.",
                         edges=[{"to": "postgres"}])
    assert billing["edges"][0]["node_id"] == saved["node_id"]
    node = await store.memories.get(saved["node_id"])
    assert node["content"] == "Postgres 16, the main database." and node["tags"] == []


async def test_adoption_is_scoped_to_the_realm(store: Store) -> None:
    billing = await note(store, type="service", name="billing", summary="Bills users.",
                         realm="work", edges=[{"to": "rabbitmq-main", "type": "USES"}])
    stub_id = billing["edges"][0]["node_id"]
    home = await note(store, type="service", name="rabbitmq-main", summary="A home broker.")
    assert home["node_id"] != stub_id and "adopted" not in home
    stub = await store.memories.get(stub_id)
    assert stub["realm"] == "work" and PLACEHOLDER_TAG in stub["tags"]
    work = await note(store, type="service", name="rabbitmq-main", summary="The work broker.",
                      realm="work")
    assert work["node_id"] == stub_id and work["adopted"] is True
    assert [e["title"] for e in await entities(store)] == ["rabbitmq-main"]


async def test_a_caller_cannot_tag_a_note_as_a_placeholder(store: Store) -> None:
    before = await dump_tables(store)
    with pytest.raises(ValidationError) as refused:
        await note(store, type="service", name="billing", summary="Bills users.",
                   tags=["infra", PLACEHOLDER_TAG])
    assert refused.value.field == "tags"
    assert await dump_tables(store) == before


async def test_the_adopted_node_replicates_as_one_node_with_its_edge(
        store: Store, tmp_path: Path) -> None:
    async with await Store.open(tmp_path / "peer", embedder=HashingEmbedder()) as peer:
        billing = await note(store, type="service", name="billing", summary="Bills users.",
                             edges=[{"to": "rabbitmq-main", "type": "USES"}])
        nodes, edges, cursor = (await store.feed.page(0))[:3]
        await peer.replication.apply(nodes, edges, model=store.embedder.model_id)
        await note(store, type="service", name="rabbitmq-main", summary="The broker.")
        nodes, edges, _ = (await store.feed.page(cursor))[:3]
        await peer.replication.apply(nodes, edges, model=store.embedder.model_id)
        stub_id = billing["edges"][0]["node_id"]
        node = await peer.memories.get(stub_id)
        assert node["content"] == "rabbitmq-main: The broker."
        assert node["tags"] == ["kind:service"]
        assert await edges_into(peer, stub_id) == [(billing["node_id"], "USES")]
        assert len(await entities(peer)) == 2


# ---------------------------------------------------------------------- the schema


def test_the_schema_documents_every_note_field_and_the_edge_shape() -> None:
    schema = TOOLS["memory_note"].schema
    props = schema["properties"]
    for field in ("type", "name", "summary", "tags", "realm", "edges"):
        assert props[field]["description"], field
    assert schema["required"] == ["type", "name", "summary"]
    edge = props["edges"]["items"]
    assert edge["type"] == "object" and edge["required"] == ["to"]
    assert set(edge["properties"]) == {"to", "type", "to_type"}
    for field, spec in edge["properties"].items():
        assert spec["type"] == "string" and spec["description"], field
    assert "RELATES_TO" in edge["properties"]["type"]["description"]
    assert "concept" in edge["properties"]["to_type"]["description"]
    assert edge["examples"] and all(set(e) <= set(edge["properties"]) and "to" in e
                                    for e in edge["examples"])


# ---------------------------------------------------------------------- errors


@pytest.mark.parametrize("edges, field, says", [
    ([{"to": "a"}, {"to": "b"}, "c"], "edges[2]", "must be an object {to, type?, to_type?}"),
    ("rabbitmq", "edges", "each item an object {to, type?, to_type?}"),
    ([{"type": "USES"}], "edges[0].to", "the name of the node the edge points to"),
    ([{"to": "  "}], "edges[0].to", "is required"),
    ([{"to": "a", "type": 7}], "edges[0].type", "e.g. USES or DEPENDS_ON; default RELATES_TO"),
    ([{"to": "a", "type": "u" * 501}], "edges[0].type", "default RELATES_TO"),
    ([{"to": "a", "to_type": "a,b"}], "edges[0].to_type", "without commas"),
    ([{"to": "a", "to_type": ["service"]}], "edges[0].to_type", "default concept"),
    ([{"to": "a"}, {"to": "b", "relation": "USES"}], "edges[1]", "has no field 'relation'"),
])
async def test_a_bad_edge_is_refused_naming_its_field_and_writes_nothing(
        store: Store, edges: object, field: str, says: str) -> None:
    before = await dump_tables(store)
    with pytest.raises(ValidationError) as refused:
        await note(store, type="service", name="billing", summary="Bills users.", edges=edges)
    assert refused.value.field == field
    assert says in str(refused.value) and str(refused.value).startswith(f"{field}: ")
    assert await dump_tables(store) == before


# ---------------------------------------------------------------------- one transaction

async def test_a_note_failing_half_way_leaves_the_store_unchanged(store: Store) -> None:
    """The note, its first edge's placeholder and edge are written before the second edge's
    write fails (SQLite refuses it: a trigger stands for any failure found only while
    writing): the whole call rolls back, as one transaction."""
    await note(store, type="service", name="ledger", summary="Keeps accounts.")
    with sqlite3.connect(store.db_path) as conn:
        conn.execute("CREATE TRIGGER refuse_breaks BEFORE INSERT ON edges "
                     "WHEN NEW.type = 'BREAKS' BEGIN SELECT RAISE(ABORT, 'edge refused'); END")
    before, indexed = await dump_tables(store), len(store.index)
    with pytest.raises(sqlite3.IntegrityError, match="edge refused"):
        await note(store, type="service", name="billing", summary="Bills users.",
                   edges=[{"to": "rabbitmq-main", "type": "USES"},
                          {"to": "ledger", "type": "BREAKS"}])
    assert await dump_tables(store) == before
    assert len(store.index) == indexed
    names = [row["title"] for row in await entities(store)]
    assert names == ["ledger"]

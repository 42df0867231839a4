"""P1, P5, P7: a JSON-text field (provenance, source_uris, mentions, edge props) whose JSON
holds a stray ``</private>`` in one string and an escaped private span (``\\u003cprivate>…``)
in a later one.

A raw-text pass first (the old ``strip_private_json_text``, and on the save path the generic
``strip_json_object`` over the string) saw the literal closer and hid everything before it,
``{"a":"`` included: the text was no longer JSON, so the escaped span — a private span once
decoded — was never read, and was kept on disk, in answers and in the push to the plane (the
egress guard decodes one JSON level). JSON text is now decoded first, each string redacted.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from local_store import HashingEmbedder, Store
from local_store.redact import has_private_tag, strip_private_json_text
from protocol.rows import EdgeRow, NodeRow
from protocol.timestamp import format_ns


def canary() -> str:
    return "CANARY" + secrets.token_hex(8)


def json_text(c: str) -> str:
    # valid JSON: {"a": "x</private>", "b": "<private>{c}</private>"} once decoded
    return '{"a":"x</private>","b":"\\u003cprivate>' + c + '\\u003c/private>"}'


def kept(canaries: list[str], answer: str, data_dir: Path) -> list[str]:
    """The canaries found in ``answer`` or in any file of the (closed) store."""
    blob = b"".join(p.read_bytes() for p in data_dir.iterdir() if p.is_file())
    return [c for c in canaries if c in answer or c.encode() in blob]


def test_strip_private_json_text_reads_the_strings_of_json_text() -> None:
    c = canary()
    text = json_text(c)
    assert json.loads(text)["b"] == f"<private>{c}</private>"  # the input is valid JSON
    assert c not in strip_private_json_text(text, "provenance")


async def test_save_redacts_json_text_provenance_source_uris_and_mentions(tmp_path: Path) -> None:
    cs = [canary() for _ in range(3)]
    store = await Store.open(tmp_path / "d", embedder=HashingEmbedder())
    try:
        res = await store.memories.save({"content": "visible text",
                                "provenance": json_text(cs[0]),
                                "source_uris": '[' + json_text(cs[1]) + ']',
                                "mentions": json_text(cs[2])})
        got = repr(await store.memories.get(res["id"]))
    finally:
        await store.close()
    assert kept(cs, got, tmp_path / "d") == [], got


async def test_apply_redacts_json_text_provenance_and_edge_props(tmp_path: Path) -> None:
    cs = [canary() for _ in range(2)]
    store = await Store.open(tmp_path / "d", embedder=HashingEmbedder())
    try:
        v = format_ns(1_780_000_000_000_000_000)
        mid = "memory:00000000-0000-4000-8000-000000000001"
        res = await store.replication.apply(
            [NodeRow(id=mid, content="remote", updated_at=v, provenance=json_text(cs[0]))],
            [EdgeRow(src=mid, dst="entity:x", type="RELATES_TO", created_at=v,
                     props=json_text(cs[1]))], model="m")
        assert res.applied_nodes == 1 and res.applied_edges == 1, res
        got = repr(await store.memories.get(mid))
    finally:
        await store.close()
    assert kept(cs, got, tmp_path / "d") == [], got


async def test_a_kyma_edge_tombstone_with_a_stray_closer_in_props_stays_deleted(
        tmp_path: Path) -> None:
    """Same root cause, as corruption of non-private content: the plane's edge tombstone is
    ``"deleted": true`` inside props (Kyma drops the ``deleted`` extension). A stray closer in
    another key of those props makes the raw pass wipe the JSON's start, the text is no longer
    JSON, ``_props_say_deleted`` reads no tombstone, and the deleted edge is applied live."""
    store = await Store.open(tmp_path / "d", embedder=HashingEmbedder())
    try:
        v = format_ns(1_780_000_000_000_000_000)
        mid = "memory:00000000-0000-4000-8000-000000000001"
        props = json.dumps({"reason": "old note</private>", "deleted": True,
                            "deleted_at": v})
        res = await store.replication.apply(
            [NodeRow(id=mid, content="remote", updated_at=v)],
            [EdgeRow(src=mid, dst="entity:x", type="RELATES_TO", created_at=v, props=props)],
            model="m")
        assert res.applied_edges == 1, res
        got = await store.memories.get(mid)
    finally:
        await store.close()
    assert got["edges"] == [], got["edges"]  # a tombstone: no live edge


def not_json_until_redacted(c: str) -> str:
    """Not JSON as sent (an unescaped quote inside the literal span); a raw redaction makes it
    ``{"a":"\\u003cprivate>C\\u003c/private>","b":"[redacted]"}``, whose escapes must be read
    too (found by the review of this change: the first version stopped after the raw pass)."""
    return '{"a":"\\u003cprivate>' + c + '\\u003c/private>","b":"<private>"x"</private>"}'


def strings_of(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [*value, *(s for v in value.values() for s in strings_of(v))]
    if isinstance(value, list):
        return [s for v in value for s in strings_of(v)]
    return []


def test_text_a_raw_pass_makes_json_has_its_escaped_spans_read() -> None:
    c = canary()
    out = strip_private_json_text(not_json_until_redacted(c), "provenance")
    assert c not in out and c not in json.dumps(json.loads(out)), out


async def test_a_hub_and_a_replica_keep_one_text_and_hash_for_one_version(
        tmp_path: Path) -> None:
    """The replica redacts the hub's stored text again: it must keep it as it is, or the two
    hold different provenance and content hashes for the same (updated_at, origin)."""
    v = format_ns(1_780_000_000_000_000_000)
    mid = "memory:00000000-0000-4000-8000-000000000002"
    held: list[str | None] = []
    for name, provenance in (("hub", not_json_until_redacted(canary())), ("replica", None)):
        store = await Store.open(tmp_path / name, embedder=HashingEmbedder())
        try:
            await store.replication.apply([NodeRow(id=mid, content="remote", updated_at=v,
                                       provenance=provenance or held[0])], [], model="m")
            nodes, _ = await store.feed.read()
            held.append(nodes[0].provenance)  # the content hash is of these values
        finally:
            await store.close()
    assert held[0] == held[1] and "CANARY" not in (held[0] or ""), held


FRAGMENTS = ['{"a":"', '","b":"', '"}', '"', "<private>", "</private>", "<PRIVATE >",
             "\\u003cprivate>", "\\u003c/private>", "<\\/private>", "\\\"", "x", "C", "[", "]",
             ",", ":", "{", "}", " ", "\\u00e9", "é"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=14))
def test_json_text_redaction_is_a_fixed_point_and_leaves_no_tag(parts: list[str]) -> None:
    """Any mix of JSON structure, literal and escaped tags: the result redacts to itself, holds
    no tag as text, and, when it is JSON, no tag in any string (keys included)."""
    out = strip_private_json_text("".join(parts), "props")
    assert strip_private_json_text(out, "props") == out
    assert not has_private_tag(out)
    try:
        decoded = json.loads(out)
    except ValueError:
        return
    assert not any(has_private_tag(text) for text in strings_of(decoded)), out

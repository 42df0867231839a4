"""Three ways private text got past the redactor, each closed (RELIABILITY P1, P5, P7):

* JSON text with a repeated key: decoding keeps the last value, so a tag hidden behind escapes
  in an earlier one was never seen, and the raw text was stored as it came.
* Closers spelled with the Turkish ``ı``/``İ``: the redactor folds them to ``i`` (a stray
  closer hides what precedes it), but the id guard looked for ``</private`` in ``lower()``,
  so such ids (and timestamps quoted in errors) were kept verbatim.
* Settings: strings in a ``PUT settings`` patch were stored and served as sent.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from local_store import HashingEmbedder, NotFoundError, Store, ValidationError
from local_store.arguments import msgspec_field
from local_store.redact import has_private_tag, strip_private, strip_private_json_text
from protocol.rows import EdgeRow, NodeRow

STAMP = "2026-01-01T00:00:00.000000001+00:00"
CLOSERS = ("</prıvate>", "</PRİVATE>")


def canary() -> str:
    return "CANARY" + secrets.token_hex(8)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with await Store.open(tmp_path / "data", embedder=HashingEmbedder()) as opened:
        yield opened


async def stored_bytes(store: Store) -> bytes:
    """Every file of the data directory after a checkpoint (the .db and whatever WAL is left)."""
    await store.maintenance.checkpoint()
    return await asyncio.to_thread(lambda: b"".join(
        p.read_bytes() for p in store.data_dir.iterdir() if p.is_file()))


def escaped_span(secret: str) -> str:
    return f"\\u003cprivate\\u003e{secret}\\u003c/private\\u003e"


# ---------------------------------------------------------------------- repeated JSON keys

def test_a_repeated_key_cannot_hide_an_escaped_span() -> None:
    secret = canary()
    text = '{"a":"' + escaped_span(secret) + '","a":"x"}'
    cleaned = strip_private_json_text(text)
    assert secret not in cleaned
    assert json.loads(cleaned) == {"a": "x"}  # what any JSON reader makes of the original
    plain = '{"a":"caf\\u00e9","b":1}'  # no repeat, nothing private: kept byte for byte
    assert strip_private_json_text(plain) == plain


async def test_repeated_keys_in_saved_and_pulled_json_text_keep_no_secret(store: Store) -> None:
    secrets_ = [canary() for _ in range(4)]
    text = ['{"u":"' + escaped_span(s) + '","u":"ok"}' for s in secrets_]
    saved = await store.memories.save({"content": "visible body", "source_uris": text[0],
                              "mentions": text[1]})
    await store.replication.apply([NodeRow(id="memory:pulled", content="remote body", updated_at=STAMP,
                               created_at=STAMP, provenance=text[2])],
                      [EdgeRow(src="memory:pulled", dst="memory:other", type="RELATES_TO",
                               props=text[3], created_at=STAMP)], model="m")
    shown = json.dumps(await store.memories.get(saved["node_id"]))
    nodes, edges = await store.feed.read()
    exported = msgspec.json.encode([nodes, edges]).decode()
    raw = await stored_bytes(store)
    for secret in secrets_:
        assert secret not in shown and secret not in exported
        assert secret.encode() not in raw
    (edge,) = edges  # the rows themselves were kept, with what a JSON reader sees
    assert json.loads(edge.props or "") == {"u": "ok"}
    assert json.loads(next(n.provenance or "" for n in nodes if n.id == "memory:pulled")) == {
        "u": "ok"}


@pytest.mark.parametrize("text", [
    '{"source":"js-client","note":"\\ud800","n":1}',  # an escaped lone surrogate: ASCII text
    '{"a":' * 70 + '"line\\nbreak"' + "}" * 70,  # deep, with a backslash (so decoded)
    '{"a":' * 70 + '"plain"' + "}" * 70,  # deep, without one
])
async def test_pulled_json_text_is_judged_only_for_private_spans(store: Store, text: str) -> None:
    """Decoding JSON text to look for escaped tags must not refuse what was never refused:
    these applied before that check, and SQLite holds them (ASCII) as they came."""
    result = await store.replication.apply(
        [NodeRow(id="memory:json-text", content="remote body", updated_at=STAMP,
                 provenance=text)],
        [EdgeRow(src="memory:json-text", dst="memory:b", type="RELATES_TO", props=text,
                 created_at=STAMP)], model="m")
    assert (result.problems, result.applied_nodes, result.applied_edges) == ([], 1, 1)
    nodes, edges = await store.feed.read()
    assert [n.provenance for n in nodes] == [text] and [e.props for e in edges] == [text]


# ---------------------------------------------------------------------- ı / İ closers

@pytest.mark.parametrize("closer", CLOSERS)
def test_the_id_guard_agrees_with_the_redactor(closer: str) -> None:
    assert strip_private("SECRET" + closer) == "[redacted]"
    assert has_private_tag("SECRET" + closer)
    assert not has_private_tag("<privately> held") and not has_private_tag("a < b")


@pytest.mark.parametrize("closer", CLOSERS)
async def test_ids_and_timestamps_with_a_folded_closer_are_refused_unechoed(
        store: Store, closer: str) -> None:
    secret = canary()
    result = await store.replication.apply(
        [NodeRow(id=f"memory:{secret}{closer}", content="remote body", updated_at=STAMP),
         NodeRow(id="memory:stamp", content="x", updated_at=f"{secret}{closer}")],
        [EdgeRow(src="memory:a", dst=f"memory:{secret}{closer}", type="RELATES_TO",
                 created_at=STAMP)], model="m")
    assert (result.applied_nodes, result.applied_edges) == (0, 0)
    assert [(p.kind, p.field) for p in result.problems] == [
        ("node", "id"), ("node", "updated_at"), ("edge", "dst")]
    assert all(secret not in p.message and secret not in (p.id or "") for p in result.problems)
    with pytest.raises((NotFoundError, ValidationError)) as refused:
        await store.memories.get(f"memory:{secret}{closer}")
    assert secret not in str(refused.value)
    assert secret.encode() not in await stored_bytes(store)


# ---------------------------------------------------------------------- settings

async def test_settings_strings_are_redacted(store: Store) -> None:
    secret = canary()
    merged = await store.settings.put({
        "dreaming": {"realm_scope": [f"work <private>{secret}</private>"]},
        "embedding_model": f"<private>{secret}</private>"})
    assert secret not in msgspec.json.encode(merged).decode()
    assert merged.dreaming.realm_scope == ["work [redacted]"]
    # A mode is one of the plane's: a private one is refused, and the refusal never quotes it.
    with pytest.raises(ValidationError) as refused:
        await store.settings.put({"dreaming": {"mode": f"<private>{secret}</private>"}})
    assert refused.value.field == "dreaming.mode" and secret not in str(refused.value)
    assert secret.encode() not in await stored_bytes(store)


# ---------------------------------------------------------------------- field names

class Inner(msgspec.Struct):
    x: int


class Outer(msgspec.Struct):
    query: str
    inner: Inner | None = None


def test_a_missing_required_field_is_named() -> None:
    for value, field in (({}, "query"), ({"query": "q", "inner": {}}, "inner.x"),
                         ({"query": 1}, "query")):
        with pytest.raises(msgspec.ValidationError) as err:
            msgspec.convert(value, Outer)
        assert msgspec_field(str(err.value)) == field

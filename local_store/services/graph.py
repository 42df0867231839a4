"""``store.graph``: entities, typed notes and the edges between memories, each call one transaction.

Rules:
  * Every argument is redacted, then validated, before the transaction: a refused call writes
    nothing. Names and types make topic keys and edge ids, so one holding a private span is
    refused, as other identity keys are (two would both become ``[redacted]`` and merge).
  * A node type (``ingest_entity``'s ``kind``, ``memory_note``'s ``type`` and ``to_type``) is
    stored as the tag ``kind:<type>``, so it follows the tag rules (``kind_arg``).
  * ``note`` (``memory_note``) is ONE transaction: the note, a placeholder for each edge target
    not noted yet, and the edges. A failure anywhere in it leaves the store as it was. An edge
    to a name not noted yet makes a placeholder node for it; the name's own note, of whatever
    type, later takes that node over (``writes.write_note``), so the edges made before it
    reach it and no empty stub is left beside it. Targets are looked up by name in the
    transaction, so they are the nodes the edges are written to.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import Any

from local_store.arguments import parse_links
from local_store.errors import ValidationError
from local_store.records import (
    MAX_CONTENT_CHARS,
    MAX_KEY_CHARS,
    MAX_TAG_CHARS,
    MAX_TAGS,
    MAX_TITLE_CHARS,
    PLACEHOLDER_TAG,
    Draft,
    build_save,
    entity_content,
    is_placeholder,
    normalise_memory_id,
    optional_str,
    parse_realm,
    parse_tags,
    refuse_private_id,
    refuse_private_identity,
    required_str,
    slug,
    stamp_provenance,
)
from local_store.redact import strip_json_object, strip_json_strings
from local_store.services.memories import text_arg
from local_store.shell import Shell
from local_store.writes import Vector, Writer, props_json, write_note

NOTE_PAGE = 500  # entities read at a time while looking for an edge target by name
EDGE_FIELDS = ("to", "type", "to_type")
EDGE_SHAPE = "an object {to, type?, to_type?}"
KIND_CHARS = MAX_TAG_CHARS - len("kind:")
_ENTITIES = ("SELECT id, title, tags FROM memories WHERE deleted = 0 AND invalid_at IS NULL "
             "AND status <> 'archived' AND memory_type = 'entity' AND realm = ?{tags} "
             "ORDER BY created_at DESC, id LIMIT ? OFFSET ?")


class Graph:
    """Entities, notes, links and verdicts (``store.graph``)."""

    def __init__(self, shell: Shell) -> None:
        self._shell = shell

    async def judge(self, memory_id: object, target_id: object, verdict: object,
                    reason: object = None) -> dict[str, Any]:
        """``memory_judge``: supersedes/invalidates, merged, or any other verdict as a relation."""
        src = normalise_memory_id(memory_id, "memory_id")
        dst = normalise_memory_id(target_id, "target_id")
        if src == dst:
            raise ValidationError("target_id", "must differ from memory_id")
        raw = strip_json_strings({"verdict": verdict, "reason": reason})
        assert isinstance(raw, dict)
        word = required_str(raw, "verdict").lower()
        why = optional_str(raw, "reason", limit=4000)

        def run(w: Writer) -> dict[str, Any]:
            w.live_node(src, "memory_id")
            target = w.live_node(dst, "target_id")
            if word in ("supersedes", "invalidates"):
                stamp = w.clock.now()
                w.mutate(dst, {"invalid_at": stamp, "superseded_by": src}, "target_id")
                w.put_edge(src, dst, "INVALIDATES", realm=target["realm"],
                           props=props_json({"reason": why}) if why else None)
                return {"ok": True, "verdict": "supersedes", "src": src, "dst": dst}
            if word in ("merged", "merged_into"):
                w.mutate(dst, {"status": "archived"}, "target_id")
                w.put_edge(dst, src, "MERGED_INTO", realm=target["realm"],
                           props=props_json({"reason": why}) if why else None)
                return {"ok": True, "verdict": "merged", "into": src, "from": dst}
            w.put_edge(src, dst, "RELATES_TO", realm=target["realm"],
                       props=props_json({"verdict": word, "reason": why}))
            return {"ok": True, "verdict": word, "src": src, "dst": dst}

        return await self._shell._write(run)

    async def link(self, args: Mapping[str, object]) -> dict[str, Any]:
        """``link_memory_to_entity``: an edge from a memory to any node id (verbatim)."""
        clean = strip_json_object(args)
        refuse_private_identity(args)
        src = normalise_memory_id(clean.get("memory_id"))
        dst = required_str(clean, "target_node_id")
        kind = optional_str(clean, "relationship_type") or "REFERENCES"
        namespace = optional_str(clean, "target_namespace")
        realm_arg = clean.get("realm")

        def run(w: Writer) -> dict[str, Any]:
            node = w.live_node(src)
            realm = node["realm"] if realm_arg is None else parse_realm(realm_arg)
            w.put_edge(src, dst, kind, realm=realm, target_namespace=namespace)
            return {"linked": True, "src": src, "dst": dst, "type": kind}

        return await self._shell._write(run)

    async def ingest_entity(self, args: Mapping[str, object]) -> dict[str, Any]:
        """``ingest_entity``: idempotent per (realm, kind, name) through its topic key, so
        kind and name are identity too: one holding a private span is refused, as other keys
        are."""
        clean = strip_json_object(args)
        refuse_private_identity(args)
        for key in ("kind", "name"):
            if isinstance(value := args.get(key), str):
                refuse_private_id(value, key)
        name = required_str(clean, "name", limit=1000)
        kind = optional_str(clean, "kind")
        if kind is not None:
            check_kind(kind, "kind")
        type_ = optional_str(clean, "type")
        icon = optional_str(clean, "icon")
        properties = clean.get("properties")
        if properties is None:
            properties = {}
        elif not isinstance(properties, dict):  # "" / 0 / false / [] too: not "no properties"
            raise ValidationError("properties", "must be an object")
        links = parse_links(clean.get("links"))
        realm = parse_realm(clean.get("realm"))
        topic = f"entity/{kind or 'entity'}/{slug(name)}"
        provenance = {"source": "synthetic", "via": "ingest_entity", "kind": kind,
                      "type": type_, "icon": icon}
        content = entity_content(name, kind, properties, type_, icon)
        if len(content) > MAX_CONTENT_CHARS:
            raise ValidationError("properties", f"make the entity's text {len(content)} "
                                  f"characters long, over the limit of {MAX_CONTENT_CHARS}")
        draft = Draft(
            realm=realm, memory_type="entity", title=name, content=content,
            tags=parse_tags([f"kind:{kind}"] if kind else []), importance=0.5,
            topic_key=topic, provenance=stamp_provenance(provenance, self._shell.writer_info),
        )
        def run(w: Writer, vectors: list[Vector | None]) -> dict[str, Any]:
            saved = w.save(draft, vectors[0])
            for target, relation, namespace in links:
                dst = target if namespace else normalise_memory_id(target, "links")
                w.put_edge(saved["node_id"], dst, relation, realm=realm,
                           target_namespace=namespace)
            return saved

        saved = await self._shell._write_embedded([draft.content], run)
        return {"created": True, "upserted": bool(saved.get("upserted")), "id": saved["id"],
                "node_id": saved["node_id"], "kind": kind, "type": type_, "icon": icon,
                "topic_key": topic, "links": len(links)}

    async def note(self, args: Mapping[str, object]) -> dict[str, Any]:
        """``memory_note``: a typed node by stable name, merged on (type, normalised name), and
        its edges to other nodes by name — all in one transaction (rules above)."""
        _refuse_private_names(args)
        clean = strip_json_object(args)
        kind = kind_arg(clean, "type")
        name = text_arg(clean, "name", limit=MAX_TITLE_CHARS)
        summary = text_arg(clean, "summary", limit=4000)
        realm = parse_realm(clean.get("realm"))
        note = self._note_draft({
            "content": f"{name}: {summary}", "title": name, "memory_type": "entity",
            "tags": _note_tags(kind, clean.get("tags")), "realm": realm,
            "topic_key": _topic(kind, name, "name")})
        edges = [(target, relation, self._note_draft({
            "content": f"{target}: (mentioned by {name})", "title": target,
            "memory_type": "entity", "tags": [f"kind:{target_kind}", PLACEHOLDER_TAG],
            "realm": realm, "topic_key": topic}))
            for target, target_kind, topic, relation in _edges(clean.get("edges"))]

        def run(w: Writer, vectors: list[Vector | None]) -> dict[str, Any]:
            adopt = find_note(w, name, realm, placeholders=True)
            saved = write_note(w, note, vectors[0], adopt)
            links = []
            for (target, relation, stub), vector in zip(edges, vectors[1:], strict=True):
                target_id = find_note(w, target, realm)
                if target_id is None:
                    target_id = write_note(w, stub, vector, None)["node_id"]
                link_in(w, saved["node_id"], target_id, relation)
                links.append({"to": target, "type": relation, "node_id": target_id})
            return {**saved, "name": name, "type": kind, "edges": links}

        return await self._shell._write_embedded(
            [note.content, *(stub.content for _, _, stub in edges)], run)

    def _note_draft(self, args: Mapping[str, object]) -> Draft:
        return build_save(args, self._shell.writer_info)


def link_in(w: Writer, src: str, dst: str, kind: str) -> None:
    """On the writer thread: an edge from the live memory ``src``, in its realm, to ``dst``
    (``link`` without its arguments' checks)."""
    w.put_edge(src, dst, kind, realm=w.live_node(src)["realm"])


def find_note(w: Writer, name: str, realm: str, *, placeholders: bool = False) -> str | None:
    """On the writer thread: the entity of this realm only whose title has the same slug (as
    ``list_memories`` lists them: live, not archived, not invalidated, newest first): the
    newest one that is not a placeholder, else the newest placeholder (an edge links to what
    is known of a name before a stub of it); ``placeholders``: only a placeholder (what a note
    of the name adopts). Every entity of the realm is looked through, not only the newest
    page."""
    wanted = slug(name)
    tags = " AND (',' || tags || ',') LIKE ? ESCAPE '\\'" if placeholders else ""
    params: list[object] = [realm, f"%,{PLACEHOLDER_TAG},%"] if placeholders else [realm]
    stub = None
    for offset in itertools.count(0, NOTE_PAGE):
        rows = w.conn.execute(_ENTITIES.format(tags=tags),
                              [*params, NOTE_PAGE, offset]).fetchall()
        for mid, title, tag_text in rows:
            if slug(str(title or "")) != wanted:
                continue
            if placeholders or not is_placeholder(tag_text):
                return str(mid)
            stub = stub or str(mid)
        if len(rows) < NOTE_PAGE:
            break
    return stub


def check_kind(kind: str, label: str) -> str:
    """A node type is stored as the tag ``kind:<type>``, so it follows the tag rules."""
    if "," in kind or len(kind) > KIND_CHARS:
        raise ValidationError(label, f"must be at most {KIND_CHARS} characters, without commas")
    return kind


def kind_arg(args: Mapping[str, Any], name: str, *, label: str | None = None,
             default: str | None = None) -> str:
    """A required node type (``check_kind``)."""
    return check_kind(text_arg(args, name, label=label, default=default), label or name)


def _refuse_private_names(args: Mapping[str, Any]) -> None:
    for key in ("type", "name"):
        if isinstance(value := args.get(key), str):
            refuse_private_id(value, key)
    edges = args.get("edges")
    for index, edge in enumerate(edges if isinstance(edges, list) else []):
        for key in ("to", "to_type", "type"):
            if isinstance(edge, Mapping) and isinstance(value := edge.get(key), str):
                refuse_private_id(value, f"edges[{index}].{key}")


def _edges(value: object) -> list[tuple[str, str, str, str]]:
    """``edges`` as (to, to_type, its topic key, relation), every item checked. A key other
    than ``EDGE_FIELDS`` is refused, not ignored: a guessed ``relation`` or ``target`` would
    otherwise make a RELATES_TO edge, or none, without a word."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValidationError("edges", f"must be a list, each item {EDGE_SHAPE}")
    edges = []
    for index, edge in enumerate(value):
        label = f"edges[{index}]"
        if not isinstance(edge, Mapping):
            raise ValidationError(label, f"must be {EDGE_SHAPE}")
        if unknown := [str(key)[:60] for key in edge if key not in EDGE_FIELDS]:
            raise ValidationError(label, f"has no field {unknown[0]!r}: it must be {EDGE_SHAPE}")
        target = _hinted(text_arg, edge, "to", f"{label}.to", "the name of the node the edge "
                         "points to", limit=MAX_TITLE_CHARS)
        target_kind = _hinted(kind_arg, edge, "to_type", f"{label}.to_type", "the target's "
                              "node type, e.g. service or person; default concept",
                              default="concept")
        relation = _hinted(text_arg, edge, "type", f"{label}.type", "the relation, e.g. USES "
                           "or DEPENDS_ON; default RELATES_TO", default="RELATES_TO")
        edges.append((target, target_kind, _topic(target_kind, target, f"{label}.to"),
                      relation.upper()))
    return edges


def _hinted(parse: Callable[..., str], edge: Mapping[str, Any], name: str, label: str,
            hint: str, **options: Any) -> str:
    """``parse(edge, name)``, its error saying also what the field holds: an agent told only
    ``must be a string`` still has to guess what to send."""
    try:
        return parse(edge, name, label=label, **options)
    except ValidationError as exc:
        raise ValidationError(exc.field, f"{exc.message} ({hint})") from None


def _note_tags(kind: str, value: object) -> list[str]:
    """``kind:<type>`` then the caller's tags, parsed as ``save_memory`` parses them."""
    given = parse_tags(value)
    tags = [f"kind:{kind}", *(given.split(",") if given else [])]
    if PLACEHOLDER_TAG in tags:  # a note so tagged would be hidden, and adopted by another
        raise ValidationError("tags", f"must not hold {PLACEHOLDER_TAG!r}: memory_note gives "
                              "that tag to the nodes it makes for edge targets")
    if len(tags) > MAX_TAGS:
        raise ValidationError("tags", f"must have at most {MAX_TAGS - 1} tags, got {len(tags) - 1}")
    return tags


def _topic(kind: str, name: str, label: str) -> str:
    topic = f"note/{slug(kind)}/{slug(name)}"
    if len(topic) > MAX_KEY_CHARS:
        raise ValidationError(label, "is too long to be a stable name")
    return topic

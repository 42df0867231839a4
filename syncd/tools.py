"""The memory tools: one table of name → (description, JSON schema, handler), shared by the MCP
server and the ``POST /v1/agent/memory/tools/{name}`` routes.

Rules:
  * Argument names and result shapes are the control plane's (contract §5); syncd's extra tools
    are ``get_memory``, ``delete_memory``, ``verify_memory``, ``memory_note``, ``record_learning``.
  * Handlers decode their arguments and call one store service (``store.memories``,
    ``store.graph``, ``store.recall``), which validates them (errors name the field); they
    never touch SQL.
  * Every tool accepts ``conversationId`` and ``memoryContext``. The result always carries the
    ``conversationId`` (generated when missing) and, when there is a context (or a search
    query), ``relevant_memories``: the top one or two active memories, collapsed by
    ``dedupe_key``, repeated on later calls of the same conversation while they stay active
    (each read again, so a deleted or archived one drops out and purged text is not repeated).
    A tool that writes never lists what it wrote (the ids its answer names): the agent has
    just said it.
  * Every argument is checked by the strict redactor before any handler runs, so a value no
    UTF-8 text can hold is refused naming its field, with nothing written.
  * ``PLANE_TOOLS`` are the current plane's tools contract §5 lacks (``flush_memory``,
    ``reinforce_memory``, ``list_memory_usage``; docs/kyma-current-surface.md), with the
    plane's arguments and answers. ``HUB_TOOLS`` (the hub's MCP) has them; ``TOOLS`` (the
    daemon's) does not yet.
  * Usage counters (the plane's ``memory_usage_stats``) live beside the store, not on the
    memories: a count is telemetry, not an edit, and never syncs. They are a
    ``UsageCounters``: by default ``Usage``, the file ``USAGE_FILE`` in the store's data
    directory; a hub passes its own (``hub_tools``; on PostgreSQL a table every hub process
    shares). A ``Surfacer`` serving ``list_memory_usage`` counts a hit for every memory its
    search tools return (the plane's passive signal); ``reinforce_memory`` records a verdict.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sqlite3
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import msgspec

from local_store import Store, ValidationError
from local_store.records import (
    DEFAULT_REALM,
    MAX_CONTENT_CHARS,
    MAX_KEY_CHARS,
    normalise_memory_id,
    optional_str,
    refuse_private_id,
)
from local_store.redact import strip_json_object, strip_private
from protocol.query import QueryResponse
from protocol.timestamp import format_autosi

Handler = Callable[[Store, dict[str, Any]], Awaitable[Any]]

SURFACE_TOP = 2
SEARCH_TOOLS = frozenset({"memory_search", "recall_memory"})
READ_ONLY_TOOLS = frozenset({"memory_search", "recall_memory", "list_memories", "get_memory",
                             "memory_compare", "verify_memory", "flush_memory",
                             "list_memory_usage"})
WRITTEN_KEYS = ("node_id", "memory_id", "id")  # where a write tool's answer names what it wrote
MAX_CONVERSATIONS = 1000


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    schema: dict[str, Any]
    handler: Handler


def _obj(props: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    props = {**props, "conversationId": {"type": "string"},
             "memoryContext": {"type": "string", "description": "Short task hint: current task, "
                               "entities, constraints. Surfaces relevant memories."}}
    return {"type": "object", "properties": props, "required": list(required)}


S = {"type": "string"}
N = {"type": "number"}
I = {"type": "integer"}  # noqa: E741
SL = {"type": "array", "items": {"type": "string"}}
RECALL_PROPS = {"query": S, "limit": I, "realms": SL, "memory_type": S, "importance_min": N,
                "tags": SL, "space_agent": S}
EDGE = {"type": "object", "additionalProperties": False, "required": ["to"],
        "description": "An edge from this node to the node named `to`. A name with no node "
                       "yet gets a placeholder of type `to_type`, which that name's own "
                       "memory_note (of any type) later takes over, edges and all.",
        "properties": {
            "to": {**S, "description": "The target's name, as its own memory_note names it "
                                      "(matched case- and punctuation-insensitively)."},
            "type": {**S, "description": "The relation, e.g. USES, DEPENDS_ON, OWNS "
                                        "(upper-cased); default RELATES_TO."},
            "to_type": {**S, "description": "The target's node type, e.g. service, person; "
                                           "default concept."}},
        "examples": [{"to": "rabbitmq-main", "type": "USES", "to_type": "service"}]}
NOTE_PROPS = {
    "type": {**S, "description": "The node type, e.g. service, person, repo, concept."},
    "name": {**S, "description": "The node's stable name; a note of the same type and name "
                                "(case- and punctuation-insensitive) updates it."},
    "summary": {**S, "description": "One or two sentences on what the node is."},
    "tags": {**SL, "description": "Extra tags (kind:<type> is added)."},
    "realm": {**S, "description": "The project's realm (its directory name), where edge "
                                 "targets are looked up too; leave out for what holds "
                                 "everywhere."},
    "edges": {"type": "array", "items": EDGE,
              "description": "Edges to other nodes by name, e.g. "
                             '[{"to": "rabbitmq-main", "type": "USES"}].'}}
SAVE_PROPS = {"content": S, "title": S, "memory_type": S, "tags": SL, "realm": S,
              "importance": N, "references": SL, "topic_key": S, "why": S, "where": S,
              "learned": S, "valid_at": S}


# ---------------------------------------------------------------------- handlers

async def _search(store: Store, args: dict[str, Any]) -> Any:
    request = {k: v for k, v in args.items() if k in RECALL_PROPS or k in (
        "expand_hops", "as_of", "include_invalidated")}
    return _answer(await store.recall.query(request))


async def _recall(store: Store, args: dict[str, Any]) -> Any:
    request = {k: v for k, v in args.items() if k in RECALL_PROPS}
    request.update(expand_hops=1, as_of=None, include_invalidated=False)
    return _answer(await store.recall.query(request))


def _answer(found: QueryResponse) -> Any:
    """A recall as the plane's tools answer it: ``precedent`` is always there (none found)."""
    return msgspec.to_builtins(msgspec.structs.replace(found, precedent=None))


async def _save(store: Store, args: dict[str, Any]) -> Any:
    return await store.memories.save(args)


async def _save_many(store: Store, args: dict[str, Any]) -> Any:
    return await store.memories.save_many(args.get("memories"))  # type: ignore[arg-type]


async def _list(store: Store, args: dict[str, Any]) -> Any:
    result = await store.memories.list_memories(args)
    columns = ["id", "memory_type", "title", "content_preview", "tags", "importance", "status",
               "realm", "created_at"]
    types = {"importance": "Float64"}
    return {"columns": [{"name": c, "type": types.get(c, "Utf8")} for c in columns], **result}


async def _link(store: Store, args: dict[str, Any]) -> Any:
    return await store.graph.link(args)


async def _entity(store: Store, args: dict[str, Any]) -> Any:
    return await store.graph.ingest_entity(args)


async def _status(store: Store, args: dict[str, Any]) -> Any:
    return await store.memories.update_status(args.get("memory_id"), args.get("status"))


async def _importance(store: Store, args: dict[str, Any]) -> Any:
    return await store.memories.update_importance(args.get("memory_id"), args.get("importance"))


async def _compare(store: Store, args: dict[str, Any]) -> Any:
    a = await _maybe_get(store, args.get("memory_id"), "memory_id")
    b = await _maybe_get(store, args.get("other_id"), "other_id")
    return {"a": a, "b": b, "hint": "Decide whether the first memory supersedes, conflicts "
            "with, relates to or is compatible with the second, or whether they should be "
            "merged; then call memory_judge with verdict supersedes | conflicts | related | "
            "compatible | merged."}


async def _judge(store: Store, args: dict[str, Any]) -> Any:
    return await store.graph.judge(args.get("memory_id"), args.get("target_id"),
                                   args.get("verdict"), args.get("reason"))


async def _summary(store: Store, args: dict[str, Any]) -> Any:
    return await store.memories.session_summary(args)


async def _get(store: Store, args: dict[str, Any]) -> Any:
    return await store.memories.get(args.get("memory_id"))


async def _delete(store: Store, args: dict[str, Any]) -> Any:
    hard = args.get("hard", False)
    if not isinstance(hard, bool):
        raise ValidationError("hard", "must be a boolean")
    return await store.memories.delete(args.get("memory_id"), hard=hard)


async def _verify(store: Store, args: dict[str, Any]) -> Any:
    return await store.memories.verify(args)


async def _note(store: Store, args: dict[str, Any]) -> Any:
    return await store.graph.note(args)


async def _learning(store: Store, args: dict[str, Any]) -> Any:
    return await store.memories.learning(args)


async def _maybe_get(store: Store, memory_id: object, field: str) -> Any:
    mid = normalise_memory_id(memory_id, field)
    try:
        return await store.memories.get(mid)
    except Exception as exc:  # a missing side is a null, as in the plane
        if getattr(exc, "code", "") == "not_found":
            return None
        raise


# ---------------------------------------------------------------------- usage counters

USAGE_FILE = "memory-usage.sqlite3"
OUTCOMES = ("helpful", "not_helpful")
USAGE_LIMIT, MAX_USAGE_LIMIT = 50, 500
USAGE_SCHEMA = """CREATE TABLE IF NOT EXISTS memory_usage_stats (
    memory_id TEXT PRIMARY KEY, realm TEXT NOT NULL,
    hit_count INTEGER NOT NULL DEFAULT 0, reinforced_count INTEGER NOT NULL DEFAULT 0,
    miss_count INTEGER NOT NULL DEFAULT 0,
    last_surfaced_ns INTEGER, last_reinforced_ns INTEGER)"""
USAGE_COLUMNS = ("hit_count, reinforced_count, miss_count, last_surfaced_ns, "
                 "last_reinforced_ns")


class UsageCounters(Protocol):
    """Where a tool table's usage counters live (``Usage``; the PostgreSQL hub's table)."""

    async def surfaced(self, hits: list[tuple[str, str]]) -> None:
        """One hit for each ``(memory_id, realm)``."""
        ...

    async def feedback(self, memory_id: str, realm: str, helpful: bool) -> dict[str, Any]:
        """Record a verdict; the memory's counters after it (``_counts``' keys)."""
        ...

    async def unreinforced(self, realm: str | None, limit: int) -> list[dict[str, Any]]:
        """Memories surfaced but never judged, most hits first (then last surfaced first)."""
        ...


UsageOf = Callable[[Store], UsageCounters]


def file_usage(store: Store) -> UsageCounters:
    """The default counters: ``USAGE_FILE`` in ``store``'s data directory."""
    return Usage(store.data_dir)


class Usage:
    """The usage counters of the store in ``data_dir`` (rules above), the plane's semantics:
    a hit bumps ``hit_count``, a verdict ``reinforced_count`` (helpful) or ``miss_count``; a
    memory's realm is the one its first count was recorded under. The file is made by the
    first count; every call runs on a worker thread."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / USAGE_FILE

    async def surfaced(self, hits: list[tuple[str, str]]) -> None:
        """One hit for each ``(memory_id, realm)``."""
        if hits:
            await asyncio.to_thread(self._surfaced, hits, time.time_ns())

    async def feedback(self, memory_id: str, realm: str, helpful: bool) -> dict[str, Any]:
        """Record a verdict; the memory's counters after it."""
        return await asyncio.to_thread(self._feedback, memory_id, realm, helpful,
                                       time.time_ns())

    async def unreinforced(self, realm: str | None, limit: int) -> list[dict[str, Any]]:
        """Memories surfaced but never judged, most hits first (then last surfaced first)."""
        return await asyncio.to_thread(self._unreinforced, realm, limit)

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=10.0)
        # telemetry: a hit lost to a power cut costs nothing, an fsync on every query would
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute(USAGE_SCHEMA)
        return conn

    def _surfaced(self, hits: list[tuple[str, str]], now: int) -> None:
        with contextlib.closing(self._connect()) as conn, conn:
            conn.executemany(
                "INSERT INTO memory_usage_stats (memory_id, realm, hit_count, last_surfaced_ns) "
                "VALUES (?, ?, 1, ?) ON CONFLICT (memory_id) DO UPDATE SET "
                "hit_count = hit_count + 1, last_surfaced_ns = excluded.last_surfaced_ns",
                [(mid, realm, now) for mid, realm in hits])

    def _feedback(self, memory_id: str, realm: str, helpful: bool, now: int) -> dict[str, Any]:
        good, bad = (1, 0) if helpful else (0, 1)
        with contextlib.closing(self._connect()) as conn, conn:
            row = conn.execute(
                "INSERT INTO memory_usage_stats (memory_id, realm, reinforced_count, miss_count, "
                "last_reinforced_ns) VALUES (?, ?, ?, ?, ?) ON CONFLICT (memory_id) DO UPDATE "
                "SET reinforced_count = reinforced_count + excluded.reinforced_count, "
                "miss_count = miss_count + excluded.miss_count, "
                "last_reinforced_ns = excluded.last_reinforced_ns "
                f"RETURNING {USAGE_COLUMNS}", (memory_id, realm, good, bad, now)).fetchone()
        return _counts(row)

    def _unreinforced(self, realm: str | None, limit: int) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with contextlib.closing(self._connect()) as conn:
            rows = conn.execute(
                f"SELECT memory_id, {USAGE_COLUMNS} FROM memory_usage_stats WHERE hit_count > 0 "
                "AND reinforced_count = 0 AND miss_count = 0 AND (? IS NULL OR realm = ?) "
                "ORDER BY hit_count DESC, last_surfaced_ns DESC, memory_id LIMIT ?",
                (realm, realm, limit)).fetchall()
        return [usage_row(*row) for row in rows]


def usage_row(memory_id: str, *row: Any) -> dict[str, Any]:
    """One ``list_memory_usage`` entry from a stored row (``USAGE_COLUMNS``' order)."""
    return {"memory_id": memory_id, **_counts(row)}


def _counts(row: tuple[Any, ...]) -> dict[str, Any]:
    hits, good, bad, surfaced, judged = row
    return {"hit_count": hits, "reinforced_count": good, "miss_count": bad,
            "last_surfaced_at": None if surfaced is None else format_autosi(surfaced),
            "last_reinforced_at": None if judged is None else format_autosi(judged)}


async def _flush(store: Store, args: dict[str, Any]) -> Any:
    """Every write is committed before its tool answers: there is no queue to wait for."""
    _strings(args, "realms")
    return {"flushed": True}


async def _reinforce(usage_of: UsageOf, store: Store, args: dict[str, Any]) -> Any:
    """The plane's verdict: a memory that cannot be read is counted under the default realm."""
    mid = normalise_memory_id(args.get("memory_id"))
    outcome = args.get("outcome")
    if outcome not in OUTCOMES:
        raise ValidationError("outcome", "must be helpful or not_helpful")
    optional_str(args, "reason", limit=MAX_CONTENT_CHARS)  # the plane only logs it; syncd not
    try:
        realm = str((await store.memories.get(mid))["realm"])
    except Exception as exc:
        if getattr(exc, "code", "") != "not_found":
            raise
        realm = DEFAULT_REALM
    counts = await usage_of(store).feedback(mid, realm, outcome == "helpful")
    return {"ok": True, "memory_id": mid, "hit_count": counts["hit_count"],
            "reinforced_count": counts["reinforced_count"], "miss_count": counts["miss_count"]}


async def _usage_list(usage_of: UsageOf, store: Store, args: dict[str, Any]) -> Any:
    limit = args.get("limit", USAGE_LIMIT)
    if limit is None:
        limit = USAGE_LIMIT
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        raise ValidationError("limit", "must be an integer, 0 or more")
    realm = optional_str(args, "realm")
    found = await usage_of(store).unreinforced(realm, min(max(limit, 1), MAX_USAGE_LIMIT))
    return {"memories": found}


def _strings(args: Mapping[str, Any], name: str) -> list[str]:
    value = args.get(name)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValidationError(name, "must be a list of strings")
    return value


# ---------------------------------------------------------------------- the table

TOOLS: dict[str, Tool] = {t.name: t for t in (
    Tool("memory_search", "Search long-term memory with hybrid recall (keywords + meaning + "
         "graph). Use before starting a task. Supports expand_hops (0-2), as_of (RFC 3339, "
         "point-in-time) and include_invalidated. Returns the nearest memories ranked; each "
         "says whether it surely answers the query (confident), the answer whether any does "
         "(matched).",
         _obj({**RECALL_PROPS, "expand_hops": I, "as_of": S, "include_invalidated":
               {"type": "boolean"}}, ("query",)), _search),
    Tool("recall_memory", "Recall memories relevant to a query (1 graph hop, current facts only).",
         _obj(RECALL_PROPS, ("query",)), _recall),
    Tool("save_memory", "Save one durable memory: a fact, decision, preference, learning, "
         "procedure, summary or entity. Text inside <private>…</private> is never stored. "
         "Same realm + topic_key updates in place.", _obj(SAVE_PROPS, ("content",)), _save),
    Tool("save_memories", "Save several memories at once; bad items are reported by index.",
         _obj({"memories": {"type": "array", "items": {"type": "object"}}}, ("memories",)),
         _save_many),
    Tool("list_memories", "List memories newest first, with filters.",
         _obj({"limit": I, "offset": I, "memory_type": S, "status": S, "realm": S,
               "tags": SL}), _list),
    Tool("link_memory_to_entity", "Link a memory to any node id (an entity, a repo, a file).",
         _obj({"memory_id": S, "target_node_id": S, "relationship_type": S,
               "target_namespace": S, "realm": S}, ("memory_id", "target_node_id")), _link),
    Tool("ingest_entity", "Create or update an entity (service, repo, person, table…) by realm, "
         "kind and name, with properties and links.",
         _obj({"name": S, "kind": S, "properties": {"type": "object"}, "realm": S,
               "links": {"type": "array", "items": {"type": "object"}}, "icon": S, "type": S},
              ("name",)), _entity),
    Tool("update_memory_status", "Set a memory's status: active, background or archived.",
         _obj({"memory_id": S, "status": S}, ("memory_id", "status")), _status),
    Tool("update_memory_importance", "Set a memory's importance (0-1).",
         _obj({"memory_id": S, "importance": N}, ("memory_id", "importance")), _importance),
    Tool("memory_compare", "Fetch two memories side by side to decide how they relate.",
         _obj({"memory_id": S, "other_id": S}, ("memory_id", "other_id")), _compare),
    Tool("memory_judge", "Record a verdict between two memories: supersedes (invalidates the "
         "target), merged (archives it), or any relation such as conflicts/related.",
         _obj({"memory_id": S, "target_id": S, "verdict": S, "reason": S},
              ("memory_id", "target_id", "verdict")), _judge),
    Tool("memory_session_summary", "Save a summary of this session for the next one.",
         _obj({"goal": S, "instructions": S, "discoveries": S, "accomplished": S,
               "next_steps": S, "files": SL, "realm": S}), _summary),
    Tool("get_memory", "Get one memory with its edges.", _obj({"memory_id": S}, ("memory_id",)),
         _get),
    Tool("delete_memory", "Delete a memory (hard=true also purges its text; a tombstone stays "
         "so other machines delete it too).", _obj({"memory_id": S, "hard": {"type": "boolean"}},
                                                  ("memory_id",)), _delete),
    Tool("verify_memory", "Before saving, find related existing memories and get advice: add, "
         "update/supersede, or noop.", _obj({"content": S, "realm": S, "memory_type": S},
                                           ("content",)), _verify),
    Tool("memory_note", "Assert a typed node by a stable name with a one- or two-sentence "
         "summary, tags and edges to other nodes by name; merged on type + name, never "
         "duplicated. A name first seen as an edge target is a placeholder until its own "
         "note, of any type, takes it over.", _obj(NOTE_PROPS, ("type", "name", "summary")), _note),
    Tool("record_learning", "Record a one-line lesson for future sessions.",
         _obj({"content": S, "realm": S, "tags": SL}, ("content",)), _learning),
)}

def plane_tools(usage_of: UsageOf = file_usage) -> dict[str, Tool]:
    """The plane's three tools, their counters ``usage_of(store)``."""
    return {t.name: t for t in (
        Tool("flush_memory", "Wait until saved memories are committed. syncd commits every "
             "write before its tool answers, so this returns at once; kept for agents written "
             "for the plane.", _obj({"realms": {**SL, "description": "Realms to flush; empty = all."}}),
             _flush),
        Tool("reinforce_memory", "After acting on a recalled memory, report whether it "
             "helped: outcome 'helpful' or 'not_helpful'. Records usage counts, not an edit of "
             "the memory.",
             _obj({"memory_id": S, "outcome": {**S, "enum": list(OUTCOMES)},
                   "reason": {**S, "description": "Why; not stored."}},
                  ("memory_id", "outcome")), functools.partial(_reinforce, usage_of)),
        Tool("list_memory_usage", "Memories recalled at least once but never judged with "
             "reinforce_memory, most recalled first: the worklist for inferring verdicts.",
             _obj({"realm": {**S, "description": "One realm; omit for all."},
                   "limit": {**I, "minimum": 0, "description": "At most this many (default 50, "
                             "1-500)."}}), functools.partial(_usage_list, usage_of)),
    )}


PLANE_TOOLS = plane_tools()
HUB_TOOLS: dict[str, Tool] = {**TOOLS, **PLANE_TOOLS}


def hub_tools(usage_of: UsageOf) -> dict[str, Tool]:
    """``HUB_TOOLS`` with the hub's own counters (serve them with ``Surfacer(…, usage_of)``)."""
    return {**TOOLS, **plane_tools(usage_of)}


def _check_conversation(value: object) -> None:
    """A conversation id is kept as a key (up to ``MAX_CONVERSATIONS`` of them) and echoed in
    every result, so it is capped like the store's other keys."""
    if not isinstance(value, str):
        raise ValidationError("conversationId", "must be a string")
    if len(value) > MAX_KEY_CHARS:
        raise ValidationError("conversationId",
                              f"must be at most {MAX_KEY_CHARS} characters, got {len(value)}")
    refuse_private_id(value, "conversationId")


class Surfacer:
    """Remembers, per conversation, what was surfaced, so it is repeated on later calls; calls
    the tools of ``tools``, counting usage in ``usage_of(store)`` when they include
    ``list_memory_usage``."""

    def __init__(self, tools: Mapping[str, Tool] = TOOLS,
                 usage_of: UsageOf = file_usage) -> None:
        self.tools, self.usage_of = tools, usage_of
        self.counts_usage = "list_memory_usage" in tools
        self._seen: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()

    async def call(self, store: Store, name: str, args: Mapping[str, Any]) -> Any:
        tool = self.tools.get(name)
        if tool is None:
            raise ValidationError("name", f"unknown tool {strip_private(name)[:80]!r}")
        if not isinstance(args, Mapping):
            raise ValidationError("arguments", "must be a JSON object")
        # A lone surrogate (JSON spells one "\ud800") in an argument the store does not read
        # strictly (conversationId, an id, realms) failed as an internal error, after the
        # write in conversationId's case: the strict redactor refuses it here, naming it.
        strip_json_object(args)
        params = dict(args)
        conversation = params.pop("conversationId", None)
        context = params.pop("memoryContext", None)
        if conversation is not None:  # a key, echoed in every result: never rewritten
            _check_conversation(conversation)
        if context is not None and not isinstance(context, str):
            raise ValidationError("memoryContext", "must be a string")
        conversation = conversation or f"conv-{uuid.uuid4()}"
        result = await tool.handler(store, params)
        if self.counts_usage and name in SEARCH_TOOLS and isinstance(result, dict):
            await self.usage_of(store).surfaced(
                [(m["id"], m["realm"]) for m in result["memories"]])
        searched = None
        if context is None and name in SEARCH_TOOLS and isinstance(result, dict):
            searched = result["memories"]  # the search itself is the hint: reuse its answer
        surfaced = await self._surface(store, conversation, context, searched)
        if name not in READ_ONLY_TOOLS:  # what the agent just wrote is no news to it
            written = _written_ids(result)
            surfaced = [m for m in surfaced if m["id"] not in written]
        if isinstance(result, dict):
            result = {**result, "conversationId": conversation}
            if surfaced:
                result["relevant_memories"] = surfaced
        return result

    async def _surface(self, store: Store, conversation: str, hint: str | None,
                       found: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
        """Top confident matches for the hint (or from a search's own answer), newest first,
        merged with what this conversation already surfaced, each read again (``_current``).
        The list is taken and written back with no await in between: a parallel call of the
        same conversation keeps what it added, and sees what this one surfaced."""
        if found is None and hint and hint.strip():
            answer = await store.recall.query({"query": hint, "limit": 8, "expand_hops": 0,
                                         "confident_only": True})
            found = msgspec.to_builtins(answer.memories)
        fresh = [_brief(m) for m in found or () if m["confident"]][:SURFACE_TOP]
        now: dict[str, dict[str, Any] | None] = {m["id"]: m for m in fresh}
        now.update(await _current(store, [m["id"] for m in self._seen.get(conversation, ())
                                          if m["id"] not in now]))
        kept = [now.get(m["id"], m) for m in self._seen.pop(conversation, [])]
        known = [m for m in kept if m is not None]
        shown = {m["id"] for m in known}
        known = ([m for m in fresh if m["id"] not in shown] + known)[:SURFACE_TOP * 2]
        self._seen[conversation] = known
        while len(self._seen) > MAX_CONVERSATIONS:
            self._seen.popitem(last=False)
        return known


def _written_ids(result: object) -> set[str]:
    """Every memory id a write tool's answer names (``WRITTEN_KEYS``, nested answers too:
    ``save_memories``' rows, ``memory_note``'s edge targets)."""
    found: set[str] = set()
    if isinstance(result, dict):
        for key, value in result.items():
            if key in WRITTEN_KEYS and isinstance(value, str):
                found.add(value)
            else:
                found |= _written_ids(value)
    elif isinstance(result, list):
        for item in result:
            found |= _written_ids(item)
    return found


def _brief(memory: Mapping[str, Any]) -> dict[str, Any]:
    preview = memory["content_preview"]
    return {"id": memory["id"], "subject": memory["title"] or memory["memory_type"],
            "summary": preview.splitlines()[0][:160] if preview else ""}


async def _current(store: Store, ids: list[str]) -> dict[str, dict[str, Any] | None]:
    """Each memory as the store holds it now, or ``None`` where recall would no longer find
    it (deleted, archived, invalidated): a hard delete purges the text, which must not keep
    being served from this cache. At most ``SURFACE_TOP * 2`` ids, read in one query."""
    if not ids:
        return {}
    found = await store.memories.active_briefs(ids)
    return {mid: _brief(found[mid]) if mid in found else None for mid in ids}

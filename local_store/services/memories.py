"""``store.memories``: saving, editing, deleting and reading memories, each write one transaction.

Rules:
  * Every argument passes the redactor, then is validated, before anything is written: a
    refused call writes nothing, and its error names the field.
  * A write embeds its text before its transaction (``Shell._write_embedded``); while the
    embedder fails the memory is saved without a vector, and owed one.
  * Reads see what recall's default filters see where they say so (``active_briefs``,
    ``list_memories``: invalidated and deleted memories left out, archived unless asked).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from local_store.arguments import int_arg, joined_strings, lenient_type, like_escape
from local_store.columns import EDGE_ALL, EDGE_SELECT, NODE_COLUMNS, NODE_SELECT
from local_store.db import chunks, marks
from local_store.errors import NotFoundError, ValidationError
from local_store.records import (
    EDIT_FIELDS,
    MAX_CONTENT_CHARS,
    MAX_KEY_CHARS,
    Draft,
    build_edit,
    build_save,
    dedupe_key,
    normalise_memory_id,
    optional_str,
    parse_importance,
    parse_realm,
    parse_status,
    parse_tags,
)
from local_store.redact import REDACTED, strip_json_object
from local_store.shell import Shell
from local_store.views import edge_view, list_view, memory_view
from local_store.writes import Vector, Writer

if TYPE_CHECKING:
    from local_store.services.recall import Recaller

MAX_BATCH = 1000
LIST_LIMIT_DEFAULT = 50
LIST_LIMIT_MAX = 500
SUMMARY_FIELDS = (("goal", "Goal"), ("instructions", "Instructions"),
                  ("discoveries", "Discoveries"), ("accomplished", "Accomplished"),
                  ("next_steps", "Next steps"), ("files", "Files"))


class Memories:
    """The memory operations of the tools and routes (``store.memories``)."""

    def __init__(self, shell: Shell, recall: Recaller) -> None:
        self._shell, self._recall = shell, recall

    # ------------------------------------------------------------------ saves

    async def save(self, args: Mapping[str, object]) -> dict[str, Any]:
        """``save_memory``: validate + redact + fold, embed, then one transaction."""
        draft = build_save(args, self._shell.writer_info)
        result = await self._shell._write_embedded(
            [draft.content], lambda w, vectors: w.save(draft, vectors[0]))
        if draft.coerced:
            result["coerced"] = dict(draft.coerced)
        return result

    async def save_many(self, items: Sequence[object]) -> dict[str, Any]:
        """``save_memories``: invalid items are reported by index; the valid ones save together."""
        if not isinstance(items, list | tuple):
            raise ValidationError("memories", "must be a list of memory objects")
        if not items:
            raise ValidationError("memories", "is empty")
        if len(items) > MAX_BATCH:
            raise ValidationError("memories", f"must have at most {MAX_BATCH} items")
        drafts: list[tuple[int, Draft]] = []
        errors: list[str] = []
        for index, item in enumerate(items):
            try:
                if not isinstance(item, Mapping):
                    raise ValidationError(f"memories[{index}]", "must be an object")
                drafts.append((index, build_save(item, self._shell.writer_info,
                                                 label=f"memories[{index}]")))
            except ValidationError as exc:
                errors.append(f"#{index}: {exc}")
        def run(w: Writer, vectors: list[Vector | None]) -> list[dict[str, Any]]:
            return [w.save(d, v) for (_, d), v in zip(drafts, vectors, strict=True)]

        results = (await self._shell._write_embedded([d.content for _, d in drafts], run)
                   if drafts else [])
        ids: list[str | None] = [None] * len(items)
        for (index, _), res in zip(drafts, results, strict=True):
            ids[index] = res["id"]
        out: dict[str, Any] = {"saved": bool(results), "count": len(results), "ids": ids}
        if errors:
            out["errors"] = errors
        return out

    async def session_summary(self, args: Mapping[str, object]) -> dict[str, Any]:
        """``memory_session_summary``: one summary memory from the non-empty fields."""
        clean = strip_json_object(args)
        parts, sizes = [], dict[str, int]()
        for key, label in SUMMARY_FIELDS:
            value = clean.get(key)
            if isinstance(value, list):
                value = joined_strings(value, key)
            text = optional_str({key: value}, key, limit=64 * 1024)
            if text:
                parts.append(f"\n{label}: {text}")
                sizes[key] = len(text)
        if not parts:
            raise ValidationError("goal", "nothing to summarize — provide at least one field")
        if len("Session summary.") + sum(len(part) for part in parts) > MAX_CONTENT_CHARS:
            longest = max(sizes, key=lambda key: sizes[key])
            raise ValidationError(longest, f"the fields together must be at most "
                                  f"{MAX_CONTENT_CHARS} characters (this one is the longest)")
        return await self.save({
            "content": "Session summary." + "".join(parts), "title": "Session summary",
            "memory_type": "summary", "importance": 0.6, "tags": ["session-summary"],
            "realm": clean.get("realm"),
        })

    async def learning(self, args: Mapping[str, object]) -> dict[str, Any]:
        """``record_learning``: a one-line lesson; the length limit applies to the redacted
        text."""
        clean = strip_json_object(args)
        content = text_arg(clean, "content", limit=4000)
        return await self.save({"content": content, "memory_type": "learning",
                                "importance": 0.6, "realm": clean.get("realm"),
                                "tags": clean.get("tags")})

    async def verify(self, args: Mapping[str, object]) -> dict[str, Any]:
        """``verify_memory``: related existing memories for a candidate, and what to do with
        it."""
        clean = strip_json_object(args)
        content = text_arg(clean, "content", limit=MAX_CONTENT_CHARS)
        realm = optional_str(clean, "realm")
        request: dict[str, Any] = {"query": content, "limit": 5, "expand_hops": 0,
                                   "confident_only": True}
        if realm:
            request["realms"] = [realm]
        found = await self._recall.query(request)
        related: list[dict[str, Any]] = [
            {"id": m.id, "memory_type": m.memory_type, "content_preview": m.content_preview,
             "similarity": None if m.distance is None else round(1.0 - m.distance, 4),
             "score": round(m.score, 4)} for m in found.memories if not m.fallback]
        best = max((r["similarity"] or 0.0 for r in related), default=0.0)
        if best >= 0.92:
            advice = "noop: an equivalent memory exists; update it instead of adding a copy"
        elif best >= 0.6:
            advice = ("update or supersede: a closely related memory exists; if the candidate "
                      "replaces it, save the new one and call memory_judge with verdict "
                      "supersedes")
        else:
            advice = "add: nothing closely related is stored"
        return {"related": related, "recommendation": advice.split(":", 1)[0], "advice": advice}

    # ------------------------------------------------------------------ mutations

    async def update_status(self, memory_id: object, status: object) -> dict[str, Any]:
        mid = normalise_memory_id(memory_id)
        value = parse_status(status)
        await self._shell._write(lambda w: w.mutate(mid, {"status": value}))
        return {"ok": True, "memory_id": mid, "status": value}

    async def update_importance(self, memory_id: object, importance: object) -> dict[str, Any]:
        mid = normalise_memory_id(memory_id)
        if importance is None:
            raise ValidationError("importance", "is required")
        coerced: dict[str, str] = {}  # a clamp is said, as ``save`` says it
        value = parse_importance(importance, coerced=coerced)
        await self._shell._write(lambda w: w.mutate(mid, {"importance": value}))
        result: dict[str, Any] = {"ok": True, "memory_id": mid, "importance": value}
        if coerced:
            result["coerced"] = coerced
        return result

    async def edit(self, memory_id: object, args: object) -> dict[str, Any]:
        """An edit of a memory's content, title, tags or importance (``records.build_edit``):
        a new version that syncs, with the same id, realm and type. New content is embedded
        again, as a save's is."""
        mid = normalise_memory_id(memory_id)
        changes, coerced = build_edit(args)

        def run(w: Writer, vectors: list[Vector | None]) -> dict[str, Any]:
            row = w.live_node(mid, "memory_id")
            row.update(changes)
            if "content" in changes:
                row["dedupe_key"] = dedupe_key(row["realm"], row["memory_type"], row["content"])
            written = w.put_node(row, vectors[0] if vectors else None)
            result: dict[str, Any] = {"ok": True, "memory_id": mid,
                                      "updated_at": written["updated_at"],
                                      "changed": [f for f in EDIT_FIELDS if f in changes]}
            if coerced:
                result["coerced"] = coerced
            return result

        content = changes.get("content")
        if isinstance(content, str):
            return await self._shell._write_embedded([content], run)
        return await self._shell._write(lambda w: run(w, []))

    async def delete(self, memory_id: object, *, hard: bool = False) -> dict[str, Any]:
        mid = normalise_memory_id(memory_id)
        await self._shell._write(lambda w: w.delete(mid, hard=hard))
        return {"ok": True, "memory_id": mid, "deleted": True, "hard": hard}

    # ------------------------------------------------------------------ reads

    async def get(self, memory_id: object) -> dict[str, Any]:
        mid = normalise_memory_id(memory_id)
        rows = await self._shell._fetch(NODE_SELECT + " WHERE id = ? AND deleted = 0", (mid,))
        if not rows:
            raise NotFoundError(f"memory_id: memory {mid} not found")
        node = memory_view(dict(zip(NODE_COLUMNS, rows[0], strict=True)))
        edges = await self._shell._fetch(EDGE_SELECT + " WHERE (src = ? OR dst = ?) AND "
                                         "deleted = 0 ORDER BY id", (mid, mid))
        node["edges"] = [edge_view(dict(zip(EDGE_ALL, e, strict=True))) for e in edges]
        return node

    async def active_briefs(self, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Title, type and preview of each of ``ids`` that recall's default filters would still
        find (live, not archived, not invalidated), in one query; others are left out."""
        found: dict[str, dict[str, Any]] = {}
        for chunk in chunks(list(ids)):
            for mid, title, kind, preview in await self._shell._fetch(
                    "SELECT id, title, memory_type, content_preview FROM memories WHERE "
                    "deleted = 0 AND status <> 'archived' AND invalid_at IS NULL AND id IN "
                    f"({marks(chunk)})", chunk):
                found[mid] = {"id": mid, "title": title, "memory_type": kind,
                              "content_preview": preview}
        return found

    async def list_memories(self, args: Mapping[str, object] | None = None) -> dict[str, Any]:
        """``list_memories``: newest first; invalidated and deleted excluded; archived unless asked."""
        clean = strip_json_object({} if args is None else args)
        limit = int_arg(clean, "limit", LIST_LIMIT_DEFAULT, 1, LIST_LIMIT_MAX)
        offset = int_arg(clean, "offset", 0, 0, 10**9)
        where, params = ["deleted = 0", "invalid_at IS NULL"], []
        if clean.get("status") is not None:
            where.append("status = ?")
            params.append(parse_status(clean["status"]))
        else:
            where.append("status <> 'archived'")
        if clean.get("realm") is not None:
            where.append("realm = ?")
            params.append(parse_realm(clean["realm"]))
        if clean.get("memory_type") is not None:
            where.append("memory_type = ?")
            params.append(lenient_type(clean["memory_type"]))
        tags = parse_tags(clean.get("tags"))  # a wrong type is refused, even a falsy one
        for tag in tags.split(",") if tags else []:
            where.append("(',' || tags || ',') LIKE ? ESCAPE '\\'")
            params.append("%," + like_escape(tag) + ",%")
        sql = (NODE_SELECT + " WHERE " + " AND ".join(where)
               + " ORDER BY created_at DESC, id LIMIT ? OFFSET ?")
        rows = await self._shell._fetch(sql, [*params, limit, offset])
        items = [list_view(dict(zip(NODE_COLUMNS, r, strict=True))) for r in rows]
        return {"rows": items, "row_count": len(items), "truncated": len(items) == limit}


def text_arg(args: Mapping[str, Any], name: str, *, limit: int = MAX_KEY_CHARS,
             label: str | None = None, default: str | None = None) -> str:
    """A trimmed string with something left besides ``[redacted]``; missing is ``default``
    when there is one, else an error naming the field."""
    value = optional_str(args, name, limit=limit, label=label)
    if value is None and default is not None:
        return default
    if value is None:
        raise ValidationError(label or name, "is required and must be a non-empty string")
    if not value.replace(REDACTED, "").strip():
        raise ValidationError(label or name, "is empty after removing <private> sections")
    return value

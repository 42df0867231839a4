"""The store as Markdown a person can read and grep (``syncd export --format markdown``,
``GET /v1/agent/memory/export?format=markdown``).

Rules:
  * One section per live memory, in the export's order (oldest write first): a heading (the
    title, else the content's first line), a list of its fields — id, type, realm, tags,
    importance, status, topic key, written, validity, what superseded it — and its edges both
    ways, then its content. No vectors, no tombstones.
  * The content is quoted line by line (``> ``), so a memory holding Markdown of its own (a
    heading, a list, a fence) can never break the file's structure; every other value is one
    line with its line breaks folded.
  * Edges are read first (they carry no vectors: a few hundred bytes each) and held while the
    memories stream a page at a time, so memory is bounded by the edges and one page.
  * JSON stays the export format for machines and the only one ``import`` takes: the heading
    line this file starts with (``MARKDOWN_FIRST_LINE``) is how ``import`` recognises one.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable

from local_store.exporting import ExportPages
from protocol.rows import EdgeRow, NodeRow

MARKDOWN_FIRST_LINE = "# syncd memories"
HEADING_CHARS = 100


async def markdown_pages(snapshot: ExportPages, realm: str | None) -> AsyncIterator[str]:
    """The export as Markdown, a page of memories at a time."""
    outgoing: dict[str, list[EdgeRow]] = defaultdict(list)
    incoming: dict[str, list[EdgeRow]] = defaultdict(list)
    async for page in snapshot.edge_pages():
        for edge in page:
            if edge.src:
                outgoing[edge.src].append(edge)
            if edge.dst:
                incoming[edge.dst].append(edge)
    scope = f" in realm {_line(realm)}" if realm is not None else ""
    yield f"{MARKDOWN_FIRST_LINE}\n\n{snapshot.memories} memories{scope}.\n"
    async for nodes in snapshot.node_pages():
        yield "".join(memory_section(node, outgoing.get(node.id or "", ()),
                                     incoming.get(node.id or "", ()))
                      for node in nodes if not node.deleted)


def memory_section(node: NodeRow, outgoing: Iterable[EdgeRow],
                   incoming: Iterable[EdgeRow]) -> str:
    """One memory's section (module rules)."""
    fields = [("id", f"`{node.id}`"), ("type", node.memory_type), ("realm", node.realm),
              ("tags", ", ".join(t for t in (node.tags or "").split(",") if t) or None),
              ("importance", None if node.importance is None else f"{node.importance:g}"),
              ("status", node.status), ("topic key", node.topic_key),
              ("written", _stamp(node.updated_at)), ("valid", _validity(node)),
              ("superseded by", f"`{node.superseded_by}`" if node.superseded_by else None)]
    lines = [f"\n## {_heading(node)}\n"]
    lines += [f"- {name}: {_line(value)}" for name, value in fields if value]
    lines += [f"- {_line(e.type)} → `{e.dst}`" for e in outgoing]
    lines += [f"- ← {_line(e.type)} from `{e.src}`" for e in incoming]
    content = (node.content or "").splitlines() or [""]
    lines.append("")
    lines += [f"> {line}".rstrip() for line in content]
    return "\n".join(lines) + "\n"


def _heading(node: NodeRow) -> str:
    first = next((line for line in (node.content or "").splitlines() if line.strip()), "")
    text = _line(node.title) if node.title and node.title.strip() else _line(first)
    if len(text) > HEADING_CHARS:
        text = text[:HEADING_CHARS - 1].rstrip() + "…"
    return text or f"({node.memory_type or 'memory'} with no text)"


def _validity(node: NodeRow) -> str | None:
    if node.valid_at is None and node.invalid_at is None:
        return None
    return f"{_stamp(node.valid_at) or '…'} to {_stamp(node.invalid_at) or 'now'}"


def _stamp(stamp: str | None) -> str | None:
    """A stored stamp to the second, in UTC ("2026-12-02 19:25:43 UTC"); any other text as
    it is."""
    if stamp is None or not _CANONICAL.fullmatch(stamp):
        return stamp
    return f"{stamp[:10]} {stamp[11:19]} UTC"


_CANONICAL = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(\+00:00|Z)")


def _line(value: object) -> str:
    """One line: line breaks and runs of spaces folded to one space."""
    return " ".join(str(value).split()) if value is not None else ""

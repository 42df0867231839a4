"""The plane's memory node and edge rows, and the bodies of export, changes and import.

Rules:
1. Rows mirror the plane's JSON (contract §2, §2.5): a NULL column is an omitted key. So row
   structs use ``omit_defaults``, every field defaults to None, and a missing key decodes
   as None. Unknown keys are ignored (never ``forbid_unknown_fields``): the plane adds columns.
2. ``tags``, ``provenance`` and ``props`` are JSON text inside a string. An array or object
   there is a decode error that names its path (e.g. ``$.memory_nodes[0].tags``), the same
   way the plane's import rejects it.
3. Fields after the plane's columns (``origin``, ``deleted``, and ``updated_at`` on edges)
   are syncd extensions. The plane ignores them, and they are omitted when None.
4. Body arrays (``memory_nodes``, ``memory_edges``, ``errors``) and the import counters are
   always encoded, as the plane always sends them, yet they may be missing when decoding.
   They use a default factory msgspec cannot see through (``_empty``/``_zero``, not
   ``list``). Such a field is never treated as "at its default", so ``omit_defaults`` keeps it.
"""

from typing import Any

import msgspec

NODE_EXPORT_COLUMNS: tuple[str, ...] = (
    "id",
    "labels",
    "realm",
    "memory_type",
    "title",
    "content",
    "content_preview",
    "tags",
    "importance",
    "status",
    "source_session_id",
    "source_run_id",
    "embedding",
    "created_at",
    "updated_at",
    "valid_at",
    "invalid_at",
    "superseded_by",
    "provenance",
    "topic_key",
)
NODE_LATE_COLUMNS: tuple[str, ...] = ("memory_class", "space", "writer_agent_id")
EDGE_COLUMNS: tuple[str, ...] = (
    "id",
    "src",
    "dst",
    "type",
    "realm",
    "target_namespace",
    "props",
    "created_at",
)


def _empty() -> list[Any]:
    return []


def _zero() -> int:
    return 0


class NodeRow(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One version of a memory node (``memory_nodes`` row)."""

    id: str | None = None  # non-nullable in the plane; the store validates it
    labels: str | None = None
    realm: str | None = None
    memory_type: str | None = None
    title: str | None = None
    content: str | None = None
    content_preview: str | None = None
    tags: str | None = None  # comma-joined, e.g. "a,b"
    importance: float | None = None
    status: str | None = None
    source_session_id: str | None = None
    source_run_id: str | None = None
    embedding: list[float] | None = None
    created_at: str | None = None
    updated_at: str | None = None  # the latest-wins version key
    valid_at: str | None = None
    invalid_at: str | None = None
    superseded_by: str | None = None
    provenance: str | None = None  # JSON text
    topic_key: str | None = None
    memory_class: str | None = None
    space: str | None = None
    writer_agent_id: str | None = None
    origin: str | None = None  # syncd: replica id that wrote this version
    deleted: bool | None = None  # syncd: tombstone flag
    base: str | None = None  # syncd: the version this one was written over ("": none)


class EdgeRow(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One ``memory_edges`` row. The plane appends edges and never dedups them."""

    id: str | None = None
    src: str | None = None
    dst: str | None = None
    type: str | None = None
    realm: str | None = None
    target_namespace: str | None = None
    props: str | None = None  # JSON text
    created_at: str | None = None
    origin: str | None = None  # syncd: replica id that wrote this version
    deleted: bool | None = None  # syncd: tombstone flag
    updated_at: str | None = None  # syncd: the edge's version


def edge_id(src: str, dst: str, type: str) -> str:
    """The plane's deterministic edge id (contract §2.3)."""
    return f"{src}->{dst}:{type}"


class ExportBody(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``GET /v1/agent/memory/export`` response."""

    memory_nodes: list[NodeRow] = msgspec.field(default_factory=_empty)
    memory_edges: list[EdgeRow] = msgspec.field(default_factory=_empty)
    hint: str | None = None
    store_id: str | None = None  # syncd
    has_more: bool | None = None  # syncd
    next_cursor: str | None = None  # syncd


# syncd's export answer carries its row counts in these headers (memories, edges): the body is
# streamed, so a client copying it to a file can report them without parsing it.
EXPORT_COUNT_HEADERS = ("X-Syncd-Memories", "X-Syncd-Edges")


class ChangesResponse(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``GET /v1/agent/memory/changes`` response; ``since``/``until`` are kept verbatim."""

    since: str
    until: str
    memory_nodes: list[NodeRow] = msgspec.field(default_factory=_empty)
    memory_edges: list[EdgeRow] = msgspec.field(default_factory=_empty)
    store_id: str | None = None  # syncd
    has_more: bool | None = None  # syncd
    feed: str | None = None  # syncd: "ingest" when since/until follow the server's ingest order


class ImportRequest(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``POST /v1/agent/memory/import`` body."""

    memory_nodes: list[NodeRow] = msgspec.field(default_factory=_empty)
    memory_edges: list[EdgeRow] = msgspec.field(default_factory=_empty)


class RowError(msgspec.Struct, kw_only=True):
    """syncd: why one imported row was refused (``kind`` is ``node`` or ``edge``)."""

    kind: str
    index: int
    id: str | None = None
    field: str | None = None
    message: str


class ImportResult(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``POST /v1/agent/memory/import`` response; ``error`` is the plane's odd 200 body."""

    applied_nodes: int = msgspec.field(default_factory=_zero)
    applied_edges: int = msgspec.field(default_factory=_zero)
    errors: list[str] = msgspec.field(default_factory=_empty)
    error: str | None = None
    row_errors: list[RowError] | None = None  # syncd


json_encoder = msgspec.json.Encoder()
node_row_decoder = msgspec.json.Decoder(NodeRow)
edge_row_decoder = msgspec.json.Decoder(EdgeRow)
export_decoder = msgspec.json.Decoder(ExportBody)
changes_decoder = msgspec.json.Decoder(ChangesResponse)
import_request_decoder = msgspec.json.Decoder(ImportRequest)
import_result_decoder = msgspec.json.Decoder(ImportResult)

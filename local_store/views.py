"""Row views: store rows as the plane's wire rows, and as the shapes the tools return.

Rules: wire rows carry the canonical ``updated_at`` as the version, omit nulls when encoded,
and mark tombstones with the syncd ``deleted`` extension; an edge's wire ``created_at`` is its
latest version (so an updated or deleted edge is visible to a plane's ``created_at > since``).
A node served as the plane's row carries an embedding of the model's width on every row, zeros
when there is no vector (``wire_nodes``): the plane's import refuses a row without one, and its
client a pulled row without one (contract §4.4, §9).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from local_store.columns import NODE_COLUMNS
from local_store.embed import from_blob
from local_store.writes import Row
from protocol.rows import EdgeRow, NodeRow


def wire_node(row: Row, embedding: list[float] | None) -> NodeRow:
    """``base``: the version the row was written over, when the store keeps it (a PostgreSQL
    hub's rows have none: its clients then read conflicts as through Kyma, docs/versions.md)."""
    return NodeRow(
        id=row["id"], labels=row["labels"], realm=row["realm"], memory_type=row["memory_type"],
        title=row["title"], content=row["content"], content_preview=row["content_preview"],
        tags=row["tags"], importance=row["importance"], status=row["status"],
        source_session_id=row["source_session_id"], source_run_id=row["source_run_id"],
        embedding=embedding, created_at=row["created_at"], updated_at=row["updated_at"],
        valid_at=row["valid_at"], invalid_at=row["invalid_at"],
        superseded_by=row["superseded_by"], provenance=row["provenance"],
        topic_key=row["topic_key"], memory_class=row["memory_class"], space=row["space"],
        writer_agent_id=row["writer_agent_id"], origin=row["origin"] or None,
        deleted=True if row["deleted"] else None, base=row.get("base_version"),
    )


def wire_nodes(rows: Iterable[Row], vectors: Mapping[str, list[float]],
               dim: int | None) -> list[NodeRow]:
    """Rows as wire rows, each with its vector in ``vectors``. With ``dim``, the width of the
    vectors' model, a row with no vector or one of another width carries ``dim`` zeros instead
    — a syncd hub's "no vector" (``apply.vector_from_wire`` reads zeros as none), never a
    vector the plane would refuse. A Kyma plane ranks zeros first, so the sync engine sends
    such a row there only with a vector of its model (``syncd.sync.staged.Prepare.plane_vectors``).
    ``dim`` None (a model whose width is not known here): rows without a vector carry none."""
    if dim is None:
        return [wire_node(row, vectors.get(row["id"])) for row in rows]
    zeros = [0.0] * dim  # one list for every such row: rows are encoded, never changed
    return [wire_node(row, found if found is not None and len(found) == dim else zeros)
            for row in rows for found in (vectors.get(row["id"]),)]


def wire_edge(row: Row) -> EdgeRow:
    return EdgeRow(
        id=row["id"], src=row["src"], dst=row["dst"], type=row["type"], realm=row["realm"],
        target_namespace=row["target_namespace"], props=row["props"],
        created_at=row["updated_at"], updated_at=row["updated_at"],
        origin=row["origin"] or None, deleted=True if row["deleted"] else None,
    )


def memory_view(row: Row) -> dict[str, Any]:
    view = {name: row[name] for name in NODE_COLUMNS if name not in (
        "content_hash", "local_seq", "deleted", "last_seen", "base_version")}
    view["tags"] = [t for t in (row["tags"] or "").split(",") if t]
    view["provenance"] = maybe_json(row["provenance"])
    return view


def list_view(row: Row) -> dict[str, Any]:
    keys = ("id", "memory_type", "title", "content_preview", "tags", "importance", "status",
            "realm", "created_at")
    return {k: row[k] for k in keys if row[k] is not None}


def edge_view(row: Row) -> dict[str, Any]:
    keys = ("id", "src", "dst", "type", "realm", "target_namespace", "created_at", "updated_at")
    view = {k: row[k] for k in keys}
    view["props"] = maybe_json(row["props"])
    return view


def maybe_json(text: str | None) -> object:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


WIRE_DECIMALS = 8


def wire_vectors(matrix: npt.NDArray[np.float32]) -> list[list[float]]:
    """Stored float32 vectors (rows) as JSON numbers, rounded to 8 decimals: a float32's exact
    float64 text takes ~19 characters, the rounded one ~10 (half the bytes on the wire) while
    staying within float32 precision of a unit vector's components."""
    return np.round(matrix.astype(np.float64), WIRE_DECIMALS).tolist()  # type: ignore[no-any-return]


def wire_embeddings(found: list[tuple[str, bytes]]) -> dict[str, list[float]]:
    """Stored vectors ``(memory id, blob)`` as wire lists by id (same-width ones converted in
    one batch)."""
    widths = {len(blob) for _, blob in found}
    if len(widths) == 1:
        matrix = from_blob(b"".join(blob for _, blob in found)).reshape(len(found), -1)
        return dict(zip([mid for mid, _ in found], wire_vectors(matrix), strict=True))
    return {mid: wire_vectors(from_blob(blob).reshape(1, -1))[0] for mid, blob in found}

"""The hub's memory and edge columns as PostgreSQL holds them, and how stored rows read back
as wire rows (each memory with its vector of the hub's model, or zeros of its width)."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from local_store.columns import NODE_WIRE
from local_store.embed import Embedder
from local_store.views import wire_edge, wire_embeddings, wire_nodes
from protocol.rows import EdgeRow, NodeRow
from syncd.hub.pg.migrate import Conn

NODE_COLS = (*NODE_WIRE, "origin", "content_hash", "deleted", "dedupe_key")
EDGE_COLS = ("id", "src", "dst", "type", "realm", "target_namespace", "props", "created_at",
             "updated_at", "origin", "content_hash", "deleted")
NODE_SQL = "SELECT " + ", ".join(f"m.{c}" for c in NODE_COLS) + " FROM memories m"
EDGE_SQL = "SELECT " + ", ".join(f"e.{c}" for c in EDGE_COLS) + " FROM edges e"


async def read_nodes(conn: Conn, embedder: Embedder,
                     rows: Sequence[asyncpg.Record]) -> list[NodeRow]:
    """The rows as the plane's, each with its vector of the hub's model or zeros of its
    width (``views.wire_nodes``)."""
    if not rows:
        return []
    found = await conn.fetch(
        "SELECT memory_id, vec FROM vectors WHERE model = $1 AND vec IS NOT NULL "
        "AND memory_id = ANY($2::text[])", embedder.model_id, [r[0] for r in rows])
    vectors = wire_embeddings([(r[0], r[1]) for r in found])
    return wire_nodes((dict(zip(NODE_COLS, r, strict=True)) for r in rows), vectors,
                      embedder.dim)


def read_edge(record: asyncpg.Record) -> EdgeRow:
    return wire_edge(dict(zip(EDGE_COLS, record, strict=True)))

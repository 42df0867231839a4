"""Test-only access to a ``Store``: "the store is unchanged" dumps, the outbox, integrity, reconcile."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from local_store import Store, replica
from protocol.rows import EdgeRow, NodeRow

TABLES = (("meta", "key"), ("memories", "id"), ("vectors", "memory_id, model"), ("edges", "id"),
          ("outbox", "kind, item_id"), ("memory_versions", "n"))


async def dump_tables(store: Store) -> dict[str, list[tuple[Any, ...]]]:
    """Every table's rows, ordered — for "the store is unchanged" assertions."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    for table, order in TABLES:
        out[table] = [tuple(r) for r in await store._fetch(
            f"SELECT * FROM {table} ORDER BY {order}")]
    return out


async def outbox_items(store: Store, limit: int = 1000) -> list[tuple[str, str, int]]:
    """The queued items, (kind, item id, local_seq), in ``local_seq`` order."""
    rows = await store._fetch(
        "SELECT kind, item_id, local_seq FROM outbox ORDER BY local_seq LIMIT ?", (limit,))
    return [(r[0], r[1], r[2]) for r in rows]


async def integrity_check(store: Store) -> str:
    """SQLite's ``PRAGMA integrity_check``, its lines joined ("ok" when sound)."""
    rows = await store._fetch("PRAGMA integrity_check")
    return "; ".join(str(r[0]) for r in rows)


async def reconcile(store: Store, nodes: Sequence[NodeRow], edges: Sequence[EdgeRow], *,
                    model: str, realm: str | None = None,
                    state: Mapping[str, str | None] | None = None) -> replica.Reconciled:
    """Anti-entropy in one transaction (``replica.reconcile``): apply a full export, re-queue
    what the plane lacks or holds older. The sync engine pages it instead (``apply`` per page,
    then ``store.replication.requeue_unseen``)."""
    node_list, edge_list = list(nodes), list(edges)
    dim = store._width(model)
    return await store._write(lambda w: replica.reconcile(
        w, node_list, edge_list, model, realm, state or {}, dim=dim), foreign_keys=False)

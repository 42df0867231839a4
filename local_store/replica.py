"""Replication on the writer thread: pull, stage and acknowledge pushes, reconcile an export.

Rules:
  * A pulled batch and the sync state it advances (the cursor) commit in one transaction, so a
    crash can never keep rows without their cursor or a cursor without its rows (R4).
  * Staging a push re-stamps each queued item older than ``keep_within_ns`` with the current
    HLC — which has just received the plane's clock — so a version made offline, or under a
    slow clock, sorts after every other client's cursor. A recent version keeps its stamp:
    every reader's overlap window still sees it, and a concurrent edit made later elsewhere
    still beats it (re-stamping it would make "pushed last" win instead of "written last").
    The content hash does not change; the item stays queued.
  * An outbox entry is cleared only by ``ack`` with the seq it was staged at: a write that
    lands while the push is in flight bumps the entry's seq, so it is pushed again (R7).
  * Reconciling an export applies every remote version (LWW) and re-queues every local item
    the plane lacks or holds an older version of: the repair after a wiped or restored plane.
  * Sync state lives in ``meta`` under ``sync.*`` keys.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from local_store.apply import ApplyResult, apply_batch
from local_store.errors import ValidationError
from local_store.records import parse_timestamp
from local_store.writes import Row, Writer
from protocol.rows import EdgeRow, NodeRow
from protocol.timestamp import format_ns

SYNC_PREFIX = "sync."
Entry = tuple[str, str, int]  # (kind, item_id, local_seq it was staged at)


@dataclass(slots=True)
class Staged:
    entries: list[Entry]
    nodes: list[Row]
    edges: list[Row]


def pull(writer: Writer, nodes: list[NodeRow], edges: list[EdgeRow], model: str,
         state: Mapping[str, str | None], until: str | None) -> ApplyResult:
    """Apply a pulled batch, run the HLC receive rule on ``until`` too, and store ``state`` —
    without its ``cursor`` when a row could not be applied (R5: the cursor never passes it)."""
    result = apply_batch(writer, nodes, edges, model)
    if until:
        with contextlib.suppress(ValueError):
            writer.clock.receive(until)
    set_state(writer, {k: v for k, v in state.items() if k != "cursor" or not result.problems})
    return result


def set_state(writer: Writer, state: Mapping[str, str | None]) -> None:
    for key, value in state.items():
        if value is None:
            writer.conn.execute("DELETE FROM meta WHERE key = ?", (SYNC_PREFIX + key,))
        else:
            writer.set_meta(SYNC_PREFIX + key, value)


def stage(writer: Writer, limit: int, realm: str | None, keep_within_ns: int = 0) -> Staged:
    """Stage up to ``limit`` queued items (oldest first), re-stamping those whose version is
    more than ``keep_within_ns`` older than the clock, and return their rows."""
    realm_sql, params = _realm_filter(realm)
    bound = restamp_bound(writer.clock.physical_ns(), keep_within_ns)
    queued = writer.conn.execute(
        "SELECT o.kind, o.item_id, o.local_seq FROM outbox o "
        "LEFT JOIN memories m ON o.kind = 'node' AND m.id = o.item_id "
        "LEFT JOIN edges e ON o.kind = 'edge' AND e.id = o.item_id "
        f"WHERE (m.id IS NOT NULL OR e.id IS NOT NULL) {realm_sql} "
        "ORDER BY o.local_seq LIMIT ?", (*params, limit)).fetchall()
    staged = Staged([], [], [])
    for kind, item_id, seq in queued:
        table = "memories" if kind == "node" else "edges"
        current = writer.version(table, item_id)
        if needs_restamp(current, bound):
            stamp, seq = writer.stamp_after(current), writer.next_seq()
            writer.conn.execute(f"UPDATE {table} SET updated_at = ?, origin = ?, local_seq = ? "
                                "WHERE id = ?", (stamp, writer.replica_id, seq, item_id))
            writer.conn.execute("UPDATE outbox SET local_seq = ? WHERE kind = ? AND item_id = ?",
                                (seq, kind, item_id))
        staged.entries.append((kind, item_id, seq))
        if kind == "node":
            row = writer.node(item_id)
            assert row is not None
            staged.nodes.append(row)
        else:
            erow = writer.edge(item_id)
            assert erow is not None
            staged.edges.append(erow)
    return staged


def restamp_bound(now_ns: int, keep_within_ns: int) -> str:
    """The version below which ``stage`` re-stamps a queued item."""
    return format_ns(max(0, now_ns - keep_within_ns))


def needs_restamp(version: str | None, bound: str) -> bool:
    return version is None or version < bound


def _realm_filter(realm: str | None) -> tuple[str, tuple[str, ...]]:
    if realm is None:
        return "", ()
    return "AND (m.realm = ? OR e.realm = ?)", (realm, realm)


def ack(writer: Writer, entries: Sequence[Entry]) -> int:
    """Clear entries the plane accepted, unless a newer local write re-queued them."""
    cur = writer.conn.executemany(
        "DELETE FROM outbox WHERE kind = ? AND item_id = ? AND local_seq = ?", entries)
    return cur.rowcount


@dataclass(slots=True)
class Reconciled:
    applied: ApplyResult
    requeued_nodes: int
    requeued_edges: int


def reconcile(writer: Writer, nodes: list[NodeRow], edges: list[EdgeRow], model: str,
              realm: str | None, state: Mapping[str, str | None]) -> Reconciled:
    """Apply a full export and re-queue what the plane lacks or holds older (both ways)."""
    applied = apply_batch(writer, nodes, edges, model)
    remote_nodes, remote_edges = remote_versions(nodes, edges)
    requeued_nodes, requeued_edges = requeue_unseen(writer, remote_nodes, remote_edges, realm,
                                                    state)
    return Reconciled(applied, requeued_nodes, requeued_edges)


def remote_versions(nodes: list[NodeRow], edges: list[EdgeRow],
                    ) -> tuple[dict[str, str], dict[str, str]]:
    """id → canonical version of export rows (what ``requeue_unseen`` compares against), so a
    paged export can be applied page by page and only these small maps kept."""
    return ({n.id: _version(n.updated_at) for n in nodes if isinstance(n.id, str)},
            {e.id: _version(e.updated_at or e.created_at) for e in edges if isinstance(e.id, str)})


def requeue_unseen(writer: Writer, remote_nodes: Mapping[str, str],
                   remote_edges: Mapping[str, str], realm: str | None,
                   state: Mapping[str, str | None]) -> tuple[int, int]:
    """Queue every local item the plane's export lacked or held an older version of."""
    node_sql = "SELECT id, updated_at, local_seq FROM memories"
    local_nodes = writer.conn.execute(
        node_sql + (" WHERE realm = ?" if realm is not None else ""),
        (realm,) if realm is not None else ()).fetchall()
    requeued_nodes = _requeue(writer, "node", local_nodes, remote_nodes)
    local_edges = writer.conn.execute("SELECT id, updated_at, local_seq FROM edges").fetchall()
    requeued_edges = _requeue(writer, "edge", local_edges, remote_edges)
    set_state(writer, state)
    return requeued_nodes, requeued_edges


def _version(stamp: str | None) -> str:
    try:
        return parse_timestamp(stamp, "updated_at") or ""
    except ValidationError:
        return ""


def _requeue(writer: Writer, kind: str, local: list[tuple[str, str, int]],
             remote: Mapping[str, str]) -> int:
    count = 0
    for item_id, updated_at, seq in local:
        theirs = remote.get(item_id)
        if theirs is None or updated_at > theirs:
            writer.enqueue(kind, item_id, seq)
            count += 1
    return count


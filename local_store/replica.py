"""Replication on the writer thread: pull, stage and acknowledge pushes, reconcile an export.

Rules:
  * A pulled batch and the sync state it advances (the cursor) commit in one transaction, so a
    crash can never keep rows without their cursor or a cursor without its rows (R4).
  * Staging a push re-stamps each queued local edit older than ``keep_within_ns`` with the
    current HLC — which has just received the plane's clock — so a version made offline, or
    under a slow clock, sorts after every other client's cursor. A recent version keeps its
    stamp: every reader's overlap window still sees it, and a concurrent edit made later
    elsewhere still beats it (re-stamping it would make "pushed last" win instead of "written
    last"). The content hash does not change; the item stays queued.
  * A repair (an entry anti-entropy queued because the plane lacked the version or held an
    older one) keeps its version: it re-sends what was written then, and a fresh stamp would
    let that stale copy beat an edit made since on another laptop. The entry names the version
    it repairs (``outbox.repair_version``); once the item has another version — a local edit
    re-queued it — it is a local edit again.
  * A queued own edit the clock stamped while it ran ahead of the plane's (the engine marks
    the range, ``STAMPED_AHEAD``, when it pulls the clock back), still beyond the drift bound
    (``physical_ns() + max_drift_ns``), is moved back by how far the clock ran ahead — to when
    it was written, by the plane's clock — and never later than now, before the next pulled
    batch is compared with it or it is staged: a day-ahead clock does not make it unbeatable,
    and an edit made elsewhere later in real time beats it.
  * An outbox entry is cleared only by ``ack`` with the seq it was staged at: a write that
    lands while the push is in flight bumps the entry's seq, so it is pushed again (R7).
  * Reconciling an export applies every remote version (LWW) and re-queues every local item
    the plane lacks or holds an older version of: the repair after a wiped or restored plane.
  * Sync state lives in ``meta`` under ``sync.*`` keys.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from local_store.apply import ApplyResult, apply_batch
from local_store.errors import ValidationError
from local_store.records import parse_timestamp
from local_store.writes import Row, Writer
from protocol.hlc import TICK_NS
from protocol.rows import EdgeRow, NodeRow
from protocol.timestamp import format_ns, parse_ns

SYNC_PREFIX = "sync."
# Sync state set by ``backups.restore`` when the restored outbox holds entries: they may be
# versions this install superseded (and pushed) after the backup was made, so the plane's copy
# must be applied before anything is pushed. Cleared with ``resync_pending``, by anti-entropy.
RESTORED_OUTBOX = "restored_outbox"
# Sync state set when the clock was pulled back from running ahead of the plane's: "<last stamp
# it issued> <how far ahead it ran, ns>". The next pull or push moves the queued own edits it
# stamped in that range back (``settle_ahead``) and clears it.
STAMPED_AHEAD = "stamped_ahead"
Entry = tuple[str, str, int]  # (kind, item_id, local_seq it was staged at)


@dataclass(slots=True)
class Staged:
    entries: list[Entry]
    nodes: list[Row]
    edges: list[Row]


def pull(writer: Writer, nodes: list[NodeRow], edges: list[EdgeRow], model: str,
         state: Mapping[str, str | None], until: str | None,
         dim: int | None = None) -> ApplyResult:
    """Apply a pulled batch, run the HLC receive rule on ``until`` too, and store ``state`` —
    without its ``cursor`` when a row could not be applied (R5: the cursor never passes it).
    ``dim``: the width ``model``'s vectors must have, when known (``apply.check_width``)."""
    settle_ahead(writer)  # before the batch is compared with the queued own edits
    result = apply_batch(writer, nodes, edges, model, dim=dim)
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
    """Stage up to ``limit`` queued items (oldest first), re-stamping the local edits whose
    version is more than ``keep_within_ns`` older than the clock, and return their rows."""
    settle_ahead(writer)
    realm_sql, params = _realm_filter(realm)
    bound = restamp_bound(writer.clock.physical_ns(), keep_within_ns)
    queued = writer.conn.execute(
        "SELECT o.kind, o.item_id, o.local_seq, o.repair_version FROM outbox o "
        "LEFT JOIN memories m ON o.kind = 'node' AND m.id = o.item_id "
        "LEFT JOIN edges e ON o.kind = 'edge' AND e.id = o.item_id "
        f"WHERE (m.id IS NOT NULL OR e.id IS NOT NULL) {realm_sql} "
        "ORDER BY o.local_seq LIMIT ?", (*params, limit)).fetchall()
    staged = Staged([], [], [])
    for kind, item_id, seq, repair_version in queued:
        table = "memories" if kind == "node" else "edges"
        current = writer.version(table, item_id)
        if current != repair_version and needs_restamp(current, bound):
            seq = _restamp(writer, kind, item_id, writer.stamp_after(current))
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


def settle_ahead(writer: Writer) -> int:
    """Move back the queued own edits the clock stamped while it ran ahead (the
    ``STAMPED_AHEAD`` mark), by how far ahead it ran and never later than now; returns how many
    moved. Only versions still beyond the drift bound move: the others sort sensibly already.
    Repairs keep their versions (other replicas hold them), and so does an edit stamped after
    the mark's range (``stamp_after`` a far-future version: it must still beat that one)."""
    mark = _ahead_mark(writer)
    if mark is None:
        return 0
    issued_ns, ahead_ns = mark
    now = writer.clock.physical_ns()
    queued = writer.conn.execute(
        "SELECT o.kind, o.item_id, coalesce(m.updated_at, e.updated_at), "
        "coalesce(m.origin, e.origin), o.repair_version FROM outbox o "
        "LEFT JOIN memories m ON o.kind = 'node' AND m.id = o.item_id "
        "LEFT JOIN edges e ON o.kind = 'edge' AND e.id = o.item_id").fetchall()
    low, high = format_ns(now + writer.clock.max_drift_ns), format_ns(issued_ns)
    ahead = [(kind, item_id, version) for kind, item_id, version, origin, repair in queued
             if version is not None and low < version <= high
             and origin == writer.replica_id and repair != version]
    for kind, item_id, version in ahead:
        written = min(parse_ns(version) - ahead_ns, now)
        _restamp(writer, kind, item_id,
                 format_ns(written // TICK_NS * TICK_NS + writer.clock.node))
    set_state(writer, {STAMPED_AHEAD: None})
    return len(ahead)


def _ahead_mark(writer: Writer) -> tuple[int, int] | None:
    """(the last stamp issued while ahead, how far ahead in ns), or None without a mark. A
    garbled mark names an empty range (and is cleared with the rest)."""
    value = writer.meta(SYNC_PREFIX + STAMPED_AHEAD)
    if value is None:
        return None
    try:
        issued, ahead = (int(part) for part in value.split())
    except ValueError:
        return 0, 0
    return issued, ahead


def _restamp(writer: Writer, kind: str, item_id: str, stamp: str) -> int:
    """Give a queued item's version a new stamp (this replica's: it pushes it) and the next
    seq, in the row and in its outbox entry; returns the seq."""
    table = "memories" if kind == "node" else "edges"
    seq = writer.next_seq()
    writer.conn.execute(f"UPDATE {table} SET updated_at = ?, origin = ?, local_seq = ? "
                        "WHERE id = ?", (stamp, writer.replica_id, seq, item_id))
    writer.conn.execute("UPDATE outbox SET local_seq = ? WHERE kind = ? AND item_id = ?",
                        (seq, kind, item_id))
    return seq


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
              realm: str | None, state: Mapping[str, str | None],
              dim: int | None = None) -> Reconciled:
    """Apply a full export and re-queue what the plane lacks or holds older (both ways)."""
    applied = apply_batch(writer, nodes, edges, model, dim=dim)
    remote_nodes, remote_edges = remote_versions(nodes, edges)
    requeued_nodes, requeued_edges = requeue_unseen(writer, remote_nodes, remote_edges, realm,
                                                    state)
    return Reconciled(applied, requeued_nodes, requeued_edges)


def remote_versions(nodes: list[NodeRow], edges: list[EdgeRow],
                    into: tuple[dict[str, str], dict[str, str]] | None = None,
                    ) -> tuple[dict[str, str], dict[str, str]]:
    """id → canonical version of export rows (what ``requeue_unseen`` compares against), so a
    paged export can be applied page by page and only these small maps kept (``into``: the
    maps of the pages before). An id met twice keeps its latest version: Kyma appends a row
    per version of an edge and exports them all, in no promised order — comparing with an
    older one re-pushed the edge every pass, and the plane grew a row each time."""
    found_nodes, found_edges = into if into is not None else ({}, {})
    _keep_latest(found_nodes, ((n.id, _version(n.updated_at)) for n in nodes))
    _keep_latest(found_edges, ((e.id, _version(e.updated_at or e.created_at)) for e in edges))
    return found_nodes, found_edges


def _keep_latest(versions: dict[str, str], found: Iterable[tuple[object, str]]) -> None:
    for item_id, version in found:
        if isinstance(item_id, str) and version >= versions.get(item_id, ""):
            versions[item_id] = version


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
            enqueue_repair(writer, kind, item_id, seq, updated_at)
            count += 1
    return count


def enqueue_repair(writer: Writer, kind: str, item_id: str, seq: int, version: str) -> None:
    """Queue ``version`` of an item to be re-sent as it is. An item already queued stays as
    it was: a pending local edit must still be re-stamped when it is staged."""
    writer.conn.execute(
        "INSERT INTO outbox (kind, item_id, local_seq, repair_version) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (kind, item_id) DO NOTHING", (kind, item_id, seq, version))


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
  * A version sent to the plane while queued (``outbox.sent_version``, committed before the
    request goes out, and put back when no connection to the plane was made or it refused the
    body whole with 413) is pushed as it is from then on, like a repair: its reply may have been
    lost (or this process killed before ``ack``) after the plane committed it, another replica
    may have received it and edited it since, and a fresh stamp would let it beat that edit
    (docs/sync-causality.md). Sent, it was recent (staging re-stamps the old ones first), so
    every reader's overlap window saw it when it landed.
  * A repair (an entry anti-entropy queued because the plane lacked the version or held an
    older one) keeps its version: it re-sends what was written then, and a fresh stamp would
    let that stale copy beat an edit made since on another laptop. The entry names the version
    it repairs (``outbox.repair_version``); once the item has another version — a local edit
    re-queued it — it is a local edit again.
  * A queued local edit stamped beyond the drift bound (``physical_ns() + max_drift_ns``) —
    made while the clock ran ahead of the plane's, offline or before NTP fixed it — is stamped
    again when it is staged, after the version it replaced (``outbox.base_version``; or after
    the version staged before, which may have reached the plane), so it still beats what it
    replaced and no longer beats edits made elsewhere later: like any other
    offline edit, it is stamped when pushed. The clock itself is pulled back first when it runs
    beyond the bound. An edit whose base is itself that far ahead (made over another writer's
    far-future version) keeps its stamp: it must beat that version.
  * An outbox entry is cleared only by ``ack`` with the seq it was staged at: a write that
    lands while the push is in flight bumps the entry's seq, so it is pushed again (R7) —
    or when the plane shows it holds a version that beats it or the very version queued
    (docs/sync-causality.md): a pulled version that wins replaces the local one and clears the
    entry (``writes``), and an export row of the queued version clears it (``_requeue``).
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
from protocol.rows import EdgeRow, NodeRow
from protocol.timestamp import format_ns

SYNC_PREFIX = "sync."
# Sync state set by ``backups.restore`` when the restored outbox holds entries: they may be
# versions this install superseded (and pushed) after the backup was made, so the plane's copy
# must be applied before anything is pushed. Cleared with ``resync_pending``, by anti-entropy.
RESTORED_OUTBOX = "restored_outbox"
Entry = tuple[str, str, int]  # (kind, item_id, local_seq it was staged at)


@dataclass(slots=True)
class Staged:
    entries: list[Entry]
    nodes: list[Row]
    edges: list[Row]


def pull(writer: Writer, nodes: list[NodeRow], edges: list[EdgeRow], model: str,
         state: Mapping[str, str | None], until: str | None,
         dim: int | None = None, kept: tuple[str, ...] = ()) -> ApplyResult:
    """Apply a pulled batch, run the HLC receive rule on ``until`` too, and store ``state`` —
    without its ``cursor`` when a row could not be applied (R5: the cursor never passes it).
    ``dim``: the width ``model``'s vectors must have, when known (``apply.check_width``);
    ``kept``: columns the plane never returns (``apply.held_columns``)."""
    result = apply_batch(writer, nodes, edges, model, dim=dim, kept=kept)
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
    version is more than ``keep_within_ns`` older than the clock or beyond the drift bound
    ahead of it, and return their rows."""
    realm_sql, params = _realm_filter(realm)
    physical = writer.clock.physical_ns()
    bound = restamp_bound(physical, keep_within_ns)
    ahead = format_ns(physical + writer.clock.max_drift_ns)
    if writer.clock.last_ns > physical + writer.clock.max_drift_ns:
        writer.clock.rewind(physical)  # it ran ahead (offline, or until NTP fixed the wall)
    queued = writer.conn.execute(
        "SELECT o.kind, o.item_id, o.local_seq, o.repair_version, o.base_version, "
        "o.sent_version FROM outbox o "
        "LEFT JOIN memories m ON o.kind = 'node' AND m.id = o.item_id "
        "LEFT JOIN edges e ON o.kind = 'edge' AND e.id = o.item_id "
        f"WHERE (m.id IS NOT NULL OR e.id IS NOT NULL) {realm_sql} "
        "ORDER BY o.local_seq LIMIT ?", (*params, limit)).fetchall()
    staged = Staged([], [], [])
    bases: list[tuple[str, str, str]] = []  # (staged version, kind, item_id)
    for kind, item_id, seq, repair_version, base, sent in queued:
        table = "memories" if kind == "node" else "edges"
        current = writer.version(table, item_id)
        if current in (repair_version, sent):
            pass  # a repair, or a version the plane may hold already, is pushed as it is
        elif needs_restamp(current, bound):
            seq = _restamp(writer, kind, item_id, writer.stamp_after(current))
        elif current is not None and current > ahead and base is not None and (
                (stamp := writer.stamp_after(base or None)) < current):
            seq = _restamp(writer, kind, item_id, stamp)
        staged.entries.append((kind, item_id, seq))
        row = writer.node(item_id) if kind == "node" else writer.edge(item_id)
        assert row is not None
        (staged.nodes if kind == "node" else staged.edges).append(row)
        bases.append((row["updated_at"], kind, item_id))
    # Once staged, a version may reach the plane (its ack can be lost, and an edit made while
    # the push is in flight keeps the entry queued): a later stamping-again must stay after
    # it, so it becomes the entry's base.
    writer.conn.executemany(
        "UPDATE outbox SET base_version = max(coalesce(base_version, ''), ?) "
        "WHERE kind = ? AND item_id = ?", bases)
    return staged


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


Sent = tuple[str, str, int, str | None]  # an entry and its ``sent_version`` before a mark


def mark_sent(writer: Writer, entries: Sequence[Entry]) -> list[Sent]:
    """Record, before a push goes out, the version each entry sends: from then on the plane
    may hold it, whatever becomes of the reply (``stage`` pushes it as it is). Returns what
    each entry held before, for ``unmark_sent``."""
    before: list[Sent] = []
    for kind, item_id, seq in entries:
        row = writer.conn.execute(
            "SELECT sent_version FROM outbox WHERE kind = ? AND item_id = ? AND local_seq = ?",
            (kind, item_id, seq)).fetchone()
        if row is not None:
            before.append((kind, item_id, seq, row[0]))
    for kind in ("node", "edge"):
        table = "memories" if kind == "node" else "edges"
        writer.conn.executemany(
            f"UPDATE outbox SET sent_version = (SELECT updated_at FROM {table} WHERE id = ?) "
            "WHERE kind = ? AND item_id = ? AND local_seq = ?",
            [(item_id, k, item_id, seq) for k, item_id, seq in entries if k == kind])
    return before


def unmark_sent(writer: Writer, before: Sequence[Sent]) -> None:
    """The push never reached the plane (no connection was made, or it refused the whole
    body unread): the entries hold what they held before ``mark_sent``, so an edit that then
    waits long is re-stamped as one never sent."""
    writer.conn.executemany(
        "UPDATE outbox SET sent_version = ? WHERE kind = ? AND item_id = ? AND local_seq = ?",
        [(sent, kind, item_id, seq) for kind, item_id, seq, sent in before])


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
    """Queue the items the plane lacks or holds older (repairs); drop the queued entry of an
    item whose version the plane already holds — pushed, its acknowledgement lost (a crash, or
    a store restored from a backup taken before it): staged, it would be stamped again and
    beat edits made since elsewhere."""
    queued = {r[0] for r in writer.conn.execute(
        "SELECT item_id FROM outbox WHERE kind = ?", (kind,))}
    count = 0
    for item_id, updated_at, seq in local:
        theirs = remote.get(item_id)
        if theirs is None or updated_at > theirs:
            enqueue_repair(writer, kind, item_id, seq, updated_at)
            count += 1
        elif item_id in queued and updated_at == theirs:
            writer.conn.execute("DELETE FROM outbox WHERE kind = ? AND item_id = ?",
                                (kind, item_id))
    return count


def enqueue_repair(writer: Writer, kind: str, item_id: str, seq: int, version: str) -> None:
    """Queue ``version`` of an item to be re-sent as it is. An item already queued stays as
    it was: a pending local edit must still be re-stamped when it is staged."""
    writer.conn.execute(
        "INSERT INTO outbox (kind, item_id, local_seq, repair_version) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (kind, item_id) DO NOTHING", (kind, item_id, seq, version))


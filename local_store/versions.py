"""Version history: the earlier versions of each memory a replica held (docs/versions.md).

Versions are local data. They live in ``memory_versions`` (0007_versions.sql), are never queued
in the outbox, never served in ``changes`` or ``export``, and are written only by the writer
thread inside the transaction that replaced the version they keep (``writes.Writer``).

Rules:
  * Kept text is never new text: a version is a copy of a row the store held (already
    redacted when it was written) or of a pulled row that lost last-writer-wins (redacted by
    ``apply.node_from_wire`` before it gets here). A restore writes only such text, and runs the
    redactor over it once more, so nothing reaches the store around the choke point.
  * Reasons. ``replaced``: a local edit (an edit, a topic-key upsert, a status, importance or
    validity change, a restore) or a pulled version that followed it replaced it. ``deleted``:
    a soft delete replaced it. ``conflict``: a version concurrent with the one that won
    last-writer-wins here — either side: the local version a pulled one beat, or a pulled one
    that lost to the local version.
  * A hard delete — local, or a pulled or imported version without content (its tombstone,
    also as a plane that drops the ``deleted`` extension serves it) — deletes every
    version of the memory in the same transaction, and sets ``Writer.purged`` so the WAL is
    scrubbed (``checkpoint.py``): no kept text outlives it, on a laptop or a hub.
  * Bounds (``VersionPolicy``): at most ``keep`` versions per memory (the newest by version
    stamp), none kept longer than ``max_age_days`` (counted from ``kept_at``, this replica's
    clock when it kept it). Each write that keeps a version prunes that memory by count and
    the whole table by age; the daemon also prunes by age in the background (``Store.
    prune_versions``), so a store nobody writes to still forgets on time.

The conflict rule. Each node version carries the version it was written over
(``memories.base_version``; the syncd wire extension ``base``). When a version W wins over a
version L (L is replaced here, or L is the local version and W the pulled loser's rival):

  * If W's base is known, L is concurrent with W exactly when ``W.base < L.version``: had W's
    writer held L (or anything later) when it wrote W, its base would be at least L, since a
    replica's current version only ever grows in LWW order; and L cannot follow W, as it would
    then sort after W. Equal or greater, W was written over L or over a later version that
    replaced it: L is plain history (``replaced``), or nothing to keep when L is the pulled one
    (an old version arriving late).
  * If W's base is unknown (a row from a Kyma plane, an older syncd, or stored before 0007):
    L, the local version W beat, is a conflict when it was a local edit still in the outbox
    (the plane had not acknowledged it, so W's writer cannot have built on it); otherwise it is
    ``replaced``. A pulled loser is a conflict only when the local winner's base is known and
    older than the loser (above); with an unknown base nothing is kept.

So two laptops that edit one memory while apart both keep the loser as a ``conflict``: the one
holding the winner when the loser arrives (the loser is newer than the winner's base), and the
one whose edit lost (the winner's base is older than it). A replica that never held the
loser has nothing to keep. One false positive remains with an unknown base: a pushed edit whose
acknowledgement was lost, which another laptop received and edited over, is called a conflict
when that edit comes back through a plane that drops ``base`` (Kyma). A false conflict costs a
dismiss; a missed one would lose text silently.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from local_store.db import chunks
from local_store.errors import NotFoundError, ValidationError
from local_store.records import preview
from local_store.redact import strip_private
from protocol.timestamp import format_ns

if TYPE_CHECKING:
    from local_store.writes import Row, Writer

DEFAULT_KEEP = 20
DEFAULT_MAX_AGE_DAYS = 180.0
DAY_NS = 86_400 * 10**9
REASONS = ("replaced", "conflict", "deleted")
VERSION_FIELDS = ("title", "content", "tags", "importance", "status", "updated_at", "origin")
_FIELDS_SQL = ", ".join(VERSION_FIELDS)
CONFLICT_LIST = 20  # conflicts listed (with their count) in the sync status


@dataclass(frozen=True, slots=True)
class VersionPolicy:
    """How much history a replica keeps (``[versions]`` in the daemon's config)."""

    keep: int = DEFAULT_KEEP
    max_age_days: float = DEFAULT_MAX_AGE_DAYS

    def __post_init__(self) -> None:
        if isinstance(self.keep, bool) or not isinstance(self.keep, int) or self.keep < 0:
            raise ValidationError("keep", "must be a whole number, 0 or more")
        if not isinstance(self.max_age_days, int | float) or not self.max_age_days >= 0:
            raise ValidationError("max_age_days", "must be a number, 0 or more")


# ---------------------------------------------------------------------- the rule (pure)

def replaced_reason(winner_base: str | None, winner_deleted: bool, loser_version: str,
                    loser_pending: bool) -> str:
    """Why the local version ``loser_version`` is kept when a pulled version beats it."""
    concurrent = winner_base < loser_version if winner_base is not None else loser_pending
    if concurrent:
        return "conflict"
    return "deleted" if winner_deleted else "replaced"


def loser_is_conflict(winner_base: str | None, loser_version: str) -> bool:
    """Is a pulled version that lost to the local one (whose base is ``winner_base``)
    concurrent with it? Unknown base: not known, so nothing is kept."""
    return winner_base is not None and winner_base < loser_version


# ---------------------------------------------------------------------- writer thread

def keep_current(w: Writer, memory_id: str, reason: str, new_hash: str) -> None:
    """Keep the memory's current live version (before it is overwritten) with ``reason``,
    unless the new version holds the same values (``new_hash``: nothing changed)."""
    cur = w.conn.execute(
        f"INSERT OR IGNORE INTO memory_versions (memory_id, reason, {_FIELDS_SQL}, kept_at) "
        f"SELECT id, ?, {_FIELDS_SQL}, ? FROM memories "
        "WHERE id = ? AND deleted = 0 AND content_hash <> ?",
        (reason, _now(w), memory_id, new_hash))
    if cur.rowcount:
        prune_memory(w, memory_id)


def keep_replaced(w: Writer, winners: Sequence[Row]) -> None:
    """Before pulled ``winners`` overwrite the rows of their ids: keep each live local
    version (``replaced_reason``), and purge every version of an id a hard-delete tombstone
    wins (``purge``): a version without content (only a hard delete writes one)."""
    ids = [row["id"] for row in winners]
    local: dict[str, tuple[str, int]] = {}
    pending: set[str] = set()
    for chunk in chunks(ids):
        marks = ",".join("?" * len(chunk))
        local.update((r[0], (r[1], r[2])) for r in w.conn.execute(
            f"SELECT id, updated_at, deleted FROM memories WHERE id IN ({marks})", chunk))
        pending.update(r[0] for r in w.conn.execute(
            f"SELECT item_id FROM outbox WHERE kind = 'node' AND item_id IN ({marks})", chunk))
    kept, stamp = [], _now(w)
    for row in winners:
        found = local.get(row["id"])
        if not row["content"]:  # a hard delete's tombstone, also as a plane that drops
            purge(w, row["id"])  # ``deleted`` serves it (Kyma: archived, invalidated, empty)
        elif found is not None and not found[1]:
            reason = replaced_reason(row.get("base_version"), bool(row["deleted"]), found[0],
                                     row["id"] in pending)
            kept.append((reason, stamp, row["id"]))
    if kept:
        w.conn.executemany(
            f"INSERT OR IGNORE INTO memory_versions (memory_id, reason, {_FIELDS_SQL}, "
            f"kept_at) SELECT id, ?, {_FIELDS_SQL}, ? FROM memories WHERE id = ?", kept)
        prune(w, [mid for _, _, mid in kept])


def keep_losers(w: Writer, losers: Sequence[Row]) -> None:
    """Keep pulled rows that lost last-writer-wins here as conflicts, when they were
    concurrent with the local winner (``loser_is_conflict``). A memory whose local row holds
    no content (a hard delete's tombstone) keeps nothing: its text is gone for good."""
    if not losers:
        return
    local: dict[str, tuple[str | None, str, str, str]] = {}
    for chunk in chunks([row["id"] for row in losers]):
        local.update((r[0], (r[1], r[2], r[3], r[4])) for r in w.conn.execute(
            "SELECT id, base_version, content, updated_at, content_hash FROM memories "
            f"WHERE id IN ({','.join('?' * len(chunk))})", chunk))
    stamp = _now(w)
    kept = [(row["id"], *(row[name] for name in VERSION_FIELDS), stamp) for row in losers
            for found in (local.get(row["id"]),)
            if found is not None and found[1] and not _echo(row, found[2], found[3])
            and loser_is_conflict(found[0], row["updated_at"])]
    if kept:
        w.conn.executemany(
            f"INSERT OR IGNORE INTO memory_versions (memory_id, reason, {_FIELDS_SQL}, "
            f"kept_at) VALUES (?, 'conflict', {', '.join('?' * len(VERSION_FIELDS))}, ?)",
            kept)
        prune(w, [k[0] for k in kept])
        review_settled(w, [k[0] for k in kept])  # the same text as the winner's: no choice


def _echo(row: Row, version: str, content_hash: str) -> bool:
    """Is the pulled row the local version itself, come back without its ``origin`` (a plane
    that drops syncd's extensions serves this replica's own versions with origin "")? It
    then sorts below the local copy, yet is no rival of it."""
    return bool(row["updated_at"] == version and row["content_hash"] == content_hash)


def review_settled(w: Writer, memory_ids: Sequence[str]) -> None:
    """A conflict whose text became current again (restored here, or on another replica and
    pulled) is reviewed: the user already chose it."""
    open_ids = {r[0] for r in w.conn.execute(
        "SELECT DISTINCT memory_id FROM memory_versions WHERE reason = 'conflict' AND "
        "reviewed = 0")}
    settled = [(mid, mid, mid) for mid in memory_ids if mid in open_ids]
    if settled:
        w.conn.executemany(
            "UPDATE memory_versions SET reviewed = 1 WHERE reason = 'conflict' AND reviewed = 0 "
            "AND memory_id = ? AND content = (SELECT content FROM memories WHERE id = ?) AND "
            "title IS (SELECT title FROM memories WHERE id = ?)", settled)


def purge(w: Writer, memory_id: str) -> None:
    """A hard delete: every kept version of the memory goes (and the WAL is scrubbed)."""
    if w.conn.execute("DELETE FROM memory_versions WHERE memory_id = ?", (memory_id,)).rowcount:
        w.purged = True


def prune_memory(w: Writer, memory_id: str) -> None:
    prune(w, [memory_id])


def prune(w: Writer, memory_ids: Iterable[str]) -> int:
    """Apply the policy's bounds to these memories (count) and to the table (age)."""
    keep = w.version_policy.keep
    removed = sum(w.conn.execute(
        "DELETE FROM memory_versions WHERE memory_id = ? AND n NOT IN (SELECT n FROM "
        "memory_versions WHERE memory_id = ? ORDER BY updated_at DESC, n DESC LIMIT ?)",
        (mid, mid, keep)).rowcount for mid in set(memory_ids))
    return removed + prune_old(w)


def prune_old(w: Writer) -> int:
    """Forget versions kept longer than ``max_age_days`` ago."""
    age_ns = int(w.version_policy.max_age_days * DAY_NS)
    cutoff = format_ns(max(0, w.clock.physical_ns() - age_ns))
    return int(w.conn.execute("DELETE FROM memory_versions WHERE kept_at < ?",
                              (cutoff,)).rowcount)


def version_row(w: Writer, memory_id: str, n: int) -> dict[str, Any]:
    """Version ``n`` of the memory, read in the writer's transaction (else ``not_found``)."""
    found = w.conn.execute(
        f"SELECT reason, {_FIELDS_SQL} FROM memory_versions WHERE n = ? AND memory_id = ?",
        (n, memory_id)).fetchone()
    if found is None:
        raise NotFoundError(f"n: version {n} of memory {memory_id} not found")
    return dict(zip(("reason", *VERSION_FIELDS), found, strict=True))


def restored_row(current: Row, version: dict[str, Any]) -> Row:
    """The current row with version's values: a new edit (``put_node`` stamps it). A soft-
    deleted memory comes back to life, valid again."""
    row = dict(current)
    content = strip_private(version["content"])
    row.update(title=None if version["title"] is None else strip_private(version["title"]),
               content=content, content_preview=preview(content),
               tags=strip_private(version["tags"] or ""), importance=version["importance"],
               status=version["status"])
    if row["deleted"]:
        row.update(deleted=0, invalid_at=None)
    return row


def mark_reviewed(w: Writer, memory_id: str, n: int) -> None:
    w.conn.execute("UPDATE memory_versions SET reviewed = 1 WHERE n = ? AND memory_id = ?",
                   (n, memory_id))


def dismiss(w: Writer, memory_id: str, n: int) -> dict[str, Any]:
    """Mark conflict ``n`` reviewed without changing the memory."""
    version = version_row(w, memory_id, n)
    if version["reason"] != "conflict":
        raise ValidationError("n", f"version {n} of memory {memory_id} is not a conflict "
                              f"(its reason is {version['reason']}): only conflicts are "
                              "dismissed")
    mark_reviewed(w, memory_id, n)
    return {"ok": True, "memory_id": memory_id, "dismissed": n}


# ---------------------------------------------------------------------- reads

LIST_SQL = (f"SELECT n, reason, reviewed, {_FIELDS_SQL} FROM memory_versions "
            "WHERE memory_id = ? ORDER BY updated_at DESC, n DESC")
OPEN_CONFLICTS_SQL = (
    "SELECT v.memory_id, v.n, v.title, v.content, v.updated_at, v.origin "
    "FROM memory_versions v WHERE v.reason = 'conflict' AND v.reviewed = 0 "
    "ORDER BY v.kept_at DESC, v.n DESC LIMIT ?")


def version_view(found: sqlite3.Row | Sequence[Any]) -> dict[str, Any]:
    """One ``LIST_SQL`` row as the API shows it."""
    n, reason, reviewed, title, content, tags, importance, status, updated_at, origin = found
    view: dict[str, Any] = {
        "n": n, "reason": reason, "title": title, "content": content,
        "tags": [t for t in (tags or "").split(",") if t], "importance": importance,
        "status": status, "updated_at": updated_at, "origin": origin}
    if reason == "conflict":
        view["reviewed"] = bool(reviewed)
    return view


def current_view(row: Row) -> dict[str, Any]:
    view: dict[str, Any] = {
        "n": None, "reason": "current", "title": row["title"], "content": row["content"],
        "tags": [t for t in (row["tags"] or "").split(",") if t],
        "importance": row["importance"], "status": row["status"],
        "updated_at": row["updated_at"], "origin": row["origin"]}
    if row["deleted"]:
        view["deleted"] = True
    return view


def parse_n(value: object) -> int:
    """A version number from a path or an argument: a positive whole number."""
    text = str(value).strip() if isinstance(value, str | int) else ""
    if (isinstance(value, bool) or not text.isdigit() or not text.isascii()
            or not 1 <= int(text) < 2**63):  # SQLite's integers
        raise ValidationError("n", f"must be a version number (a whole number from 1), got "
                              f"{strip_private(str(value))[:40]!r}")
    return int(text)


def _now(w: Writer) -> str:
    return format_ns(w.clock.physical_ns())



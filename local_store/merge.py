"""Last-writer-wins: the one rule that decides which version of an item a replica keeps.

A version's key is ``(updated_at, origin, content_hash)``, compared as a tuple of strings.
``updated_at`` is canonical (fixed width), so string order is time order; ``origin`` breaks ties
between replicas; ``content_hash`` breaks the rest. It is a total order, so every replica that has
seen the same set of versions keeps the same one, whatever the delivery order or repetition.
A tombstone is a version like any other: it loses only to a strictly newer key, so a stale
update never resurrects it, and an update made after the delete (by HLC) does win — the
documented policy for concurrent delete-vs-update is "later HLC stamp wins".
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Mapping, Sequence

VersionKey = tuple[str, str, str]

# The replicated fields of a node whose values decide its content hash (not its version fields).
NODE_HASHED = (
    "labels", "realm", "memory_type", "title", "content", "tags", "importance", "status",
    "source_session_id", "source_run_id", "created_at", "valid_at", "invalid_at",
    "superseded_by", "provenance", "topic_key", "deleted",
)
EDGE_HASHED = ("src", "dst", "type", "realm", "target_namespace", "props", "deleted")
_NODE_HASHED_ITEMS = operator.itemgetter(*NODE_HASHED)


def content_hash(row: Mapping[str, object], fields: Sequence[str]) -> str:
    """A digest of the replicated fields: None, str, int and float values, unit-separated."""
    return hash_values([row.get(name) for name in fields])


def node_hash(row: Mapping[str, object]) -> str:
    """``content_hash(row, NODE_HASHED)`` for a row holding every node field."""
    return hash_values(hashed_values(row))


def hashed_values(row: Mapping[str, object]) -> tuple[object, ...]:
    """The values ``node_hash`` hashes, in order (one C call gathers them)."""
    return _NODE_HASHED_ITEMS(row)  # type: ignore[no-any-return]


def hash_values(values: Sequence[object]) -> str:
    parts = ["\x00" if value is None else str(value) for value in values]
    return hashlib.blake2b("\x1f".join(parts).encode(), digest_size=16).hexdigest()


def version_key(row: Mapping[str, object]) -> VersionKey:
    return (str(row["updated_at"]), str(row["origin"]), str(row["content_hash"]))


def wins(incoming: VersionKey, current: VersionKey | None) -> bool:
    """True when ``incoming`` must replace ``current`` (strictly greater; equal is a no-op)."""
    return current is None or incoming > current

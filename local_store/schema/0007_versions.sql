-- 0007: version history (local_store/versions.py, docs/versions.md).
--
-- `base_version` is the version a node version was written over: the replaced row's
-- `updated_at` for a local edit, '' for a version that created the item, and what the sender
-- said for a pulled or imported row (the syncd `base` wire extension; NULL when the sender
-- sent none — a Kyma plane, an older syncd, every row stored before this migration). It is
-- not hashed: it says where a version came from, not what it holds. Conflict detection reads
-- it (versions.py states the rule).
ALTER TABLE memories ADD COLUMN base_version TEXT;

-- Earlier versions of each memory this replica held, local data: never pushed, never served
-- in `changes` or `export`, bounded per memory and by age (versions.prune), and deleted with
-- every trace of the memory by a hard delete. The text is a copy of what the store held (the
-- redacted text), or of a pulled row that lost last-writer-wins (redacted as it was applied).
--   reason: 'replaced' (a local or pulled edit replaced it), 'conflict' (a concurrent version
--           that lost last-writer-wins), 'deleted' (a soft delete replaced it).
--   kept_at: this replica's HLC stamp when it was kept (the age bound counts from it).
--   reviewed: a conflict the user restored or dismissed (no longer counted as unreviewed).
-- `n` is the version's number, stable for as long as it is kept and never reused.
CREATE TABLE memory_versions (
    n          INTEGER PRIMARY KEY AUTOINCREMENT,
    memory_id  TEXT NOT NULL,
    reason     TEXT NOT NULL CHECK (reason IN ('replaced', 'conflict', 'deleted')),
    title      TEXT,
    content    TEXT NOT NULL,
    tags       TEXT NOT NULL DEFAULT '',
    importance REAL NOT NULL,
    status     TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    origin     TEXT NOT NULL,
    kept_at    TEXT NOT NULL,
    reviewed   INTEGER NOT NULL DEFAULT 0,
    UNIQUE (memory_id, updated_at, origin)
) STRICT;
CREATE INDEX memory_versions_kept ON memory_versions (kept_at);
CREATE INDEX memory_versions_open ON memory_versions (memory_id)
WHERE reason = 'conflict' AND reviewed = 0;

-- 0001: the local memory store. Never edit this file once released; add 0002_….sql instead.
--
-- Rules every write keeps (local_store/writes.py):
--   * A row's `updated_at` is its version: a canonical HLC string (9 fraction digits, +00:00),
--     so string order == version order. `origin` is the replica that minted that version.
--   * Last-writer-wins on (updated_at, origin, content_hash); a tombstone (deleted = 1) is a
--     version like any other, so a stale update never resurrects it.
--   * Every mutation takes the next `local_seq` (meta key 'local_seq') in the same transaction,
--     so local_seq is commit-ordered and is the local change feed.

-- Key/value facts about this store: store_id, replica_id, hlc_last, local_seq, settings.
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) STRICT;

-- One row per memory id: the latest version this replica knows (Kyma's node row + bookkeeping).
CREATE TABLE memories (
    id                TEXT PRIMARY KEY,
    labels            TEXT,
    realm             TEXT NOT NULL,
    memory_type       TEXT NOT NULL,
    title             TEXT,
    content           TEXT NOT NULL,
    content_preview   TEXT NOT NULL,
    tags              TEXT NOT NULL DEFAULT '',
    importance        REAL NOT NULL,
    status            TEXT NOT NULL,
    source_session_id TEXT,
    source_run_id     TEXT,
    created_at        TEXT NOT NULL,
    updated_at        TEXT NOT NULL,
    valid_at          TEXT,
    invalid_at        TEXT,
    superseded_by     TEXT,
    provenance        TEXT,
    topic_key         TEXT,
    memory_class      TEXT,
    space             TEXT,
    writer_agent_id   TEXT,
    origin            TEXT NOT NULL,
    content_hash      TEXT NOT NULL,
    local_seq         INTEGER NOT NULL,
    deleted           INTEGER NOT NULL DEFAULT 0,
    dedupe_key        TEXT,
    source_uris       TEXT,
    mentions          TEXT,
    last_seen         TEXT
) STRICT;
CREATE INDEX memories_topic ON memories (realm, topic_key) WHERE topic_key IS NOT NULL;
CREATE INDEX memories_dedupe ON memories (realm, dedupe_key) WHERE dedupe_key IS NOT NULL;
CREATE UNIQUE INDEX memories_seq ON memories (local_seq);
CREATE INDEX memories_list ON memories (created_at DESC);

-- One vector per (memory, embedding model): vectors of different models are never compared.
-- A rowid table (not WITHOUT ROWID): 1.5 KB blobs make WITHOUT ROWID b-trees slow.
CREATE TABLE vectors (
    memory_id TEXT NOT NULL REFERENCES memories (id) ON DELETE CASCADE,
    model     TEXT NOT NULL,
    dim       INTEGER NOT NULL,
    vec       BLOB NOT NULL,          -- little-endian float32 × dim
    UNIQUE (memory_id, model)
) STRICT;

-- Typed edges, one row per deterministic id "{src}->{dst}:{type}" (re-imports never duplicate).
CREATE TABLE edges (
    id               TEXT PRIMARY KEY,
    src              TEXT NOT NULL,
    dst              TEXT NOT NULL,
    type             TEXT NOT NULL,
    realm            TEXT,
    target_namespace TEXT,
    props            TEXT,
    created_at       TEXT NOT NULL,
    updated_at       TEXT NOT NULL,
    origin           TEXT NOT NULL,
    content_hash     TEXT NOT NULL,
    local_seq        INTEGER NOT NULL,
    deleted          INTEGER NOT NULL DEFAULT 0
) STRICT;
CREATE INDEX edges_src ON edges (src);
CREATE INDEX edges_dst ON edges (dst);
CREATE UNIQUE INDEX edges_seq ON edges (local_seq);

-- Local changes not yet acknowledged by the control plane: one entry per item, coalesced,
-- pointing at whatever version is current when the push runs.
CREATE TABLE outbox (
    kind      TEXT NOT NULL CHECK (kind IN ('node', 'edge')),
    item_id   TEXT NOT NULL,
    local_seq INTEGER NOT NULL,        -- seq of the local write that (re)queued it
    PRIMARY KEY (kind, item_id)
) STRICT, WITHOUT ROWID;

-- Keyword index over the redacted text of live (non-tombstone) memories. The write path keeps it
-- in step explicitly (writes.Writer.fts_remove/fts_add, one statement per batch): FTS5 flushes
-- its pending terms at every statement savepoint, so per-row triggers cost 4× more.
CREATE VIRTUAL TABLE memories_fts USING fts5 (
    title, content, tags,
    content = 'memories', content_rowid = 'rowid',
    tokenize = 'unicode61 remove_diacritics 2'
);

-- 0002: recall. Keyword hits rank by BM25 weighting the title twice as much as content and
-- tags, set as FTS5's configured `rank` so `ORDER BY rank LIMIT n` takes FTS5's own path.
INSERT INTO memories_fts (memories_fts, rank) VALUES ('rank', 'bm25(2.0, 1.0, 1.0)');

-- Recall's fallback (the most important recent live memories, when nothing matches) reads
-- this index in order instead of sorting the whole table.
CREATE INDEX memories_fallback ON memories (importance DESC, created_at DESC, id)
WHERE deleted = 0 AND invalid_at IS NULL AND status <> 'archived';

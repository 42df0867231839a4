-- 0008: the keyword index stems English words (FTS5's `porter` tokenizer over the same
-- `unicode61 remove_diacritics 2`), so a question matches a memory across the regular
-- inflections of a word: "scores" finds "score", "deploying" finds "deployed", "builds" finds "building".
-- Queries are stemmed by the same tokenizer, so the MATCH expressions are unchanged. Rebuilt
-- from the live (non-tombstone) rows, as the write path keeps it (writes.Writer.fts_add).
DROP TABLE memories_fts;
CREATE VIRTUAL TABLE memories_fts USING fts5 (
    title, content, tags,
    content = 'memories', content_rowid = 'rowid',
    tokenize = 'porter unicode61 remove_diacritics 2'
);
INSERT INTO memories_fts (memories_fts, rank) VALUES ('rank', 'bm25(2.0, 1.0, 1.0)');
INSERT INTO memories_fts (rowid, title, content, tags)
SELECT rowid, title, content, tags FROM memories WHERE deleted = 0 ORDER BY rowid;

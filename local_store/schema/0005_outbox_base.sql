-- 0005: a queued local edit names the version it replaced, when it replaced one: '' for an item
-- it created, NULL for an entry queued before this migration (not known) and for a repair.
-- Staged while the clock runs ahead, an edit stamped beyond the drift bound is stamped again,
-- after this base: it still beats what it replaced, and no longer beats later edits elsewhere.
ALTER TABLE outbox ADD COLUMN base_version TEXT;

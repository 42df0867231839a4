-- 0004: an outbox entry anti-entropy queued to re-send a version the plane lacked or held older
-- (a repair) names that version. A repair is pushed with its version as it is; a local edit
-- (NULL, or an item whose version has since changed) is re-stamped when it is staged.
-- Entries queued before this migration are local edits, as they were treated until now.
ALTER TABLE outbox ADD COLUMN repair_version TEXT;

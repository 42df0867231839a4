-- 0006: the version of the item last sent to the plane while this entry was queued, written
-- (and committed) before the request goes out. Equal to the item's version, the plane may
-- already hold it (the reply was lost, or the process died before clearing the entry): it is
-- pushed as it is, never stamped again, so it cannot beat an edit made elsewhere after it was
-- received (docs/sync-causality.md). NULL: not sent since the entry was queued.
ALTER TABLE outbox ADD COLUMN sent_version TEXT;

-- 0003: the change feed a hub serves (`changes` ordered by ingest, not by the writer's clock).
-- A store opened with feed=True adds one mark per committed write transaction: the local_seq
-- the transaction ended at and the store's HLC stamp at commit. Both grow together (one writer),
-- so a client's `since` stamp maps to a seq and `until` is the stamp of the last mark served.
-- Laptops leave this table empty.
CREATE TABLE feed (
    seq   INTEGER PRIMARY KEY,
    stamp TEXT NOT NULL UNIQUE
) STRICT;

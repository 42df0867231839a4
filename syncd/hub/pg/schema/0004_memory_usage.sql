-- 0004: the MCP tools' usage counters (the plane's `memory_usage_stats`; syncd/hub/pg/usage.py
-- states the rules): telemetry kept apart from the memories, never in the feed, shared by every
-- hub process. A memory keeps the realm of its first count; times are nanoseconds since the
-- epoch, as the SQLite hub's `memory-usage.sqlite3` keeps them.
CREATE TABLE memory_usage_stats (
    memory_id          text PRIMARY KEY,
    realm              text NOT NULL,
    hit_count          bigint NOT NULL DEFAULT 0,
    reinforced_count   bigint NOT NULL DEFAULT 0,
    miss_count         bigint NOT NULL DEFAULT 0,
    last_surfaced_ns   bigint,
    last_reinforced_ns bigint
);
-- `list_memory_usage`: surfaced, never judged, most hits first
CREATE INDEX memory_usage_unreinforced ON memory_usage_stats
    (hit_count DESC, last_surfaced_ns DESC, memory_id)
    WHERE hit_count > 0 AND reinforced_count = 0 AND miss_count = 0;

"""The MCP tools' usage counters on PostgreSQL (``syncd/tools.py``, ``UsageCounters``): the
table ``memory_usage_stats`` (``schema/0004_memory_usage.sql``), which every hub process of the
database counts into and reads, with the semantics of the SQLite hub's ``Usage``.

Rules:
  * Each count is one statement: an upsert that adds to the stored counts under the row's
    lock, so concurrent counts from several processes all land (none is lost to a
    read-modify-write).
  * A batch of hits is upserted in memory-id order, one row per id (an id given twice counts
    twice): two processes counting overlapping batches lock rows in the same order and wait
    for each other, never deadlock.
  * A memory keeps the realm its first count gave it.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from syncd.hub.pg.tokens import Connect
from syncd.tools import USAGE_COLUMNS, usage_row

SURFACED_SQL = (
    "INSERT INTO memory_usage_stats (memory_id, realm, hit_count, last_surfaced_ns) "
    "SELECT u.id, u.realm, u.hits, $4::bigint FROM unnest($1::text[], $2::text[], $3::bigint[]) "
    "AS u(id, realm, hits) ORDER BY u.id ON CONFLICT (memory_id) DO UPDATE SET "
    "hit_count = memory_usage_stats.hit_count + excluded.hit_count, "
    "last_surfaced_ns = excluded.last_surfaced_ns")
FEEDBACK_SQL = (
    "INSERT INTO memory_usage_stats (memory_id, realm, reinforced_count, miss_count, "
    "last_reinforced_ns) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (memory_id) DO UPDATE SET "
    "reinforced_count = memory_usage_stats.reinforced_count + excluded.reinforced_count, "
    "miss_count = memory_usage_stats.miss_count + excluded.miss_count, "
    f"last_reinforced_ns = excluded.last_reinforced_ns RETURNING {USAGE_COLUMNS}")
UNREINFORCED_SQL = (
    f"SELECT memory_id, {USAGE_COLUMNS} FROM memory_usage_stats WHERE hit_count > 0 "
    "AND reinforced_count = 0 AND miss_count = 0 AND ($1::text IS NULL OR realm = $1) "
    "ORDER BY hit_count DESC, last_surfaced_ns DESC, memory_id COLLATE \"C\" LIMIT $2")


class PgUsage:
    def __init__(self, connect: Connect) -> None:
        self._connect = connect

    async def surfaced(self, hits: list[tuple[str, str]]) -> None:
        if not hits:
            return
        counts = Counter(mid for mid, _ in hits)
        realms = dict(reversed(hits))  # an id's first realm in the batch
        ids = sorted(counts)
        async with self._connect() as conn:
            await conn.execute(SURFACED_SQL, ids, [realms[mid] for mid in ids],
                               [counts[mid] for mid in ids], time.time_ns())

    async def feedback(self, memory_id: str, realm: str, helpful: bool) -> dict[str, Any]:
        good, bad = (1, 0) if helpful else (0, 1)
        async with self._connect() as conn:
            row = await conn.fetchrow(FEEDBACK_SQL, memory_id, realm, good, bad, time.time_ns())
        assert row is not None  # an upsert with RETURNING returns its row
        return usage_row(memory_id, *row)

    async def unreinforced(self, realm: str | None, limit: int) -> list[dict[str, Any]]:
        async with self._connect() as conn:
            rows = await conn.fetch(UNREINFORCED_SQL, realm, limit)
        return [usage_row(*row) for row in rows]

"""Reading the feed a batch of marks at a time (``feed_tx``, see ``__init__.py``)."""

from __future__ import annotations

from syncd.hub.pg.migrate import Conn


async def batch_end(conn: Conn, after: int, max_marks: int, rows: int) -> int | None:
    """The seq a read of the marks after ``after`` should stop at: the first mark where the
    running count of written rows reaches ``rows``, else the last of at most ``max_marks``
    marks (marks of vector-only transactions count no rows, so a read never spans more than
    ``max_marks``). None when there is no mark after ``after``."""
    found = await conn.fetchval(
        "SELECT coalesce(min(seq) FILTER (WHERE total >= $3), max(seq)) FROM "
        "(SELECT seq, sum(rows) OVER (ORDER BY seq) AS total FROM "
        "(SELECT seq, rows FROM feed_tx WHERE seq > $1 ORDER BY seq LIMIT $2) AS s) AS w",
        after, max_marks, rows)
    return None if found is None else int(found)

"""A read-only connection on its own thread, for reads that run many statements per request.

Recall's own SQL functions (pure and deterministic, in ``ranking.py``) are registered on it:
plane mode's keyword leg calls ``plane_kw_score``."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from local_store import db
from local_store.ranking import plane_kw_score

# name → (number of arguments, function)
SQL_FUNCTIONS = {"plane_kw_score": (4, plane_kw_score)}
# Rows the memo holds at most (~0.5 KB each: 10 MB); past it, it starts again empty.
MEMO_ROWS = 20_000
# Memories written between two recalls past which the memo starts again empty.
MEMO_CHANGED = 256
# The memories written since a seq, in commit order (the unique index ``memories_seq``).
CHANGED_SQL = "SELECT id, local_seq FROM memories WHERE local_seq > ? ORDER BY local_seq LIMIT ?"


class SyncReader:
    """A read-only connection on its own thread, for reads that run many queries in one hop
    (recall): one thread switch per request instead of one per statement."""

    def __init__(self, path: Path, name: str = "syncd-recall",
                 cache_kib: int | None = None) -> None:
        """``cache_kib``: the connection's page cache, when not ``db.CACHE_KIB``."""
        self.path = path
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._cache_kib = cache_kib
        self._conn: sqlite3.Connection | None = None
        self.memo = RowMemo(self.fetch)

    def fetch(self, sql: str, params: Sequence[object] = ()) -> list[Any]:
        """Run on ``pool`` only."""
        if self._conn is None:
            conn = db.connect(self.path, readonly=True)
            if self._cache_kib is not None:
                conn.execute(f"PRAGMA cache_size = {-self._cache_kib}")
            for name, (arity, function) in SQL_FUNCTIONS.items():
                conn.create_function(name, arity, function, deterministic=True)
            self._conn = conn
        return self._conn.execute(sql, params).fetchall()

    async def run(self, sql: str, params: Sequence[object] = ()) -> list[Any]:
        """``fetch`` on the reader's thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, self.fetch, sql, params)

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self.pool, self._close)
        self.pool.shutdown(wait=False)

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class RowMemo:
    """Rows recall has read, per filter (its SQL and parameters), kept while their memories are
    unchanged. Used on the reader's thread only.

    Recall's semantic leg reads the rows of its nearest memories (filtering and hydrating in one
    query); an agent's recalls revisit many of them, also across the writes between
    them. ``fresh`` asks SQLite whether another connection has committed since (``data_version``;
    this connection only reads) and, if so, which memories changed: every write of a memory
    takes the next ``local_seq`` in its transaction (schema 0001), so ``local_seq`` above the
    highest one seen names exactly the memories written since, in commit order. Their rows are
    forgotten; the rest stay. Past ``MEMO_CHANGED`` changed memories (a pulled batch), it forgets
    everything instead: reading the rows again costs less than looking up that many."""

    def __init__(self, fetch: Callable[[str, Sequence[object]], list[Any]]) -> None:
        self._fetch = fetch
        self._version: int | None = None
        self._seq: int | None = None  # the highest local_seq whose memory the memo accounts for
        self._rows: dict[tuple[str, tuple[object, ...]], dict[str, tuple[Any, ...] | None]] = {}
        self._held = 0

    def fresh(self) -> None:
        """Forget the rows of every memory written since the last call (all rows when more than
        ``MEMO_CHANGED`` were, or when the memo does not know where it stands)."""
        ((version,),) = self._fetch("PRAGMA data_version", ())
        if version == self._version:
            return
        self._version = version
        # Read after data_version: a commit landing between the two is seen here, and one
        # landing after changes data_version again, so the next call looks past this seq.
        if self._seq is not None:
            changed = self._fetch(CHANGED_SQL, (self._seq, MEMO_CHANGED + 1))
            if len(changed) <= MEMO_CHANGED:
                self._drop([mid for mid, _ in changed])
                if changed:
                    self._seq = int(changed[-1][1])
                return
        self._forget()
        ((seq,),) = self._fetch("SELECT coalesce(max(local_seq), 0) FROM memories", ())
        self._seq = int(seq)

    def rows(self, where: str, params: Sequence[object]) -> dict[str, tuple[Any, ...] | None]:
        """id → row (None: the filter drops it) for this filter; the caller adds what it read
        and then calls ``added``."""
        return self._rows.setdefault((where, tuple(params)), {})

    @property
    def held(self) -> int:
        """How many rows the memo holds."""
        return self._held

    def added(self, count: int) -> None:
        self._held += count
        if self._held > MEMO_ROWS:
            self._forget()

    def _drop(self, ids: list[str]) -> None:
        for rows in self._rows.values():
            for mid in ids:
                if mid in rows:  # (a row of None is held too: the filter drops that memory)
                    del rows[mid]
                    self._held -= 1

    def _forget(self) -> None:
        self._rows.clear()
        self._held = 0

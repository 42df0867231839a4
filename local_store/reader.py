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
    """Rows recall has read, per filter (its SQL and parameters), kept while the database is
    unchanged: ``fresh`` forgets them all once another connection has committed (SQLite's
    ``data_version``; this connection only reads). Used on the reader's thread only.

    Recall's semantic leg reads the rows of its nearest memories (filtering and hydrating in one
    query, ~6 µs a row); an agent's recalls between two writes revisit many of them."""

    def __init__(self, fetch: Callable[[str, Sequence[object]], list[Any]]) -> None:
        self._fetch = fetch
        self._version: int | None = None
        self._rows: dict[tuple[str, tuple[object, ...]], dict[str, tuple[Any, ...] | None]] = {}
        self._held = 0

    def fresh(self) -> None:
        """Forget every row if the database changed since the last call."""
        ((version,),) = self._fetch("PRAGMA data_version", ())
        if version != self._version:
            self._version = version
            self._forget()

    def rows(self, where: str, params: Sequence[object]) -> dict[str, tuple[Any, ...] | None]:
        """id → row (None: the filter drops it) for this filter; the caller adds what it read
        and then calls ``added``."""
        return self._rows.setdefault((where, tuple(params)), {})

    @property
    def held(self) -> int:
        """How many rows the memo holds (the count since it was last emptied)."""
        return self._held

    def added(self, count: int) -> None:
        self._held += count
        if self._held > MEMO_ROWS:
            self._forget()

    def _forget(self) -> None:
        self._rows.clear()
        self._held = 0

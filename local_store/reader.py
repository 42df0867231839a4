"""A read-only connection on its own thread, for reads that run many statements per request.

Recall's own SQL functions (pure and deterministic, in ``ranking.py``) are registered on it:
plane mode's keyword leg calls ``plane_kw_score``."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from local_store import db
from local_store.ranking import plane_kw_score

# name → (number of arguments, function)
SQL_FUNCTIONS = {"plane_kw_score": (4, plane_kw_score)}


class SyncReader:
    """A read-only connection on its own thread, for reads that run many queries in one hop
    (recall): one thread switch per request instead of one per statement."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="syncd-recall")
        self._conn: sqlite3.Connection | None = None

    def fetch(self, sql: str, params: Sequence[object] = ()) -> list[Any]:
        """Run on ``pool`` only."""
        if self._conn is None:
            conn = db.connect(self.path, readonly=True)
            for name, (arity, function) in SQL_FUNCTIONS.items():
                conn.create_function(name, arity, function, deterministic=True)
            self._conn = conn
        return self._conn.execute(sql, params).fetchall()

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self.pool, self._close)
        self.pool.shutdown(wait=False)

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

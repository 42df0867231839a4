"""A read-only connection on its own thread, for reads that run many statements per request."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from local_store import db


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
            self._conn = db.connect(self.path, readonly=True)
        return self._conn.execute(sql, params).fetchall()

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self.pool, self._close)
        self.pool.shutdown(wait=False)

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

"""WAL checkpoints off the writer's path.

SQLite's automatic checkpoint runs inside the COMMIT of whichever write crosses its threshold:
that write pays for copying every page of the WAL into the database and for two fsyncs (a sixth
of a fresh 10,000-row apply's time, or a save that stalls for tens of milliseconds).

Rules:
  * After each committed write transaction the store pokes the ``Checkpointer``. It runs a
    ``PASSIVE`` checkpoint on its own thread and connection: the copying and the fsyncs happen
    while the writer goes on, and it never waits for a lock.
  * The WAL restarts from its beginning only when a write transaction begins with every frame
    copied, which a concurrent checkpoint cannot promise (the writer appends while it copies).
    So once the WAL holds ``restart_frames`` or more, a second, short ``PASSIVE`` checkpoint
    runs on the writer's own thread, between two of its transactions: it copies the few frames
    written meanwhile, and the next transaction starts the WAL over. The file stays the size of
    a burst of writes (RELIABILITY S4).
  * One run at a time. Pokes that arrive during a run or within ``min_gap`` after it coalesce
    into one more run, so a stream of small saves costs a checkpoint every ``min_gap`` seconds,
    not one per save.
  * While a reader holds frames back (a pass could not copy them all), the next pass runs on
    the writer's thread right after the next write, with no ``min_gap``: the first pass after
    the reader ends copies the backlog before more than a write or two is appended, and the
    WAL restarts at the size it had (S4). Such a pass copies nothing the reader still needs,
    so it is short — what SQLite's own checkpoint did at every COMMIT in that state.
  * The writer keeps SQLite's own automatic checkpoint as a backstop at ``db.BACKSTOP_BYTES``:
    it only fires when this falls behind.
  * A failed checkpoint is recorded in ``last_error`` and never raised: the backstop and the
    daemon's periodic ``TRUNCATE`` checkpoint still bound the WAL.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from local_store import db

MIN_GAP_SECS = 0.05
RESTART_FRAMES = 1000  # SQLite's own default threshold


class Checkpointer:
    def __init__(self, path: Path, writer_pool: ThreadPoolExecutor,
                 writer_conn: Callable[[], sqlite3.Connection], *,
                 min_gap: float = MIN_GAP_SECS, restart_frames: int = RESTART_FRAMES) -> None:
        self.path = path
        self.min_gap = min_gap
        self.restart_frames = restart_frames
        self._writer_pool = writer_pool
        self._writer_conn = writer_conn
        self.runs = 0
        self.last_error: str | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="syncd-checkpoint")
        self._conn: sqlite3.Connection | None = None
        self._task: asyncio.Task[None] | None = None
        self._again = False
        self._stalled = False
        self._holds = 0
        self._closed = False

    def poke(self) -> None:
        """A write transaction committed (call on the event loop)."""
        if self._closed:
            return
        if self._holds or (self._task is not None and not self._task.done()):
            self._again = True
            return
        self._task = asyncio.get_running_loop().create_task(self._run(), name="wal-checkpoint")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._again = False
            try:
                if self._stalled:  # a reader held frames back: copy them between writes
                    frames, done = await loop.run_in_executor(self._writer_pool, self._finish)
                else:
                    frames, done = await loop.run_in_executor(self._pool, self._checkpoint)
                    if frames >= self.restart_frames and done == frames and not self._closed:
                        frames, done = await loop.run_in_executor(self._writer_pool, self._finish)
            except RuntimeError as exc:  # an executor was shut down: the store is closing
                self.last_error = f"RuntimeError: {exc}"
                return
            self._stalled = done < frames
            if not self._stalled:
                await asyncio.sleep(self.min_gap)
            if not self._again or self._closed or self._holds:
                return

    async def wait_idle(self) -> None:
        """Until no checkpoint is running or due (benchmarks, tests)."""
        while self._task is not None and not self._task.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(self._task)

    async def truncate(self) -> tuple[int, int, int]:
        """``wal_checkpoint(TRUNCATE)`` on the writer's thread, once no pass of this one runs
        (of two checkpoints at once, one gets SQLITE_BUSY). Returns SQLite's (busy, log,
        checkpointed)."""
        self._holds += 1
        try:
            if self._task is not None and not self._task.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(self._task)

            def run() -> tuple[int, int, int]:
                ((busy, log, done),) = self._writer_conn().execute(
                    "PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
                return int(busy), int(log), int(done)

            return await asyncio.get_running_loop().run_in_executor(self._writer_pool, run)
        finally:
            self._holds -= 1
            if self._again and not self._holds:
                self.poke()

    def _checkpoint(self) -> tuple[int, int]:
        """Run on ``_pool`` only: the concurrent pass."""
        if self._conn is None:
            self._conn = db.connect(self.path)
        return self._passive(self._conn)

    def _finish(self) -> tuple[int, int]:
        """Run on the writer's thread, between its transactions."""
        return self._passive(self._writer_conn())

    def _passive(self, conn: sqlite3.Connection) -> tuple[int, int]:
        """(frames in the WAL, frames copied into the database so far)."""
        try:
            ((_, frames, done),) = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            return 0, 0
        self.runs += 1
        self.last_error = None
        return max(int(frames), 0), max(int(done), 0)

    async def close(self) -> None:
        """Stop poking and wait for a running checkpoint; then close the connection."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await asyncio.get_running_loop().run_in_executor(self._pool, self._close)
        self._pool.shutdown(wait=False)

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

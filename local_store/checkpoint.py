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

Scrubbing after a purge (a hard delete, or a pulled or imported tombstone that purges text):
  * The purged text is off every page of ``memory.db`` as the transaction commits (the writer
    runs with ``secure_delete``, which zeroes freed cells and pages), but the WAL still holds
    the frames the text was written in, and earlier versions of the pages that held it, until
    it is truncated. So after a purging commit the store awaits ``scrub``: a
    ``wal_checkpoint(TRUNCATE)`` on the writer's thread, between two of its transactions,
    which copies every frame into the database and truncates the WAL to zero bytes.
  * A reader whose snapshot began before the purge still needs those pages (from the WAL, or
    from the database file, which the checkpoint then cannot overwrite): no checkpoint can
    remove the text before it ends. TRUNCATE also waits for readers of the latest snapshot to
    leave the WAL. So each attempt waits at most ``SCRUB_BUSY_MS`` for readers (the busy
    timeout of that one statement: the writer's thread, and every write queued behind it, is
    held no longer), and ``scrub`` retries with doubling gaps for ``SCRUB_WAIT_SECS`` at
    most; the store's own readers hold a snapshot for one statement, or one export.
  * Past that (a long export, an outside reader holding a transaction open), the purging
    write returns and the scrub stays owed: a background task retries with gaps doubling up
    to ``SCRUB_RETRY_MAX_SECS``, so the text leaves the disk within that gap after the last
    reader that needed it ends. Any TRUNCATE that succeeds after a purge's commit (the
    daemon's periodic one too) settles every purge committed before it began (``_scrubbed``
    counts purges, so a success that began before a purge's commit does not settle it).
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
SCRUB_BUSY_MS = 50  # one scrub attempt waits this long at most for readers to leave the WAL
SCRUB_WAIT_SECS = 1.0  # a purging write retries its scrub this long before it returns
SCRUB_FIRST_GAP_SECS = 0.02
SCRUB_RETRY_MAX_SECS = 1.0  # the owed scrub's retries, in the background, at most this apart


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
        self._purges = 0  # purging commits so far
        self._scrubbed = 0  # of them, how many a successful TRUNCATE has settled
        self._settled = asyncio.Event()
        self._settled.set()
        self._scrubber: asyncio.Task[None] | None = None
        # Held for each pass and each TRUNCATE: of two checkpoints at once, one gets
        # SQLITE_BUSY (SQLite takes its checkpoint lock without a busy handler).
        self._one_at_a_time = asyncio.Lock()

    def poke(self) -> None:
        """A write transaction committed (call on the event loop)."""
        if self._closed:
            return
        if self._holds or (self._task is not None and not self._task.done()):
            self._again = True
            return
        self._task = asyncio.get_running_loop().create_task(self._run(), name="wal-checkpoint")

    async def _run(self) -> None:
        while True:
            self._again = False
            try:
                if self._stalled:  # a reader held frames back: copy them between writes
                    frames, done = await self._step(self._writer_pool, self._finish)
                else:
                    frames, done = await self._step(self._pool, self._checkpoint)
                    if frames >= self.restart_frames and done == frames and not self._closed:
                        frames, done = await self._step(self._writer_pool, self._finish)
            except RuntimeError as exc:  # an executor was shut down: the store is closing
                self.last_error = f"RuntimeError: {exc}"
                return
            self._stalled = done < frames
            if not self._stalled:
                await asyncio.sleep(self.min_gap)
            if not self._again or self._closed or self._holds:
                return

    async def _step(self, pool: ThreadPoolExecutor,
                    fn: Callable[[], tuple[int, int]]) -> tuple[int, int]:
        """One pass on ``pool``, never beside a ``truncate`` (a pass that would start while
        one is held, or queued, waits for it: the pass loop checks ``_holds`` only between
        passes, and a freshly poked task has not checked it at all)."""
        async with self._one_at_a_time:
            return await asyncio.get_running_loop().run_in_executor(pool, fn)

    async def wait_idle(self) -> None:
        """Until no checkpoint is running or due (benchmarks, tests)."""
        while self._task is not None and not self._task.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(self._task)

    async def truncate(self, busy_ms: int | None = None) -> tuple[int, int, int]:
        """``wal_checkpoint(TRUNCATE)`` on the writer's thread, once no pass of this one runs
        (of two checkpoints at once, one gets SQLITE_BUSY). ``busy_ms``: wait at most this
        long for readers (else the connection's busy timeout). Returns SQLite's (busy, log,
        checkpointed); busy 0 settles every purge committed before it began."""
        self._holds += 1
        purges = self._purges
        try:
            def run() -> tuple[int, int, int]:
                conn = self._writer_conn()
                if busy_ms is not None:
                    conn.execute(f"PRAGMA busy_timeout = {int(busy_ms)}")
                try:
                    ((busy, log, done),) = conn.execute(
                        "PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
                finally:
                    if busy_ms is not None:
                        conn.execute(f"PRAGMA busy_timeout = {db.BUSY_TIMEOUT_MS}")
                return int(busy), int(log), int(done)

            # A pass running now finishes first; its gap after (``min_gap``) is no matter:
            # the pass loop ends there while this holds.
            async with self._one_at_a_time:
                result = await asyncio.get_running_loop().run_in_executor(
                    self._writer_pool, run)
        finally:
            self._holds -= 1
            if self._again and not self._holds:
                self.poke()
        if result[0] == 0:
            self._scrubbed = max(self._scrubbed, purges)
            if self._scrubbed >= self._purges:
                self._settled.set()
        return result

    @property
    def scrub_owed(self) -> bool:
        """A purge committed that no TRUNCATE has settled yet (its text may be in the WAL)."""
        return self._scrubbed < self._purges

    async def scrub(self) -> bool:
        """A purging transaction committed: truncate the WAL (module rules). True once done;
        False when readers held it back for ``SCRUB_WAIT_SECS`` (it is then retried in the
        background until it succeeds)."""
        self._purges += 1
        self._settled.clear()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SCRUB_WAIT_SECS
        gap = SCRUB_FIRST_GAP_SECS
        try:
            while not self._closed and not await self._attempt():
                if loop.time() + gap > deadline:
                    break
                await asyncio.sleep(gap)
                gap *= 2
        finally:  # also when the caller is cancelled: the scrub stays owed, and retried
            if (self.scrub_owed and not self._closed
                    and (self._scrubber is None or self._scrubber.done())):
                self._scrubber = loop.create_task(self._scrub_later(), name="wal-scrub")
        return not self.scrub_owed

    async def wait_scrubbed(self) -> None:
        """Until no purge is owed a scrub (tests: after a reader that held it back ends)."""
        await self._settled.wait()

    async def _attempt(self) -> bool:
        try:
            await self.truncate(SCRUB_BUSY_MS)
        except (sqlite3.Error, RuntimeError) as exc:  # RuntimeError: the store is closing
            self.last_error = f"{type(exc).__name__}: {exc}"
        return not self.scrub_owed

    async def _scrub_later(self) -> None:
        gap = SCRUB_FIRST_GAP_SECS
        while self.scrub_owed and not self._closed:
            await asyncio.sleep(gap)
            if self._closed or await self._attempt():
                return
            gap = min(gap * 2, SCRUB_RETRY_MAX_SECS)

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
        for task in (self._task, self._scrubber):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await asyncio.get_running_loop().run_in_executor(self._pool, self._close)
        self._pool.shutdown(wait=False)

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

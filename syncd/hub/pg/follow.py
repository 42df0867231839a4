"""How one PostgreSQL hub process keeps up with the others: its vector index follows the feed
(``catch_up``, every ``FOLLOW_SECS``), and a ``LISTEN`` connection of its own wakes its held
polls when another process commits.

Rules:
  * While the database is away, retries back off to ``FOLLOW_BACKOFF_CAP_SECS`` and the outage
    is logged once, at its first failure (every retry at debug); the return at info.
  * A lost listening connection is reconnected (and checked every ``LISTEN_CHECK_SECS``);
    meanwhile held polls answer at their timeout, never later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import asyncpg

from syncd.hub.longpoll import Commits
from syncd.hub.pg.imports import FEED_CHANNEL
from syncd.hub.pg.recall import VectorTail
from syncd.hub.pg.tokens import Connect

log = logging.getLogger("syncd.hub.pg")
FOLLOW_SECS = 0.5
FOLLOW_BACKOFF_CAP_SECS = 30.0  # the follower's retries while the database is away
APPLICATION_NAME = "syncd-hub"  # how the hub's sessions show in pg_stat_activity
LISTEN_CHECK_SECS = 30.0  # the listening connection is checked this often (a cut link)


class PgFollower:
    """This process's vector index, kept current, and the listener for others' commits."""

    def __init__(self, connect: Connect, vectors: VectorTail, commits: Commits) -> None:
        self._connection, self.vectors, self.commits = connect, vectors, commits
        self._catch_up_lock = asyncio.Lock()

    async def catch_up(self) -> int:
        """Bring this process's vector index up to the feed; returns vectors applied."""
        async with self._catch_up_lock, self._connection() as conn:
            return await self.vectors.catch_up(conn)

    async def follow(self) -> None:
        """Other processes' writes reach this process's index within ``FOLLOW_SECS``. While
        the database is away, retries back off to ``FOLLOW_BACKOFF_CAP_SECS`` and the outage
        is logged once, at its first failure; every retry is logged at debug with its
        traceback, and the return at info. Once per outage, not once per distinct error: a
        database going away fails several ways in turn (shutting down, reset, refused, a
        connection cut mid-statement), and errors that alternate would be logged every retry."""
        wait, failures = FOLLOW_SECS, 0
        while True:
            await asyncio.sleep(wait)
            try:
                await self.catch_up()
            except Exception as exc:  # a database hiccup must not stop the follower for good
                if not failures:
                    log.warning("vector index catch-up failed (%s: %s); retrying, logged again "
                                "when it works", type(exc).__name__, exc)
                log.debug("vector index catch-up failed", exc_info=True)
                failures, wait = failures + 1, min(wait * 2, FOLLOW_BACKOFF_CAP_SECS)
                continue
            if failures:
                log.info("vector index catch-up works again after %d failed attempts", failures)
            failures, wait = 0, FOLLOW_SECS

    async def listen(self, dsn: str) -> None:
        """``LISTEN`` on a connection of its own: another process's commit bumps ``commits``.
        After (re)connecting it bumps once, for what committed while nobody listened; a lost
        connection is retried as the follower retries, and logged once per outage. While it is
        down, held polls answer at their timeout, and the laptops' next polls read the feed."""
        wait, failures = FOLLOW_SECS, 0
        while True:
            try:
                conn = await asyncpg.connect(dsn, server_settings={
                    "application_name": APPLICATION_NAME})
            except Exception as exc:  # a database away: retried, never fatal
                if not failures:
                    log.warning("cannot LISTEN for other hub processes' commits (%s: %s); "
                                "retrying", type(exc).__name__, exc)
                failures += 1
                await asyncio.sleep(wait)
                wait = min(wait * 2, FOLLOW_BACKOFF_CAP_SECS)
                continue
            try:
                await self._listen_on(conn)
                if failures:
                    log.info("listening for commits again after %d failed attempts", failures)
                failures, wait = 0, FOLLOW_SECS
                await self._while_alive(conn)
            except Exception as exc:
                if not failures:
                    log.warning("lost the LISTEN connection (%s: %s); reconnecting",
                                type(exc).__name__, exc)
                failures += 1
            finally:
                with contextlib.suppress(Exception):
                    await conn.close(timeout=5)

    async def _listen_on(self, conn: asyncpg.Connection) -> None:
        await conn.add_listener(FEED_CHANNEL, lambda *_: self.commits.notify())
        self.commits.notify()

    @staticmethod
    async def _while_alive(conn: asyncpg.Connection) -> None:
        """Raises once ``conn`` is found dead: closed under it, or failing a check."""
        lost = asyncio.Event()
        conn.add_termination_listener(lambda _: lost.set())
        while not lost.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(LISTEN_CHECK_SECS):
                    await lost.wait()
            if not lost.is_set():
                await conn.fetchval("SELECT 1", timeout=10)
        raise ConnectionError("the connection was closed")

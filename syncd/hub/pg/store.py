"""``PgHubStore``: the hub-store interface on PostgreSQL via asyncpg — the pool, the schema at
open, and the hub-store methods, each served by the part that owns it: imports
(``imports.py``), feed and export reads (``feed.py``), settings, counters, the signing key and
page sessions (``settings.py``), the vector index and the commit listener (``follow.py``),
tokens, invites and usage (rules in ``__init__.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Mapping, Sequence

import asyncpg
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from local_store.apply import ApplyResult
from local_store.embed import Embedder, HashingEmbedder
from local_store.exporting import PAGE_ROWS as EXPORT_PAGE_ROWS
from local_store.exporting import ExportPages
from protocol.query import QueryRequest, QueryResponse
from protocol.rows import EdgeRow, NodeRow
from protocol.settings import MemorySettings
from syncd.hub.longpoll import Commits
from syncd.hub.pg.feed import PgReads
from syncd.hub.pg.follow import APPLICATION_NAME, PgFollower
from syncd.hub.pg.imports import RETRYABLE, PgImports
from syncd.hub.pg.invites import PgInvites
from syncd.hub.pg.migrate import Conn, migrate
from syncd.hub.pg.recall import VectorTail, run_recall
from syncd.hub.pg.settings import PgState
from syncd.hub.pg.tokens import PgTokens
from syncd.hub.pg.usage import PgUsage
from syncd.hub.store import Page, PageSession, StoreUnavailableError

# What is a database outage (503 + Retry-After), not a bug (500): no connection, no free
# connection slot, a statement cancelled or timed out, a retried conflict that kept failing.
_UNAVAILABLE = (OSError, asyncpg.InterfaceError, asyncpg.CannotConnectNowError,
                asyncpg.PostgresConnectionError, asyncpg.TooManyConnectionsError,
                asyncpg.QueryCanceledError, asyncio.TimeoutError, *RETRYABLE)


class PgHubStore:
    kind = "postgresql"

    def __init__(self, pool: asyncpg.Pool, embedder: Embedder, store_id: str) -> None:
        self._pool, self.embedder, self.store_id = pool, embedder, store_id
        self.tokens = PgTokens(self._connection)
        self.invites = PgInvites(self._connection)
        self.usage = PgUsage(self._connection)
        self.vectors = VectorTail(embedder.model_id, embedder.dim)
        self.commits = Commits()
        self.follower = PgFollower(self._connection, self.vectors, self.commits)
        self.imports = PgImports(self._connection, embedder, self.commits, self.catch_up)
        self.reads = PgReads(self._connection, embedder)
        self.state = PgState(self._connection)
        self._follow_task: asyncio.Task[None] | None = None
        self._listen_task: asyncio.Task[None] | None = None
        self._closed = False

    @classmethod
    async def open(cls, dsn: str, *, embedder: Embedder, pool_size: int = 8,
                   follow: bool = True, load_index: bool = True) -> PgHubStore:
        """Connect, migrate (several processes may do this at once), load the vector index.
        ``follow`` keeps the index current from the feed in the background."""
        try:
            pool = await asyncpg.create_pool(
                dsn, min_size=1, max_size=pool_size, command_timeout=120,
                server_settings={"application_name": APPLICATION_NAME})
        except _UNAVAILABLE as exc:
            raise StoreUnavailableError(f"cannot connect to PostgreSQL: {exc}") from exc
        try:
            async with pool.acquire() as conn:
                await migrate(conn)
                store_id = await conn.fetchval("SELECT value FROM hub_meta WHERE key = 'store_id'")
            store = cls(pool, embedder, str(store_id))
            if load_index:
                await store.catch_up()
        except BaseException:
            await pool.close()
            raise
        if follow:
            follower = store.follower
            store._follow_task = asyncio.create_task(follower.follow(), name="pg-vector-follower")
            store._listen_task = asyncio.create_task(follower.listen(dsn), name="pg-feed-listener")
        return store

    @classmethod
    async def admin(cls, dsn: str) -> PgHubStore:
        """For ``syncd hub token``/``key``: migrated, one connection, no vector index."""
        return await cls.open(dsn, embedder=HashingEmbedder(), pool_size=1, follow=False,
                              load_index=False)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.commits.close()
        for task in (self._follow_task, self._listen_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self._pool.close()

    def now_ns(self) -> int:
        return time.time_ns()

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[Conn]:
        try:
            async with self._pool.acquire() as conn:
                yield conn
        except _UNAVAILABLE as exc:
            raise StoreUnavailableError(f"PostgreSQL unavailable: {exc}") from exc

    # ------------------------------------------------------------------ the hub-store interface

    async def apply(self, nodes: Sequence[NodeRow], edges: Sequence[EdgeRow], *,
                    model: str) -> ApplyResult:
        return await self.imports.apply(nodes, edges, model=model)

    async def reembed_missing(self, batch: int = 64) -> int:
        return await self.imports.reembed_missing(batch)

    async def feed(self, since: str | None, *, limit: int | None = None,
                   realm: str | None = None, exclude_origin: str | None = None) -> Page:
        return await self.reads.feed(since, limit=limit, realm=realm,
                                     exclude_origin=exclude_origin)

    async def export_page(self, cursor: str, *, limit: int, realm: str | None = None) -> Page:
        return await self.reads.export_page(cursor, limit=limit, realm=realm)

    async def changes_since(self, since: str | None, realm: str | None = None, *,
                            edge_version: str = "updated_at",
                            ) -> tuple[list[NodeRow], list[EdgeRow]]:
        return await self.reads.changes_since(since, realm, edge_version=edge_version)

    def changes_snapshot(self, since: str | None, realm: str | None = None, *,
                         edge_version: str = "updated_at", page_rows: int = EXPORT_PAGE_ROWS,
                         ) -> contextlib.AbstractAsyncContextManager[ExportPages]:
        return self.reads.changes_snapshot(since, realm, edge_version=edge_version,
                                           page_rows=page_rows)

    async def export(self, realm: str | None = None) -> tuple[list[NodeRow], list[EdgeRow]]:
        return await self.reads.export(realm)

    def export_snapshot(self, realm: str | None = None, *, page_rows: int = EXPORT_PAGE_ROWS,
                        ) -> contextlib.AbstractAsyncContextManager[ExportPages]:
        return self.reads.export_snapshot(realm, page_rows=page_rows)

    async def next_counter(self, name: str) -> int:
        return await self.state.next_counter(name)

    async def settings(self) -> MemorySettings:
        return await self.state.settings()

    async def put_settings(self, patch: Mapping[str, object]) -> MemorySettings:
        return await self.state.put_settings(patch)

    async def signing_key(self) -> Ed25519PrivateKey:
        return await self.state.signing_key()

    async def add_page_session(self, sid_sha256: str, session: PageSession, *, now_ns: int,
                               keep: int) -> None:
        await self.state.add_page_session(sid_sha256, session, now_ns=now_ns, keep=keep)

    async def page_session(self, sid_sha256: str, *, now_ns: int) -> PageSession | None:
        return await self.state.page_session(sid_sha256, now_ns=now_ns)

    async def end_page_session(self, sid_sha256: str) -> None:
        await self.state.end_page_session(sid_sha256)

    async def recall(self, request: QueryRequest) -> QueryResponse:
        settings = await self.settings()
        async with self._connection() as conn:
            return await run_recall(conn, request, settings, self.embedder, self.vectors)

    async def stats(self) -> dict[str, int]:
        async with self._connection() as conn:
            row = await conn.fetchrow(
                "SELECT (SELECT count(*) FROM memories WHERE deleted = 0), "
                "(SELECT count(*) FROM memories WHERE deleted = 1), "
                "(SELECT count(*) FROM edges WHERE deleted = 0)")
        assert row is not None
        return {"memories": int(row[0]), "tombstones": int(row[1]), "edges": int(row[2]),
                "indexed_vectors": len(self.vectors.index)}

    async def catch_up(self) -> int:
        """Bring this process's vector index up to the feed; returns vectors applied."""
        return await self.follower.catch_up()

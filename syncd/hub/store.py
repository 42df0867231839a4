"""The hub-store interface: everything the hub persists goes through a ``HubStore`` — rows and
edges (``apply``), the change feed (``feed``, ``export_page``), recall, settings, counters,
the MCP tools' usage counters (``usage``: ``memory-usage.sqlite3`` beside a SQLite store, the
``memory_usage_stats`` table on PostgreSQL), API tokens (``tokens``) and the invites that become tokens (``invites``, rules in
``invites.py``), the entitlement signing key and the web page's sign-ins (``add_page_session``).

Two implementations run the same conformance suite (``tests/hub/test_conformance.py``):
  * ``SqliteHubStore``: one process, the local store opened with its feed (``Store.open(feed=
    True)``), tokens in ``hub-tokens.json``, the key in ``entitlement-key.pem``, and page
    sessions in the process's memory (the data directory's lock makes it the only hub process
    of that store; a restart signs browsers out);
  * ``PgHubStore`` (``syncd/hub/pg/``): several stateless hub processes on one PostgreSQL
    database, everything in the database — page sessions too, so a balancing proxy may send a
    browser's requests to any process.

Both keep ``commits`` (``longpoll.Commits``) bumped by every committed write — on PostgreSQL
by every process's, through ``LISTEN``/``NOTIFY`` — so a held ``changes?wait=`` wakes.

Page sessions: a store is handed the SHA-256 of a session's id, never the id (the cookie's
value), and knows the session's token by the token's SHA-256, never the raw token. Adding one
sweeps every expired session and keeps at most ``keep`` of *its token's* sessions (that token's
oldest end): signing in again and again with one token never ends another token's sessions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from local_store import Store, ValidationError
from local_store.apply import ApplyResult
from local_store.embed import Embedder
from local_store.exporting import PAGE_ROWS as EXPORT_PAGE_ROWS
from local_store.exporting import ExportPages
from local_store.redact import quoted
from protocol.errors import SyncdError
from protocol.query import QueryRequest, QueryResponse
from protocol.rows import EdgeRow, NodeRow
from protocol.settings import MemorySettings
from syncd.hub.invites import FileInvites, InviteStore
from syncd.hub.keys import load_or_create_key
from syncd.hub.longpoll import Commits
from syncd.hub.tokens import (
    TokenBook,
    authenticate,
    create_token,
    list_tokens,
    revoke_token,
)
from syncd.tools import Usage, UsageCounters

Page = tuple[list[NodeRow], list[EdgeRow], str, bool]  # rows, until/next cursor, has_more


RETRY_AFTER_SECS = 5


class StoreUnavailableError(SyncdError, RuntimeError):
    """The hub's database cannot be reached right now: 503 with ``Retry-After``."""

    status, code = 503, "store_unavailable"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"Retry-After": str(RETRY_AFTER_SECS)})


@dataclass(frozen=True, slots=True)
class PageSession:
    """A browser's sign-in on the hub's page, as a store keeps it (rules above)."""

    token_sha256: str  # whose session: the SHA-256 hex of the token it signed in with
    csrf: str  # what the page's writes must carry (``syncd/http/web.py``)
    expires_ns: int  # wall clock (``time.time_ns``): the session ends then


class TokenStore(Protocol):
    async def authenticate(self, header: str | None, need: str) -> tuple[str, str]:
        """``(name, role)`` of a bearer token with at least ``need``; raises ``AuthError``."""
        ...

    async def identify(self, raw: str) -> tuple[str, str] | None:
        """``(name, plan)`` of an active raw token, or None."""
        ...

    async def lookup_hash(self, sha256: str) -> tuple[str, str, str] | None:
        """``(name, role, plan)`` of the active token whose SHA-256 hex is ``sha256``, or None
        (a page session knows its token by the hash only)."""
        ...

    async def create(self, *, role: str, name: str, plan: str = "pro") -> str: ...

    async def revoke(self, name: str) -> bool: ...

    async def list(self) -> list[dict[str, str | None]]: ...


class HubStore(Protocol):
    kind: str  # "sqlite" or "postgresql"
    store_id: str
    embedder: Embedder
    commits: Commits  # bumped by every committed write (``longpoll.py``)

    @property
    def tokens(self) -> TokenStore: ...

    @property
    def invites(self) -> InviteStore: ...

    @property
    def usage(self) -> UsageCounters: ...

    def now_ns(self) -> int:
        """The hub's clock (the origin-mode feed's ``until``)."""
        ...

    async def apply(self, nodes: Sequence[NodeRow], edges: Sequence[EdgeRow], *,
                    model: str) -> ApplyResult: ...

    async def feed(self, since: str | None, *, limit: int | None = None,
                   realm: str | None = None, exclude_origin: str | None = None) -> Page:
        """Commit-ordered ``changes``: rows, ``until``, ``has_more`` (``local_store/feed.py``
        states the rules; the PostgreSQL feed keeps them)."""
        ...

    async def changes_since(self, since: str | None, realm: str | None = None, *,
                            edge_version: str = "updated_at",
                            ) -> tuple[list[NodeRow], list[EdgeRow]]:
        """The plane's own ``changes``: rows whose version is after ``since``, in one piece."""
        ...

    def changes_snapshot(self, since: str | None, realm: str | None = None, *,
                         edge_version: str = "updated_at", page_rows: int = EXPORT_PAGE_ROWS,
                         ) -> AbstractAsyncContextManager[ExportPages]:
        """``changes_since``'s rows a page at a time from one snapshot (the origin-mode
        ``changes`` answer is streamed from it). A bad ``since`` raises here."""
        ...

    async def export(self, realm: str | None = None) -> tuple[list[NodeRow], list[EdgeRow]]:
        """Every latest version, tombstones included."""
        ...

    async def export_page(self, cursor: str, *, limit: int, realm: str | None = None) -> Page:
        """One page of ``export``: rows, ``next_cursor``, ``has_more``. ``cursor`` is ``"0"``
        or a previous ``next_cursor``; a bad one raises ``ValidationError("cursor")``."""
        ...

    def export_snapshot(self, realm: str | None = None, *, page_rows: int = EXPORT_PAGE_ROWS,
                        ) -> AbstractAsyncContextManager[ExportPages]:
        """``export``'s rows, in its order, a page at a time from one snapshot (the unpaged
        export answer is streamed from it: a hub's memory stays bounded by a page)."""
        ...

    async def recall(self, request: QueryRequest) -> QueryResponse: ...

    async def settings(self) -> MemorySettings: ...

    async def put_settings(self, patch: Mapping[str, object]) -> MemorySettings: ...

    async def next_counter(self, name: str) -> int: ...

    async def stats(self) -> dict[str, int]: ...

    async def reembed_missing(self) -> int: ...

    async def signing_key(self) -> Ed25519PrivateKey: ...

    async def add_page_session(self, sid_sha256: str, session: PageSession, *, now_ns: int,
                               keep: int) -> None:
        """Keep ``session`` under the SHA-256 hex of its id; delete every session expired at
        ``now_ns``; then keep only the newest ``keep`` (≥ 1) sessions of its token."""
        ...

    async def page_session(self, sid_sha256: str, *, now_ns: int) -> PageSession | None:
        """The session kept under ``sid_sha256`` if it has not expired at ``now_ns``."""
        ...

    async def end_page_session(self, sid_sha256: str) -> None:
        """Delete the session kept under ``sid_sha256`` (none: nothing happens)."""
        ...

    async def close(self) -> None: ...


class FileTokens:
    """``TokenStore`` over ``hub-tokens.json`` (``tokens.py``); the file is read on a worker
    thread, first when a token is needed."""

    def __init__(self, data_dir: Path, book: TokenBook | None = None) -> None:
        self.data_dir = data_dir
        self._book = book

    def _loaded(self) -> TokenBook:
        if self._book is None:
            self._book = TokenBook(self.data_dir)
        return self._book

    async def authenticate(self, header: str | None, need: str) -> tuple[str, str]:
        return await asyncio.to_thread(lambda: authenticate(self._loaded(), header, need))

    async def identify(self, raw: str) -> tuple[str, str] | None:
        def run() -> tuple[str, str] | None:
            book = self._loaded()
            found, plan = book.lookup(raw), book.plan_of(raw)
            return None if found is None or plan is None else (found[0], plan)
        return await asyncio.to_thread(run)

    async def lookup_hash(self, sha256: str) -> tuple[str, str, str] | None:
        return await asyncio.to_thread(lambda: self._loaded().by_hash(sha256))

    async def create(self, *, role: str, name: str, plan: str = "pro") -> str:
        return await asyncio.to_thread(create_token, self.data_dir, role=role, name=name,
                                       plan=plan)

    async def revoke(self, name: str) -> bool:
        return await asyncio.to_thread(revoke_token, self.data_dir, name)

    async def list(self) -> list[dict[str, str | None]]:
        return await asyncio.to_thread(list_tokens, self.data_dir)


class SqliteHubStore:
    """The single-process hub: a feed ``Store`` plus files in its data directory."""

    kind = "sqlite"

    def __init__(self, store: Store, tokens: TokenStore | None = None) -> None:
        self.store = store
        self.tokens: TokenStore = tokens if tokens is not None else FileTokens(store.data_dir)
        self.invites: InviteStore = FileInvites(store.data_dir)
        self.usage: UsageCounters = Usage(store.data_dir)
        self.store_id = store.store_id
        self.embedder = store.embedder
        self._page_sessions: dict[str, PageSession] = {}  # in sign-in order, oldest first
        self.commits = Commits()  # every commit of the store: imports, MCP writes, re-embeds
        store.commit_listeners.append(self.commits.notify)

    def now_ns(self) -> int:
        return self.store.clock.physical_ns()

    async def apply(self, nodes: Sequence[NodeRow], edges: Sequence[EdgeRow], *,
                    model: str) -> ApplyResult:
        return await self.store.replication.apply(nodes, edges, model=model)

    async def feed(self, since: str | None, *, limit: int | None = None,
                   realm: str | None = None, exclude_origin: str | None = None) -> Page:
        return await self.store.feed.page(since, limit=limit, realm=realm,
                                     exclude_origin=exclude_origin)

    async def changes_since(self, since: str | None, realm: str | None = None, *,
                            edge_version: str = "updated_at",
                            ) -> tuple[list[NodeRow], list[EdgeRow]]:
        return await self.store.feed.read(realm, since=since, include_deleted=True, edge_version=edge_version)

    def changes_snapshot(self, since: str | None, realm: str | None = None, *,
                         edge_version: str = "updated_at", page_rows: int = EXPORT_PAGE_ROWS,
                         ) -> AbstractAsyncContextManager[ExportPages]:
        return self.store.feed.snapshot(realm, since=since, include_deleted=True, edge_version=edge_version, page_rows=page_rows)

    async def export(self, realm: str | None = None) -> tuple[list[NodeRow], list[EdgeRow]]:
        return await self.store.feed.read(realm, include_deleted=True)

    def export_snapshot(self, realm: str | None = None, *, page_rows: int = EXPORT_PAGE_ROWS,
                        ) -> AbstractAsyncContextManager[ExportPages]:
        return self.store.feed.snapshot(realm, include_deleted=True, page_rows=page_rows)

    async def export_page(self, cursor: str, *, limit: int, realm: str | None = None) -> Page:
        start = parse_cursor(cursor)
        nodes, edges, last, more = await self.store.feed.page(start, limit=limit, realm=realm)
        return nodes, edges, str(last), more

    async def recall(self, request: QueryRequest) -> QueryResponse:
        return await self.store.recall.query(request)

    async def settings(self) -> MemorySettings:
        return self.store.settings.current

    async def put_settings(self, patch: Mapping[str, object]) -> MemorySettings:
        return await self.store.settings.put(patch)

    async def next_counter(self, name: str) -> int:
        return await self.store.replication.next_counter(name)

    async def stats(self) -> dict[str, int]:
        return await self.store.maintenance.stats()

    async def reembed_missing(self) -> int:
        return await self.store.embedding.reembed_missing()

    async def signing_key(self) -> Ed25519PrivateKey:
        return await asyncio.to_thread(load_or_create_key, self.store.data_dir)

    async def add_page_session(self, sid_sha256: str, session: PageSession, *, now_ns: int,
                               keep: int) -> None:
        live = {k: s for k, s in self._page_sessions.items() if s.expires_ns > now_ns}
        live.pop(sid_sha256, None)
        mine = [k for k, s in live.items() if s.token_sha256 == session.token_sha256]
        for key in mine[:max(0, len(mine) + 1 - keep)]:
            del live[key]
        live[sid_sha256] = session
        self._page_sessions = live

    async def page_session(self, sid_sha256: str, *, now_ns: int) -> PageSession | None:
        found = self._page_sessions.get(sid_sha256)
        return found if found is not None and found.expires_ns > now_ns else None

    async def end_page_session(self, sid_sha256: str) -> None:
        self._page_sessions.pop(sid_sha256, None)

    async def close(self) -> None:
        self.commits.close()
        if self.commits.notify in self.store.commit_listeners:
            self.store.commit_listeners.remove(self.commits.notify)
        await self.store.close()


MAX_CURSOR = 2**63 - 1  # a 64-bit integer, as the stores keep it


def parse_cursor(raw: str) -> int:
    """An export cursor: ASCII digits (``str.isdigit`` also takes ``٣``) up to a 64-bit
    integer; anything else is a ``ValidationError`` naming ``cursor``."""
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 19 or int(raw) > MAX_CURSOR:
        raise ValidationError("cursor", f"must be a next_cursor from a previous page, got "
                              f"{quoted(raw)}")
    return int(raw)

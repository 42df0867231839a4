"""The hub's side of the routes it shares with the daemon (``syncd/http/routes.py``): recall
with the plane's usage counts, export in pages, ``changes`` from the ingest feed with its
long-poll (or origin-stamped, as the plane), the settings replace, and ``status`` in one shape.

Rules (``app.py`` has the hub's wire rules; ``longpoll.py`` the long-poll's):
  * ``query`` refuses U+0000 in any text field, naming it (PostgreSQL text cannot hold it), and
    counts a hit for each memory it returns; its ``precedent`` is the plane's key, never found.
  * ``changes`` in ingest mode is a page of the hub's commit order (``limit``/``has_more``,
    ``exclude_origin``), held until a write commits when ``wait`` asks and the page has no rows;
    every answer carries ``Syncd-Long-Poll`` while the long-poll is on. In origin mode it is the
    plane's: nodes filtered on their own ``updated_at``, edges on ``created_at``, ``until`` read
    after the rows.
  * ``PUT settings`` from a bearer token replaces (missing keys take the coded defaults) and
    answers ``{"ok": true}``; from the page's session it patches and answers the settings.
  * ``status`` has one shape on every backend: ``STATUS_COUNTS`` are always there, ``null`` where
    the backend keeps no such count (SQLite has an outbox, PostgreSQL an in-process vector index).
"""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import msgspec

from local_store import ValidationError
from local_store.apply import ApplyResult
from local_store.arguments import msgspec_field
from local_store.exporting import ExportPages
from local_store.redact import strip_json_object
from protocol.query import QueryRequest, QueryResponse
from protocol.rows import ChangesResponse, EdgeRow, ExportBody, NodeRow
from protocol.settings import replace_settings
from protocol.timestamp import format_ns
from syncd import __version__
from syncd.http.routes import IngestFeed, Pager, RowStream, page_limit, since_echo
from syncd.http.wire import EXPORT_HINT
from syncd.hub.longpoll import GONE_CHECK_SECS, HEADER, MAX_WAIT_SECS, HeldPolls, parse_wait
from syncd.hub.store import HubStore, Page
from syncd.hub.workcopy import NUL_MESSAGE

STATUS_COUNTS = ("memories", "tombstones", "edges", "outbox", "indexed_vectors")
_NUL_LISTS, _NUL_TEXTS = ("realms", "tags"), ("memory_type", "space_agent", "as_of")


class HubFeed:
    """``changes`` in ingest mode (rules): the feed's page, held as a long-poll."""

    def __init__(self, hub: HubStore, polls: HeldPolls) -> None:
        self.hub, self.polls = hub, polls

    async def page(self, since: str, realm: str | None, query: Mapping[str, str], *,
                   gone: Callable[[], bool]) -> tuple[ChangesResponse, Mapping[str, str]]:
        hub, polls = self.hub, self.polls
        wait = parse_wait(query.get("wait"))
        read = functools.partial(hub.feed, since, limit=page_limit(query), realm=realm,
                                 exclude_origin=query.get("exclude_origin") or None)
        seen = hub.commits.generation  # before the read: a commit after it wakes the wait
        page = await read()
        offered = {HEADER: f"{MAX_WAIT_SECS:g}"} if polls.cap else {}  # cap 0: long-poll off
        if wait and offered and not _has_rows(page):
            with polls.hold():  # PollsFull: a 503 that still advertises the long-poll
                page = await self._held(page, seen, wait, read, gone)
        nodes, edges, until, more = page
        return ChangesResponse(since=since_echo(since), until=until, memory_nodes=nodes,
                               memory_edges=edges, store_id=hub.store_id, has_more=more,
                               feed="ingest"), offered

    async def _held(self, page: Page, seen: int, wait: float,
                    read: Callable[[], Awaitable[Page]], gone: Callable[[], bool]) -> Page:
        """``read`` (the feed) again after each commit past generation ``seen``, until it has
        rows, ``wait`` seconds pass, the app stops or the client is gone; the last page read."""
        hub, polls = self.hub, self.polls
        deadline = time.monotonic() + wait
        while not (polls.released or hub.commits.closed) and not gone():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if not await hub.commits.wait(seen, min(left, GONE_CHECK_SECS)) or polls.released:
                continue  # a slice with no commit: is the client still there?
            seen = hub.commits.generation
            page = await read()
            if _has_rows(page):
                break
        return page


def _has_rows(page: Page) -> bool:
    nodes, edges, _, more = page
    return bool(nodes or edges or more)


class HubMemory:
    """The hub's ``MemoryApi`` (``syncd/http/routes.py``) over its ``HubStore``."""

    markdown_export = False

    def __init__(self, hub: HubStore, *, cursor: str, polls: HeldPolls) -> None:
        self.hub, self.cursor, self.polls = hub, cursor, polls
        self.feed: IngestFeed | None = HubFeed(hub, polls) if cursor == "ingest" else None
        self.pager: Pager | None = self._export_page

    @property
    def store_id(self) -> str:
        return self.hub.store_id

    async def recall(self, query: QueryRequest) -> QueryResponse:
        for name in _NUL_LISTS:
            if any("\x00" in value for value in getattr(query, name)):
                raise ValidationError(name, NUL_MESSAGE)
        for name in _NUL_TEXTS:
            if "\x00" in (getattr(query, name) or ""):
                raise ValidationError(name, NUL_MESSAGE)
        answer = await self.hub.recall(query)
        await self.hub.usage.surfaced([(m.id, m.realm or "") for m in answer.memories])
        return msgspec.structs.replace(answer, precedent=None)  # the plane's key, none found

    def export_snapshot(self, realm: str | None) -> AbstractAsyncContextManager[ExportPages]:
        return self.hub.export_snapshot(realm)

    async def _export_page(self, cursor: str, limit: int, realm: str | None) -> ExportBody:
        nodes, edges, last, more = await self.hub.export_page(cursor, limit=limit, realm=realm)
        return ExportBody(memory_nodes=nodes, memory_edges=edges, hint=EXPORT_HINT,
                          store_id=self.hub.store_id, has_more=more, next_cursor=last)

    @asynccontextmanager
    async def changes_stream(self, since: str, realm: str | None) -> AsyncIterator[RowStream]:
        """Origin mode: streamed; ``until`` after the rows, as the plane."""
        hub = self.hub
        async with hub.changes_snapshot(since, realm, edge_version="created_at") as snapshot:
            yield RowStream(snapshot, head={"since": since_echo(since)}, tail=lambda: {
                "until": format_ns(hub.now_ns()), "store_id": hub.store_id})

    async def apply(self, nodes: Sequence[NodeRow], edges: Sequence[EdgeRow]) -> ApplyResult:
        return await self.hub.apply(nodes, edges, model=self.hub.embedder.model_id)

    async def settings(self) -> object:
        return msgspec.structs.replace(await self.hub.settings(),
                                       embedding_model=self.hub.embedder.model_id)

    async def put_settings(self, body: dict[str, Any], *, page: bool) -> object:
        """The page's patch, answered as ``GET``; a bearer token's replace (rules)."""
        if page:
            return msgspec.structs.replace(await self.hub.put_settings(body),
                                           embedding_model=self.hub.embedder.model_id)
        try:
            replaced = replace_settings(strip_json_object(body))  # redacted before any echo
        except msgspec.ValidationError as exc:
            raise ValidationError(msgspec_field(str(exc)), str(exc)) from None
        await self.hub.put_settings(msgspec.to_builtins(replaced))  # every key: nothing merges
        return {"ok": True}

    async def status(self) -> dict[str, Any]:
        hub, polls = self.hub, self.polls
        long_poll = {"max_wait_secs": MAX_WAIT_SECS, "held": polls.held, "max_held": polls.cap,
                     "refused": polls.refused} if self.feed is not None and polls.cap else None
        stats = await hub.stats()
        return {"version": __version__, "role": "hub", "store": hub.kind,
                "store_id": hub.store_id, "cursor": self.cursor,
                "embedding_model": hub.embedder.model_id, "long_poll": long_poll,
                **{key: stats.get(key) for key in STATUS_COUNTS}}

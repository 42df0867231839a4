"""The routes the daemon and the hub both serve — the plane's ``query``, ``export``, ``changes``,
``import`` and ``settings``, and ``status``, ``healthz`` — one handler each: it decodes, makes one
call on the app's ``MemoryApi`` and encodes.

Rules:
  * What differs between the daemon and the hub goes through the ``MemoryApi`` under ``MEMORY``:
    the daemon's is ``LocalMemory`` (``syncd/http/app.py``), the hub's ``HubMemory``
    (``syncd/hub/memory.py``). Credentials, the Host allow-list and the hub's roles are the
    apps' middlewares, never these handlers'.
  * ``export``: ``format=json|markdown`` where the backend serves Markdown (the daemon), pages
    (``limit``, ``cursor``; ``has_more``/``next_cursor`` in the body) where it has a ``pager``
    (the hub); otherwise every row, streamed a page at a time (``wire.stream_rows``). A
    parameter a backend does not serve is ignored, as the plane ignores unknown ones.
  * ``changes``: the backend's ingest feed where it has one (the hub's: a page, held as a
    long-poll when asked, ``syncd/hub/memory.py``); else an origin-stamped snapshot, streamed,
    with the members the backend puts before and after the rows (where ``until`` is read,
    before or after the rows, is the backend's rule).
  * ``PUT settings``: the body must be a JSON object; the backend is told whether the page's
    session sent it (the hub's page patches, its bearer tokens replace).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

from local_store import ValidationError
from local_store.apply import ApplyResult
from local_store.exporting import ExportPages
from local_store.redact import quoted
from protocol.query import QueryRequest
from protocol.rows import EXPORT_COUNT_HEADERS, ChangesResponse, EdgeRow, ExportBody, NodeRow
from syncd.export_markdown import markdown_pages
from syncd.http.web import SESSION_KEY
from syncd.http.wire import (
    EXPORT_HINT,
    import_result,
    json_object,
    read_import,
    read_json,
    read_typed,
    reply,
    stream_rows,
    stream_text,
)

EXPORT_FORMATS = ("json", "markdown")
EPOCH = "1970-01-01T00:00:00Z"
MAX_PAGE = 10_000


@dataclass(frozen=True, slots=True)
class RowStream:
    """An origin-stamped ``changes`` answer: its rows, the members before them, and a call for
    the members after them (made once the rows are out)."""

    snapshot: ExportPages
    head: Mapping[str, object]
    tail: Callable[[], Mapping[str, object]]


class IngestFeed(Protocol):
    async def page(self, since: str, realm: str | None, query: Mapping[str, str], *,
                   gone: Callable[[], bool]) -> tuple[ChangesResponse, Mapping[str, str]]:
        """The feed's page after ``since`` and the headers to answer it with; ``query`` holds
        the feed's own parameters, ``gone`` says whether the client hung up."""
        ...


Pager = Callable[[str, int, str | None], Awaitable[ExportBody]]  # (cursor, limit, realm)


class MemoryApi(Protocol):
    """What the shared routes call (rules)."""

    @property
    def store_id(self) -> str: ...

    markdown_export: bool
    pager: Pager | None  # export in pages (``limit``, ``cursor``); None: every row, streamed
    feed: IngestFeed | None

    async def recall(self, query: QueryRequest) -> object: ...

    def export_snapshot(self, realm: str | None) -> AbstractAsyncContextManager[ExportPages]: ...

    def changes_stream(self, since: str,
                       realm: str | None) -> AbstractAsyncContextManager[RowStream]: ...

    async def apply(self, nodes: Sequence[NodeRow], edges: Sequence[EdgeRow]) -> ApplyResult: ...

    async def settings(self) -> object: ...

    async def put_settings(self, body: dict[str, Any], *, page: bool) -> object: ...

    async def status(self) -> dict[str, Any]: ...


MEMORY: web.AppKey[MemoryApi] = web.AppKey("memory")


def since_echo(since: str) -> str:
    """``since`` as a ``changes`` answer repeats it (empty: the epoch)."""
    return since.strip() or EPOCH


def page_limit(query: Mapping[str, str]) -> int | None:
    """``limit=1..MAX_PAGE``, or None when not given."""
    raw = query.get("limit")
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValidationError("limit", f"must be an integer, got {quoted(raw)}") from None
    if not 1 <= value <= MAX_PAGE:
        raise ValidationError("limit", f"must be 1..{MAX_PAGE}, got {value}")
    return value


async def query(request: web.Request) -> web.Response:
    body = await read_typed(request, QueryRequest)
    return reply(await request.app[MEMORY].recall(body))


async def export(request: web.Request) -> web.StreamResponse:
    memory, realm = request.app[MEMORY], request.query.get("realm")
    form = _export_format(request.query) if memory.markdown_export else "json"
    limit = page_limit(request.query) if memory.pager is not None else None
    if memory.pager is not None and limit is not None:
        return reply(await memory.pager(request.query.get("cursor", "0"), limit, realm))
    async with memory.export_snapshot(realm) as snapshot:
        if form == "markdown":
            memories, edges = EXPORT_COUNT_HEADERS
            return await stream_text(request, markdown_pages(snapshot, realm), {
                "Content-Type": "text/markdown; charset=utf-8",
                memories: str(snapshot.memories), edges: str(snapshot.edges)})
        return await stream_rows(request, snapshot, tail=lambda: {
            "hint": EXPORT_HINT, "store_id": memory.store_id})


def _export_format(query: Mapping[str, str]) -> str:
    form = query.get("format", "json")
    if form not in EXPORT_FORMATS:
        raise ValidationError("format", f"must be one of {', '.join(EXPORT_FORMATS)} (got "
                              f"{form[:40]!r})")
    return form


async def changes(request: web.Request) -> web.StreamResponse:
    memory = request.app[MEMORY]
    since, realm = request.query.get("since", ""), request.query.get("realm")
    if memory.feed is not None:
        page, headers = await memory.feed.page(since, realm, request.query,
                                               gone=lambda: request.transport is None)
        response = reply(page)
        response.headers.update(headers)
        return response
    async with memory.changes_stream(since, realm) as rows:
        return await stream_rows(request, rows.snapshot, head=rows.head, tail=rows.tail)


async def import_rows(request: web.Request) -> web.Response:
    body = await read_import(request)
    result = await request.app[MEMORY].apply(body.memory_nodes, body.memory_edges)
    return reply(import_result(result))


async def get_settings(request: web.Request) -> web.Response:
    return reply(await request.app[MEMORY].settings())


async def put_settings(request: web.Request) -> web.Response:
    body = json_object(await read_json(request))
    return reply(await request.app[MEMORY].put_settings(
        body, page=request.get(SESSION_KEY) is not None))


async def status(request: web.Request) -> web.Response:
    return reply(await request.app[MEMORY].status())


async def healthz(request: web.Request) -> web.Response:
    return reply({"ok": True})


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ROUTES: list[tuple[str, str, Handler]] = [
    ("POST", "/v1/agent/memory/query", query),
    ("GET", "/v1/agent/memory/export", export),
    ("GET", "/v1/agent/memory/changes", changes),
    ("POST", "/v1/agent/memory/import", import_rows),
    ("GET", "/v1/agent/memory/settings", get_settings),
    ("PUT", "/v1/agent/memory/settings", put_settings),
    ("GET", "/v1/agent/status", status),
    ("GET", "/healthz", healthz),
]

"""``create_app``: the local API — the plane's memory routes (``routes.py``, shared with the
hub, over ``LocalMemory``), every tool as a route, items, sync, health and metrics, behind the
guards in ``security.py``. Handlers hold no SQL and no business branching: they decode, make
one store (or tool) call, and encode.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Protocol

import msgspec
from aiohttp import web

from local_store import Store, ValidationError
from local_store.apply import ApplyResult
from local_store.exporting import ExportPages
from local_store.redact import strip_private
from protocol.query import QueryRequest
from protocol.rows import EdgeRow, NodeRow
from protocol.timestamp import format_ns
from syncd import __version__
from syncd.config import DEFAULT_CONTROL_PLANE_EMBEDDING_MODEL, DEFAULT_MAX_BODY_BYTES
from syncd.entitlement.keeper import Keeper
from syncd.http.errors import (
    NoDaemon,
    NoGate,
    RouteNotFound,
    SyncNotConfigured,
    errors_middleware,
)
from syncd.http.metrics import Metrics, store_gauges
from syncd.http.routes import MEMORY, IngestFeed, Pager, RowStream, since_echo
from syncd.http.routes import ROUTES as SHARED_ROUTES
from syncd.http.security import guards
from syncd.http.web import ROUTES as WEB_ROUTES
from syncd.http.web import SESSIONS, Sessions
from syncd.http.wire import EXPORT_HINT, json_object, read_json, reply
from syncd.mcp import INVALID_REQUEST, SUPPORTED_PROTOCOL_VERSIONS, McpServer
from syncd.mcp import error_response as rpc_error
from syncd.sync.runner import SyncRunner
from syncd.tools import TOOLS, Surfacer

__all__ = ["EXPORT_HINT", "MCP", "METRICS", "create_app", "errors_middleware", "mcp"]
STORE = web.AppKey("store", Store)
SURFACER = web.AppKey("surfacer", Surfacer)
METRICS = web.AppKey("metrics", Metrics)


class McpHandler(Protocol):
    """What serves ``/mcp/v1``: an ``McpServer``, or the PostgreSQL hub's ``CopyMcp``."""

    async def handle_bytes(self, body: bytes) -> bytes | None: ...


MCP: web.AppKey[McpHandler] = web.AppKey("mcp")
STOP: web.AppKey[Callable[[], None] | None] = web.AppKey("stop")  # ``shutdown``'s
SYNC: web.AppKey[SyncRunner | None] = web.AppKey("sync")
KEEPER: web.AppKey[Keeper | None] = web.AppKey("keeper")

MCP_VERSION_HEADER = "MCP-Protocol-Version"


def create_app(store: Store, *, token: str, extra_hosts: tuple[str, ...] = (),
               max_body: int = DEFAULT_MAX_BODY_BYTES,
               plane_model: str = DEFAULT_CONTROL_PLANE_EMBEDDING_MODEL,
               mcp: McpHandler | bool = True, sync: SyncRunner | None = None,
               keeper: Keeper | None = None,
               stop: Callable[[], None] | None = None) -> web.Application:
    """``mcp=True`` serves ``/mcp/v1`` with the same tool surfacer as the tool routes (so a
    conversation's surfaced memories are shared); pass a server to use it, False for none.
    ``stop``: what ``POST /v1/agent/shutdown`` calls (the daemon's clean stop; without it the
    route answers 501)."""
    metrics = Metrics()
    app = web.Application(client_max_size=max_body, middlewares=[
        metrics.middleware(), errors_middleware, guards(token, extra_hosts)])
    app[STORE], app[SURFACER], app[METRICS] = store, Surfacer(), metrics
    app[MEMORY] = LocalMemory(store, plane_model=plane_model, sync=sync, keeper=keeper)
    app[SYNC], app[KEEPER], app[STOP] = sync, keeper, stop
    if mcp is True:
        mcp = McpServer(store, app[SURFACER])
    if mcp is not False:
        app[MCP] = mcp
    for method, path, handler in ROUTES:
        if path == "/mcp/v1" and mcp is False:
            continue
        app.router.add_route(method, path, handler)
    app[SESSIONS] = Sessions()
    for method, path, page in WEB_ROUTES:
        app.router.add_route(method, path, page)
    return app


class LocalMemory:
    """The daemon's side of the shared routes (``routes.py``): its store; imports embedded as
    the plane's model says; Markdown export, no pages, no ingest feed; ``changes`` reads
    ``until`` before the snapshot, so a pull from it sees every version stamped later. Like the
    plane's, this cursor has holes (contract §4.3): a version stamped before ``until`` but
    committed after the snapshot began, and a pulled row keeping an old origin stamp. syncd's
    own replication follows the hub's ingest feed instead, which has neither."""

    markdown_export: bool = True
    pager: Pager | None = None
    feed: IngestFeed | None = None

    def __init__(self, store: Store, *, plane_model: str, sync: SyncRunner | None,
                 keeper: Keeper | None) -> None:
        self.store, self.plane_model, self.sync, self.keeper = store, plane_model, sync, keeper

    @property
    def store_id(self) -> str:
        return self.store.store_id

    async def recall(self, query: QueryRequest) -> object:
        return await self.store.recall.query(query)

    def export_snapshot(self, realm: str | None) -> AbstractAsyncContextManager[ExportPages]:
        return self.store.feed.snapshot(realm)

    @asynccontextmanager
    async def changes_stream(self, since: str, realm: str | None) -> AsyncIterator[RowStream]:
        until = format_ns(self.store.clock.physical_ns())
        async with self.store.feed.snapshot(realm, since=since, include_deleted=True) as snapshot:
            yield RowStream(snapshot, head={"since": since_echo(since), "until": until},
                            tail=lambda: {"store_id": self.store.store_id})

    async def apply(self, nodes: Sequence[NodeRow], edges: Sequence[EdgeRow]) -> ApplyResult:
        return await self.store.replication.apply(nodes, edges, model=self.plane_model)

    async def settings(self) -> object:
        return self.store.settings.current

    async def put_settings(self, body: dict[str, Any], *, page: bool) -> object:
        return await self.store.settings.put(body)

    async def status(self) -> dict[str, Any]:
        store = self.store
        stats = await store.maintenance.stats()
        sync = await self.sync.status() if self.sync is not None else {"configured": False}
        return {"version": __version__, "data_dir": str(store.data_dir),
                "store_id": store.store_id, "replica_id": store.replica_id,
                "embedder": store.embedder.model_id, "embedder_error": store.embedder_error,
                "indexed_vectors": await store.maintenance.indexed_vectors(),
                **stats, **_conflict_summary(await store.versions.conflicts(limit=5)),
                "sync": sync, "entitlement": _entitlement(self.keeper)}


# ---------------------------------------------------------------------- handlers

async def tool(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in TOOLS:  # a route that does not exist, not a bad argument
        raise RouteNotFound(f"no tool {strip_private(name)[:80]!r}")
    args = json_object(await read_json(request))
    return reply(await request.app[SURFACER].call(request.app[STORE], name, args))


async def get_item(request: web.Request) -> web.Response:
    return reply(await request.app[STORE].memories.get(request.match_info["id"]))


async def edit_item(request: web.Request) -> web.Response:
    """An edit of a memory's content, title, tags or importance (``Store.edit``)."""
    return reply(await request.app[STORE].memories.edit(request.match_info["id"],
                                               await read_json(request)))


async def delete_item(request: web.Request) -> web.Response:
    hard = request.query.get("hard", "false").lower()
    if hard not in ("true", "false", "1", "0"):
        raise ValidationError("hard", "must be true or false")
    return reply(await request.app[STORE].memories.delete(request.match_info["id"],
                                                  hard=hard in ("true", "1")))


async def item_versions(request: web.Request) -> web.Response:
    return reply(await request.app[STORE].versions.history(request.match_info["id"]))


async def restore_version(request: web.Request) -> web.Response:
    """Make version ``n`` current, as a new edit (it syncs). No body needed."""
    return reply(await request.app[STORE].versions.restore(request.match_info["id"],
                                                          request.match_info["n"]))


async def dismiss_version(request: web.Request) -> web.Response:
    """Mark conflict ``n`` reviewed; the memory is unchanged."""
    return reply(await request.app[STORE].versions.dismiss(request.match_info["id"],
                                                          request.match_info["n"]))


def _conflict_summary(conflicts: dict[str, Any]) -> dict[str, Any]:
    """Unreviewed conflict versions: their count, and the memories of the newest few."""
    ids = list(dict.fromkeys(item["memory_id"] for item in conflicts["items"]))
    return {"conflicts": conflicts["count"], "conflict_memories": ids}


def _entitlement(keeper: Keeper | None) -> dict[str, Any] | None:
    return None if keeper is None else keeper.status()


async def sync_status(request: web.Request) -> web.Response:
    """The sync loop's state, plus ``conflicts``: how many conflict versions nobody has
    reviewed yet, and ``conflict_versions``, the newest of them (``Store.conflicts``)."""
    runner = request.app[SYNC]
    conflicts = await request.app[STORE].versions.conflicts()
    review = {"conflicts": conflicts["count"], "conflict_versions": conflicts["items"]}
    if runner is None:
        return reply({"configured": False, "entitlement": _entitlement(request.app[KEEPER]),
                      "reason": "no control plane: set control_plane.url to sync", **review})
    return reply({**await runner.status(), "entitlement": _entitlement(request.app[KEEPER]), **review})


async def entitlement_check(request: web.Request) -> web.Response:
    """Re-read the licence and token files now (and fetch a token if a plane is set)."""
    keeper = request.app[KEEPER]
    if keeper is None:
        raise NoGate("this server has no entitlement gate")
    await keeper.check()
    return reply(_entitlement(request.app[KEEPER]))


async def sync_run(request: web.Request) -> web.Response:
    runner = request.app[SYNC]
    if runner is None:
        raise SyncNotConfigured("no control plane: set control_plane.url to sync")
    keeper = request.app[KEEPER]
    gate = runner.engine.gate
    if keeper is not None and gate is not None and gate() is not None:
        await keeper.check()  # paused: try to get entitled first
    report = await runner.run_now()
    return reply(report.as_dict())


async def shutdown(request: web.Request) -> web.Response:
    """``syncd stop``: the daemon's clean stop (in-flight requests drain, the state file goes),
    answered before it starts. syncd's own route, behind the token like every other."""
    stop = request.app[STOP]
    if stop is None:
        raise NoDaemon("this server has no daemon to stop")
    stop()
    return reply({"stopping": True}, status=202)


async def metrics(request: web.Request) -> web.Response:
    """Prometheus text (``metrics.py``), behind the token like every data route."""
    store = request.app[STORE]
    return request.app[METRICS].page(store_gauges(await store.maintenance.stats(), await store.maintenance.disk_bytes()))


def _initializing(body: bytes) -> bool:
    """Whether a JSON-RPC body is an ``initialize`` request (alone or in a batch)."""
    try:
        message = msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError):
        return False
    messages = message if isinstance(message, list) else [message]
    return any(isinstance(m, dict) and m.get("method") == "initialize" for m in messages)


async def mcp(request: web.Request) -> web.Response:
    """JSON-RPC over HTTP: a body that is not JSON is JSON-RPC's own Parse error (-32700,
    ``id`` null), as on stdio, not the REST error shape. An ``MCP-Protocol-Version`` header
    naming a version this server does not speak is a 400 (Streamable HTTP), its body a
    JSON-RPC error too; no header is fine (clients before 2025-06-18 send none)."""
    version = request.headers.get(MCP_VERSION_HEADER)
    body = await request.read()
    if version is not None and version not in SUPPORTED_PROTOCOL_VERSIONS and not (
            _initializing(body)):  # ``initialize`` negotiates the version itself
        return reply(rpc_error(None, INVALID_REQUEST, f"Bad Request: unsupported "
                               f"{MCP_VERSION_HEADER}; this server speaks "
                               f"{', '.join(SUPPORTED_PROTOCOL_VERSIONS)}"), status=400)
    server = request.app[MCP]
    answer = await server.handle_bytes(body)
    if answer is None:
        return web.Response(status=202)
    return web.Response(body=answer, content_type="application/json")


ROUTES: list[tuple[str, str, Callable[[web.Request], Awaitable[web.StreamResponse]]]] = [
    *SHARED_ROUTES,
    ("POST", "/v1/agent/memory/tools/{name}", tool),
    ("GET", "/v1/agent/memory/items/{id}", get_item),
    ("PATCH", "/v1/agent/memory/items/{id}", edit_item),
    ("DELETE", "/v1/agent/memory/items/{id}", delete_item),
    ("GET", "/v1/agent/memory/items/{id}/versions", item_versions),
    ("POST", "/v1/agent/memory/items/{id}/versions/{n}/restore", restore_version),
    ("POST", "/v1/agent/memory/items/{id}/versions/{n}/dismiss", dismiss_version),
    ("GET", "/v1/agent/sync/status", sync_status),
    ("POST", "/v1/agent/sync/run", sync_run),
    ("POST", "/v1/agent/entitlement/check", entitlement_check),
    ("POST", "/v1/agent/shutdown", shutdown),
    ("GET", "/metrics", metrics),
    ("POST", "/mcp/v1", mcp),
]


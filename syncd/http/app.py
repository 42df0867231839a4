"""``create_app``: the local API — the plane's memory routes, every tool as a route, items,
health and metrics, behind the guards in ``security.py``. Handlers hold no SQL and no business
branching: they decode, make one store (or tool) call, and encode.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import msgspec
from aiohttp import web

from local_store import Store, StoreError, ValidationError
from local_store.apply import ApplyResult
from local_store.arguments import msgspec_field
from local_store.exporting import ExportPages
from local_store.redact import holds_lone_surrogate, strip_private
from protocol.query import QueryRequest
from protocol.rows import (
    EXPORT_COUNT_HEADERS,
    ImportRequest,
    ImportResult,
    RowError,
)
from protocol.timestamp import format_ns
from syncd import __version__
from syncd.entitlement.keeper import KeeperStopped
from syncd.export_markdown import markdown_pages
from syncd.http.errors import STORE_STATUS, HttpError, error_response
from syncd.http.metrics import Metrics, store_gauges
from syncd.http.security import guards
from syncd.http.web import ROUTES as WEB_ROUTES
from syncd.http.web import SESSIONS, Sessions
from syncd.mcp import INVALID_REQUEST, SUPPORTED_PROTOCOL_VERSIONS, McpServer
from syncd.mcp import error_response as rpc_error
from syncd.tools import TOOLS, Surfacer

log = logging.getLogger("syncd.http")
STORE = web.AppKey("store", Store)
SURFACER = web.AppKey("surfacer", Surfacer)
METRICS = web.AppKey("metrics", Metrics)
PLANE_MODEL = web.AppKey("plane_model", str)
MCP = web.AppKey("mcp", object)
STOP = web.AppKey("stop", object)  # the daemon's stop, or None (``shutdown``)
SYNC = web.AppKey("sync", object)  # a syncd.sync.runner.SyncRunner, or None
KEEPER = web.AppKey("keeper", object)  # a syncd.entitlement.keeper.Keeper, or None

DEFAULT_MAX_BODY = 4 * 1024 * 1024
EXPORT_HINT = ("Re-import on another instance via POST /v1/agent/memory/import with this same "
               "{memory_nodes, memory_edges} body.")
MCP_VERSION_HEADER = "MCP-Protocol-Version"
_encoder = msgspec.json.Encoder()


def create_app(store: Store, *, token: str, extra_hosts: tuple[str, ...] = (),
               max_body: int = DEFAULT_MAX_BODY, plane_model: str = "bge-small-en-v1.5",
               mcp: Any = True, sync: Any = None, keeper: Any = None,
               stop: Callable[[], None] | None = None) -> web.Application:
    """``mcp=True`` serves ``/mcp/v1`` with the same tool surfacer as the tool routes (so a
    conversation's surfaced memories are shared); pass a server to use it, False for none.
    ``stop``: what ``POST /v1/agent/shutdown`` calls (the daemon's clean stop; without it the
    route answers 501)."""
    metrics = Metrics()
    app = web.Application(client_max_size=max_body, middlewares=[
        metrics.middleware(), errors_middleware, guards(token, extra_hosts)])
    app[STORE], app[SURFACER], app[METRICS], app[PLANE_MODEL] = store, Surfacer(), metrics, \
        plane_model
    app[SYNC] = sync
    app[KEEPER] = keeper
    app[STOP] = stop
    if mcp is True:
        mcp = McpServer(store, app[SURFACER])
    if mcp:
        app[MCP] = mcp
    for method, path, handler in ROUTES:
        if path == "/mcp/v1" and not mcp:
            continue
        app.router.add_route(method, path, handler)
    app[SESSIONS] = Sessions()
    for method, path, page in WEB_ROUTES:
        app.router.add_route(method, path, page)
    return app


# ---------------------------------------------------------------------- plumbing

@web.middleware
async def errors_middleware(request: web.Request,
                  handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
                  ) -> web.StreamResponse:
    """Render every failure in the one error shape."""
    try:
        return await handler(request)
    except HttpError as exc:
        return error_response(exc.status, exc.code, exc.message, exc.field)
    except ValidationError as exc:
        return error_response(422, exc.code, exc.message, exc.field)
    except StoreError as exc:
        return error_response(STORE_STATUS.get(exc.code, 500), exc.code, exc.message,
                              getattr(exc, "field", None))  # not found: the id's argument
    except KeeperStopped as exc:
        return error_response(503, "stopping", str(exc))
    except web.HTTPRequestEntityTooLarge:
        return error_response(413, "too_large", f"request body over {request.app._client_max_size}"
                              " bytes")
    except web.HTTPException as exc:
        if exc.status == 405:
            return error_response(405, "method_not_allowed", f"{request.method} not allowed here")
        if exc.status == 404:
            return error_response(404, "not_found", f"no route {shown_path(request)}")
        return error_response(exc.status, "http_error", exc.reason)
    except Exception:
        log.exception("%s %s failed", request.method, shown_path(request))
        return error_response(500, "internal", "internal error; the daemon's log has the details")


def shown_path(request: web.Request, limit: int = 200) -> str:
    """The request's path fit for a message or a log line: redacted (a path can hold an id or a
    name the client chose, so a ``<private>`` span), control characters escaped (a decoded
    ``%0a`` would otherwise start a forged log line: a newline is shown as ``\\n``), then
    shortened."""
    return _CONTROL.sub(_escaped, strip_private(request.path))[:limit]


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")  # C0, DEL, C1, line separators


def _escaped(found: re.Match[str]) -> str:
    return found.group().encode("unicode_escape").decode("ascii")  # "\n" → "\\n"


async def read_json(request: web.Request) -> Any:
    raw = await request.read()
    if not raw:
        raise HttpError(400, "bad_json", "request body is empty; send a JSON object")
    try:  # UTF-8 only (RFC 8259), strictly: no surrogate can arrive as raw bytes
        value = json.loads(raw.decode("utf-8"), parse_constant=_not_json)
    except RecursionError:
        raise HttpError(400, "bad_json", "malformed JSON: nested too deeply") from None
    except ValueError as exc:
        raise HttpError(400, "bad_json", f"malformed JSON: {exc}") from None
    if _SURROGATE_ESCAPE.search(raw) and holds_lone_surrogate(value):
        raise HttpError(400, "bad_json", "malformed JSON: a lone surrogate escape "
                        "(\\ud800-\\udfff without its pair) is not text")
    return value


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _not_json(name: str) -> Any:
    """Python's ``json`` reads ``NaN`` and ``Infinity``; JSON has neither."""
    raise ValueError(f"{name} is not a JSON value")


async def read_typed(request: web.Request, kind: type[Any]) -> Any:
    return _typed(await read_json(request), kind)


def _typed(body: Any, kind: type[Any]) -> Any:
    try:
        return msgspec.convert(body, kind)
    except msgspec.ValidationError as exc:
        raise ValidationError(msgspec_field(str(exc)), str(exc)) from None


IMPORT_FIELDS = ("memory_nodes", "memory_edges")


async def read_import(request: web.Request) -> ImportRequest:
    """An import body, which must hold ``memory_nodes`` or ``memory_edges`` (or both): an
    object with neither (the wrong file, a misspelt key) would apply nothing and answer 200.
    The daemon and the hub refuse it alike; Kyma's plane takes it (contract §4.4), but no
    syncd client sends one (the push names both lists, ``syncd import`` refuses such a file)."""
    body = await read_json(request)
    if isinstance(body, dict) and not any(name in body for name in IMPORT_FIELDS):
        raise ValidationError(", ".join(IMPORT_FIELDS),
                              "the body holds neither memory_nodes nor memory_edges: give "
                              "either list of rows, or both")
    result: ImportRequest = _typed(body, ImportRequest)
    return result


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ValidationError("body", "must be a JSON object")
    return body


def reply(value: Any, status: int = 200) -> web.Response:
    return web.Response(body=_encoder.encode(value), status=status,
                        content_type="application/json")


# ---------------------------------------------------------------------- handlers

async def query(request: web.Request) -> web.Response:
    req = await read_typed(request, QueryRequest)
    return reply(await request.app[STORE].recall.query(req))


EXPORT_FORMATS = ("json", "markdown")


async def export(request: web.Request) -> web.StreamResponse:
    store = request.app[STORE]
    form = request.query.get("format", "json")
    if form not in EXPORT_FORMATS:
        raise ValidationError("format", f"must be one of {', '.join(EXPORT_FORMATS)} (got "
                              f"{form[:40]!r})")
    realm = request.query.get("realm")
    async with store.feed.snapshot(realm) as snapshot:
        if form == "markdown":
            memories, edges = EXPORT_COUNT_HEADERS
            return await stream_text(request, markdown_pages(snapshot, realm), {
                "Content-Type": "text/markdown; charset=utf-8",
                memories: str(snapshot.memories), edges: str(snapshot.edges)})
        return await stream_rows(request, snapshot, tail=lambda: {
            "hint": EXPORT_HINT, "store_id": store.store_id})


async def stream_text(request: web.Request, pieces: AsyncIterator[str],
                      headers: Mapping[str, str]) -> web.StreamResponse:
    """A text body streamed a piece at a time (``streamed``'s rules)."""
    async def body(response: web.StreamResponse) -> None:
        async for piece in pieces:
            await response.write(piece.encode())
    return await streamed(request, headers, body)


async def stream_rows(request: web.Request, snapshot: ExportPages, *,
                      head: Mapping[str, object] | None = None,
                      tail: Callable[[], Mapping[str, object]]) -> web.StreamResponse:
    """A body of the plane's rows (export, ``changes``), streamed a page at a time, so memory
    stays bounded by a page whatever the store's size: ``head``'s members, ``memory_nodes``,
    ``memory_edges``, then ``tail()``'s members (called once the rows are out, so an ``until``
    there is read after them). ``X-Syncd-Memories``/``X-Syncd-Edges`` give the counts up
    front."""
    memories, edges = EXPORT_COUNT_HEADERS

    async def body(response: web.StreamResponse) -> None:
        opening = b"{" + b"".join(_member(k, v) + b"," for k, v in (head or {}).items())
        await _write_array(response, opening + b'"memory_nodes":[', snapshot.node_pages())
        await _write_array(response, b'],"memory_edges":[', snapshot.edge_pages())
        await response.write(b"]" + b"".join(b"," + _member(k, v) for k, v in tail().items())
                             + b"}")
    return await streamed(request, {"Content-Type": "application/json",
                                    memories: str(snapshot.memories),
                                    edges: str(snapshot.edges)}, body)


async def streamed(request: web.Request, headers: Mapping[str, str],
                   body: Callable[[web.StreamResponse], Awaitable[None]]) -> web.StreamResponse:
    """An answer whose ``body`` writes it as it goes. A failure once the body has begun cannot
    become an error answer: the connection is dropped, so the client sees a truncated body,
    never a short complete-looking one."""
    response = web.StreamResponse(headers=headers)
    await response.prepare(request)
    try:
        await body(response)
    except ConnectionError:  # the client hung up (aiohttp's ClientConnectionResetError too)
        log.debug("the client went away during a streamed answer")
        return response
    except Exception:
        log.exception("a streamed answer failed after it began; dropping the connection")
        if request.transport is not None:
            request.transport.abort()
        return response
    await response.write_eof()
    return response


def _member(key: str, value: object) -> bytes:
    return _encoder.encode(key) + b":" + _encoder.encode(value)


async def _write_array(response: web.StreamResponse, opening: bytes,
                       pages: AsyncIterator[Sequence[Any]]) -> None:
    """``opening`` then the pages' rows, comma-separated (the array's closing bracket is the
    caller's, with what follows it)."""
    separator = b""
    await response.write(opening)
    async for page in pages:
        if page:
            await response.write(separator + b",".join(_encoder.encode(row) for row in page))
            separator = b","


async def changes(request: web.Request) -> web.StreamResponse:
    """The plane's ``changes?since=``, streamed (``stream_rows``). ``until`` is read before the
    snapshot, so a pull from it sees every version stamped later. Like the plane's, this
    cursor has holes (contract §4.3): a version stamped before ``until`` but committed after
    the snapshot began, and a pulled row keeping an old origin stamp. syncd's own replication
    follows the hub's ingest feed instead, which has neither."""
    store = request.app[STORE]
    since = request.query.get("since", "")
    until = format_ns(store.clock.physical_ns())
    async with store.feed.snapshot(request.query.get("realm"), since=since, include_deleted=True) as snapshot:
        return await stream_rows(
            request, snapshot, head={"since": since.strip() or "1970-01-01T00:00:00Z",
                                     "until": until},
            tail=lambda: {"store_id": store.store_id})


async def import_rows(request: web.Request) -> web.Response:
    body = await read_import(request)
    result = await request.app[STORE].replication.apply(body.memory_nodes, body.memory_edges,
                                            model=request.app[PLANE_MODEL])
    return reply(import_result(result))


def import_result(result: ApplyResult) -> ImportResult:
    """The plane's import answer, with syncd's per-row errors (``row_errors``)."""
    problems = [RowError(kind=p.kind, index=p.index, id=p.id, field=p.field, message=p.message)
                for p in result.problems]
    return ImportResult(
        applied_nodes=result.applied_nodes, applied_edges=result.applied_edges,
        errors=[f"{p.kind}s[{p.index}].{p.field}: {p.message}" for p in problems],
        row_errors=problems or None)


async def get_settings(request: web.Request) -> web.Response:
    return reply(request.app[STORE].settings.current)


async def put_settings(request: web.Request) -> web.Response:
    patch = _object(await read_json(request))
    return reply(await request.app[STORE].settings.put(patch))


async def tool(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in TOOLS:  # a route that does not exist, not a bad argument
        raise HttpError(404, "not_found", f"no tool {strip_private(name)[:80]!r}")
    args = _object(await read_json(request))
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


async def status(request: web.Request) -> web.Response:
    store = request.app[STORE]
    stats = await store.maintenance.stats()
    runner = request.app[SYNC]
    sync = await runner.status() if runner is not None else {  # type: ignore[attr-defined]
        "configured": False}
    return reply({"version": __version__, "data_dir": str(store.data_dir),
                   "store_id": store.store_id, "replica_id": store.replica_id,
                   "embedder": store.embedder.model_id, "embedder_error": store.embedder_error,
                   "indexed_vectors": len(store.index),
                   **stats, **_conflict_summary(await store.versions.conflicts(limit=5)),
                   "sync": sync, "entitlement": _entitlement(request)})


def _conflict_summary(conflicts: dict[str, Any]) -> dict[str, Any]:
    """Unreviewed conflict versions: their count, and the memories of the newest few."""
    ids = list(dict.fromkeys(item["memory_id"] for item in conflicts["items"]))
    return {"conflicts": conflicts["count"], "conflict_memories": ids}


def _entitlement(request: web.Request) -> dict[str, Any] | None:
    keeper = request.app[KEEPER]
    return None if keeper is None else keeper.status()  # type: ignore[attr-defined]


async def sync_status(request: web.Request) -> web.Response:
    """The sync loop's state, plus ``conflicts``: how many conflict versions nobody has
    reviewed yet, and ``conflict_versions``, the newest of them (``Store.conflicts``)."""
    runner = request.app[SYNC]
    conflicts = await request.app[STORE].versions.conflicts()
    review = {"conflicts": conflicts["count"], "conflict_versions": conflicts["items"]}
    if runner is None:
        return reply({"configured": False, "entitlement": _entitlement(request),
                      "reason": "no control plane: set control_plane.url to sync", **review})
    return reply({**await runner.status(),  # type: ignore[attr-defined]
                  "entitlement": _entitlement(request), **review})


async def entitlement_check(request: web.Request) -> web.Response:
    """Re-read the licence and token files now (and fetch a token if a plane is set)."""
    keeper = request.app[KEEPER]
    if keeper is None:
        raise HttpError(409, "no_gate", "this server has no entitlement gate")
    await keeper.check()  # type: ignore[attr-defined]
    return reply(_entitlement(request))


async def sync_run(request: web.Request) -> web.Response:
    runner = request.app[SYNC]
    if runner is None:
        raise HttpError(409, "sync_not_configured",
                        "no control plane: set control_plane.url to sync")
    keeper = request.app[KEEPER]
    gate = runner.engine.gate  # type: ignore[attr-defined]
    if keeper is not None and gate is not None and gate() is not None:
        await keeper.check()  # type: ignore[attr-defined]  # paused: try to get entitled first
    report = await runner.run_now()  # type: ignore[attr-defined]
    return reply(report.as_dict())


async def healthz(request: web.Request) -> web.Response:
    return reply({"ok": True})


async def shutdown(request: web.Request) -> web.Response:
    """``syncd stop``: the daemon's clean stop (in-flight requests drain, the state file goes),
    answered before it starts. syncd's own route, behind the token like every other."""
    stop = request.app[STOP]
    if stop is None:
        raise HttpError(501, "not_implemented", "this server has no daemon to stop")
    stop()  # type: ignore[operator]
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
    answer = await server.handle_bytes(body)  # type: ignore[attr-defined]
    if answer is None:
        return web.Response(status=202)
    return web.Response(body=answer, content_type="application/json")


ROUTES: list[tuple[str, str, Callable[[web.Request], Awaitable[web.StreamResponse]]]] = [
    ("POST", "/v1/agent/memory/query", query),
    ("GET", "/v1/agent/memory/export", export),
    ("GET", "/v1/agent/memory/changes", changes),
    ("POST", "/v1/agent/memory/import", import_rows),
    ("GET", "/v1/agent/memory/settings", get_settings),
    ("PUT", "/v1/agent/memory/settings", put_settings),
    ("POST", "/v1/agent/memory/tools/{name}", tool),
    ("GET", "/v1/agent/memory/items/{id}", get_item),
    ("PATCH", "/v1/agent/memory/items/{id}", edit_item),
    ("DELETE", "/v1/agent/memory/items/{id}", delete_item),
    ("GET", "/v1/agent/memory/items/{id}/versions", item_versions),
    ("POST", "/v1/agent/memory/items/{id}/versions/{n}/restore", restore_version),
    ("POST", "/v1/agent/memory/items/{id}/versions/{n}/dismiss", dismiss_version),
    ("GET", "/v1/agent/status", status),
    ("GET", "/v1/agent/sync/status", sync_status),
    ("POST", "/v1/agent/sync/run", sync_run),
    ("POST", "/v1/agent/entitlement/check", entitlement_check),
    ("GET", "/healthz", healthz),
    ("POST", "/v1/agent/shutdown", shutdown),
    ("GET", "/metrics", metrics),
    ("POST", "/mcp/v1", mcp),
]


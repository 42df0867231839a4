"""``create_hub_app``: the reference control plane's HTTP surface.

Rules:
  * Wire-compatible with the plane's memory routes (contract §4): ``changes``, ``export``,
    ``import``, ``query``, ``settings`` and MCP, with bearer tokens and roles
    ``read < write < admin``. ``import``, ``PUT settings`` and MCP need ``write`` (the plane
    lets ``read`` change settings and write through MCP; the hub does not).
  * ``cursor="ingest"`` (default): ``changes`` follows the hub's commit order (``feed.py``), with
    ``limit``/``has_more`` pagination and ``"feed": "ingest"`` in the body, so a late push is
    never skipped; ``exclude_origin=<replica id>`` leaves out the caller's own versions. ``cursor="origin"`` reproduces the plane: nodes filtered on their own
    ``updated_at``, edges on ``created_at``, and ``until`` read after the queries.
  * ``export`` takes the extensions ``limit`` and ``cursor`` (``has_more``/``next_cursor`` in
    the body) and includes tombstones, so a client's anti-entropy sees deletes.
  * Every response names the hub's ``store_id``; a wiped hub gets a new one.
  * ``GET /v1/agent/entitlement?device_id=`` signs an entitlement for that device with the
    hub's key: ``features`` from the bearer token's plan, ``seq`` from a durable counter.
  * The hub is a network service: no Host allow-list (it sits behind a reverse proxy that
    terminates TLS), but bodies must be JSON and are size-limited.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import msgspec
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from local_store import Store, ValidationError
from protocol.rows import ChangesResponse, ExportBody
from protocol.timestamp import format_ns
from syncd import __version__
from syncd.entitlement.token import Claims, sign
from syncd.http.app import (
    DEFAULT_MAX_BODY,
    EXPORT_HINT,
    MCP,
    PLANE_MODEL,
    STORE,
    SURFACER,
    errors_middleware,
    import_rows,
    mcp,
    put_settings,
    query,
    reply,
)
from syncd.http.errors import HttpError, error_response
from syncd.http.security import not_json
from syncd.hub.tokens import PLANS, AuthError, TokenBook, TokenFileError, authenticate
from syncd.mcp import McpServer
from syncd.tools import Surfacer

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
CURSOR_MODE = web.AppKey("cursor_mode", str)
TOKENS = web.AppKey("tokens", TokenBook)
ISSUER = web.AppKey("issuer", tuple)
NBF_SLACK_SECS = 300  # a token is valid from a little before issue, for clocks slightly behind
MAX_PAGE = 10_000


def create_hub_app(store: Store, book: TokenBook, *, cursor: str = "ingest",
                   max_body: int = DEFAULT_MAX_BODY, signing_key: Ed25519PrivateKey | None = None,
                   token_lifetime_days: float = 7.0) -> web.Application:
    """``signing_key`` enables ``GET /v1/agent/entitlement`` (the hub's key, ``keys.py``)."""
    if cursor not in ("ingest", "origin"):
        raise ValueError(f"hub.cursor must be ingest or origin, got {cursor!r}")
    app = web.Application(client_max_size=max_body,
                          middlewares=[errors_middleware, _auth(book)])
    app[STORE], app[SURFACER], app[TOKENS] = store, Surfacer(), book
    app[PLANE_MODEL], app[CURSOR_MODE] = store.embedder.model_id, cursor
    app[MCP] = McpServer(store, app[SURFACER])
    app[ISSUER] = (signing_key, token_lifetime_days)
    for method, path, handler, _role in ROUTES:
        app.router.add_route(method, path, handler)
    return app


def _auth(book: TokenBook) -> web.middleware:  # type: ignore[valid-type]
    needs = {(method, path): role for method, path, _, role in ROUTES}

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        route = request.match_info.route.resource
        need = needs.get((request.method, route.canonical if route else ""), "read")
        if need != "none":
            try:
                await asyncio.to_thread(authenticate, book,
                                        request.headers.get("Authorization"), need)
            except AuthError as exc:
                headers = {"WWW-Authenticate": 'Bearer realm="syncd-hub"'} \
                    if exc.status == 401 else None
                return error_response(exc.status, exc.code, exc.message, headers=headers)
            except TokenFileError as exc:
                return error_response(500, "token_file", str(exc))
        return not_json(request) or await handler(request)

    return middleware


def _limit(request: web.Request) -> int | None:
    raw = request.query.get("limit")
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValidationError("limit", f"must be an integer, got {raw!r}") from None
    if not 1 <= value <= MAX_PAGE:
        raise ValidationError("limit", f"must be 1..{MAX_PAGE}, got {value}")
    return value


async def changes(request: web.Request) -> web.Response:
    store, realm = request.app[STORE], request.query.get("realm")
    since = request.query.get("since", "")
    echo = since.strip() or "1970-01-01T00:00:00Z"
    if request.app[CURSOR_MODE] == "origin":
        nodes, edges = await store.changes_since(since, realm, edge_version="created_at")
        until = format_ns(store.clock.physical_ns())  # after the queries, as the plane does
        return reply(ChangesResponse(since=echo, until=until, memory_nodes=nodes,
                                     memory_edges=edges, store_id=store.store_id))
    nodes, edges, until, more = await store.feed(
        since, limit=_limit(request), realm=realm,
        exclude_origin=request.query.get("exclude_origin") or None)
    return reply(ChangesResponse(since=echo, until=until, memory_nodes=nodes,
                                 memory_edges=edges, store_id=store.store_id,
                                 has_more=more, feed="ingest"))


async def export(request: web.Request) -> web.Response:
    store, realm, limit = request.app[STORE], request.query.get("realm"), _limit(request)
    if limit is None:
        nodes, edges = await store.export(realm, include_deleted=True)
        return reply(ExportBody(memory_nodes=nodes, memory_edges=edges, hint=EXPORT_HINT,
                                store_id=store.store_id))
    raw = request.query.get("cursor", "0")
    if not raw.isdigit():
        raise ValidationError("cursor", f"must be a next_cursor from a previous page, got {raw!r}")
    nodes, edges, last = await store.changes(int(raw), limit=limit, realm=realm)
    more = len(nodes) + len(edges) == limit  # fewer means both tables ran out
    return reply(ExportBody(memory_nodes=nodes, memory_edges=edges, hint=EXPORT_HINT,
                            store_id=store.store_id, has_more=more, next_cursor=str(last)))


async def entitlement(request: web.Request) -> web.Response:
    """An entitlement for the requesting device: ``features`` from the bearer token's plan."""
    key, lifetime_days = request.app[ISSUER]
    if key is None:
        raise HttpError(404, "not_found", "this hub does not issue entitlements")
    device = request.query.get("device_id", "")
    if not 1 <= len(device) <= 128 or not device.isprintable() or device.strip() != device:
        raise ValidationError("device_id", "must be 1-128 printable characters")
    raw = request.headers.get("Authorization", "")[len("Bearer "):].strip()
    book = request.app[TOKENS]
    name, plan = await asyncio.to_thread(lambda: (book.lookup(raw), book.plan_of(raw)))
    if name is None or plan is None:
        raise HttpError(401, "unauthorized", "unknown token")
    now = int(time.time())
    claims = Claims(sub=name[0], device_id=device, plan=plan, features=list(PLANS[plan]),
                    iat=now, nbf=now - NBF_SLACK_SECS, exp=now + int(lifetime_days * 86400),
                    seq=await request.app[STORE].next_counter("entitlement_seq"))
    return reply({"token": sign(key, claims), "claims": claims})


async def get_settings(request: web.Request) -> web.Response:
    settings = request.app[STORE].settings
    return reply(msgspec.structs.replace(settings, embedding_model=request.app[PLANE_MODEL]))


async def status(request: web.Request) -> web.Response:
    store = request.app[STORE]
    return reply({"version": __version__, "role": "hub", "store_id": store.store_id,
                  "cursor": request.app[CURSOR_MODE], "embedding_model": request.app[PLANE_MODEL],
                  **await store.stats()})


async def healthz(request: web.Request) -> web.Response:
    return reply({"ok": True})


ROUTES: list[tuple[str, str, Handler, str]] = [
    ("POST", "/v1/agent/memory/query", query, "read"),
    ("GET", "/v1/agent/memory/export", export, "read"),
    ("GET", "/v1/agent/memory/changes", changes, "read"),
    ("POST", "/v1/agent/memory/import", import_rows, "write"),
    ("GET", "/v1/agent/memory/settings", get_settings, "read"),
    ("PUT", "/v1/agent/memory/settings", put_settings, "write"),
    ("GET", "/v1/agent/status", status, "read"),
    ("GET", "/v1/agent/entitlement", entitlement, "read"),
    ("POST", "/mcp/v1", mcp, "write"),
    ("GET", "/healthz", healthz, "none"),
]

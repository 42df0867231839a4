"""``create_hub_app``: the reference control plane's HTTP surface.

Rules:
  * Wire-compatible with the plane's memory routes (contract §4, and the current plane's
    changes: docs/kyma-current-surface.md): ``changes``, ``export``, ``import``, ``query``,
    ``settings`` and MCP, with bearer tokens and roles ``read < write < admin``. ``import``
    and ``PUT settings`` need ``write``; MCP needs ``read``, as the plane's. (The plane lets
    ``read`` change settings; the hub keeps ``read`` read-only, as it does in MCP.)
  * MCP (``/mcp/v1``) serves ``HUB_TOOLS`` on both stores: on SQLite over the hub's store
    itself, on PostgreSQL over a working copy of it (``workcopy.py``: a local store that
    replicates the hub through ``feed`` and ``apply``). A ``read`` token sees and calls only
    the read-only tools; the others answer a JSON-RPC error naming the tool and the ``write``
    role (``syncd/mcp.py``): the plane lets ``read`` write through MCP, the hub does not. The
    search tools and ``query`` count usage in the store's counters (``HubStore.usage``).
  * ``PUT settings`` with a bearer token is the plane's: the body replaces the settings (its
    missing keys take the coded defaults, ``replace_settings``) and the answer is
    ``{"ok": true}``. The page's sessions keep the patch the page sends (only the changed
    keys) and are answered the whole settings, as before.
  * ``cursor="ingest"`` (default): ``changes`` follows the hub's commit order (``feed.py``), with
    ``limit``/``has_more`` pagination and ``"feed": "ingest"`` in the body, so a late push is
    never skipped; ``exclude_origin=<replica id>`` leaves out the caller's own versions. ``cursor="origin"`` reproduces the plane: nodes filtered on their own
    ``updated_at``, edges on ``created_at``, and ``until`` read after the queries.
  * Long-poll (ingest mode only; ``longpoll.py`` has its rules, docs/long-poll.md the wire):
    ``changes?wait=SECONDS`` holds an answer without rows until a write commits or the wait
    runs out; every ingest-mode ``changes`` answer carries ``Syncd-Long-Poll: <max seconds>``,
    the advertisement a Kyma plane never sends. An origin-mode hub neither advertises nor
    holds (its overlap window re-serves recent rows, so every poll would answer at once): it
    ignores ``wait``, as the plane ignores unknown parameters.
  * ``export`` takes the extensions ``limit`` and ``cursor`` (``has_more``/``next_cursor`` in
    the body) and includes tombstones, so a client's anti-entropy sees deletes.
  * Every ``changes`` and ``export`` body (and ``status``) names the hub's ``store_id``; a
    wiped hub gets a new one.
  * ``POST /v1/invites/redeem`` (``{"id", "secret"}``) needs no token: it trades an invite for
    a token of the invite's name, role and plan, once (``invites.py``), answering the token and
    the hub's public key. Attempts are limited per client address (429 + ``Retry-After``);
    refused ones are logged by their code, never their secret.
  * ``GET /v1/agent/entitlement?device_id=`` signs an entitlement for that device with the
    hub's key: ``features`` from the bearer token's plan, ``seq`` from a durable counter.
  * Everything the hub persists goes through a ``HubStore`` (``store.py``): SQLite in one
    process, or PostgreSQL behind several processes. A database that cannot be reached is a
    ``503`` with ``Retry-After``, never a ``500``.
  * The web page signs in with a hub token (``POST /ui/login``), whose answer is the only place
    the session's key (``csrf``) is handed out: every request of the page carries it, since
    the cookie alone is no session (``web.py``). Its sessions are kept by the ``HubStore`` too (``PageSessions``), so any hub process serves a signed-in browser; the
    token is looked up again (by its hash) on every request, so revoking it ends its sessions,
    and each token keeps at most ``MAX_SESSIONS_PER_TOKEN`` (``web.py``), its own oldest ending.
  * The hub is a network service: no Host allow-list (it sits behind a reverse proxy that
    terminates TLS), but bodies must be JSON and are size-limited.
  * ``GET /metrics`` is the daemon's page (``syncd/http/metrics.py``: the same HTTP metrics and
    store gauges, ``syncd_store_bytes`` on SQLite only) and, like the daemon's, needs a
    credential: a ``read`` token, as every route but the page's files and ``/healthz``. The
    counts and request rates describe a team's use of its memory, and the hub faces the
    network; Prometheus sends the token with ``authorization: {credentials_file: …}``. A
    ``read`` token also reads memories (there is no narrower role), so guard the scraper's
    like any other. Each process counts its own requests: scrape each process of a
    PostgreSQL hub, not the balancer. A request ``_auth`` refuses counts only in
    ``syncd_http_unauthorized_total``.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from local_store import Store, ValidationError
from syncd.config import DEFAULT_MAX_BODY_BYTES, HubConfig
from syncd.http import routes
from syncd.http import web as web_pages
from syncd.http.app import MCP, METRICS, mcp
from syncd.http.errors import (
    ForbiddenOrigin,
    RouteNotFound,
    TooManyAttempts,
    Unauthorized,
    errors_middleware,
    shown_path,
)
from syncd.http.metrics import Metrics, admit, store_gauges
from syncd.http.routes import MEMORY
from syncd.http.security import check_json
from syncd.http.web import (
    MAX_SESSIONS_PER_TOKEN,
    PAGE_KIND,
    SESSION_KEY,
    SESSION_TTL_SECS,
    Session,
    check_session_request,
    digest,
    own_origin,
    session_cookie,
    set_session_cookie,
)
from syncd.http.wire import read_json, reply
from syncd.hub.entitlements import Issuer
from syncd.hub.invites import ID_PATTERN, Attempts, InviteError
from syncd.hub.longpoll import HeldPolls
from syncd.hub.memory import HubMemory
from syncd.hub.store import (
    FileTokens,
    HubStore,
    PageSession,
    SqliteHubStore,
)
from syncd.hub.tokens import (
    AuthError,
    TokenBook,
    check_role,
    now_text,
    role_allows,
    token_hash,
)
from syncd.hub.workcopy import NUL_MESSAGE, CopyMcp, WorkingCopy
from syncd.mcp import CALLER_CAN_WRITE, McpServer
from syncd.tools import Surfacer, UsageCounters, hub_tools

log = logging.getLogger("syncd.hub")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
HUB: web.AppKey[HubStore] = web.AppKey("hub_store")
ISSUER = web.AppKey("issuer", Issuer)  # absent: the hub signs no entitlements
INVITE_ATTEMPTS = web.AppKey("invite_attempts", Attempts)
HELD_POLLS = web.AppKey("held_polls", HeldPolls)
CALLER_ROLE = web.RequestKey("caller_role", str)  # the role the request was authenticated with
# Paths browsers request from any site on their own: refused (no route has them), not logged.
BROWSER_NOISE = frozenset({"/favicon.ico", "/robots.txt", "/apple-touch-icon.png",
                           "/apple-touch-icon-precomposed.png"})


def create_hub_app(backend: HubStore | Store, book: TokenBook | None = None, *,
                   config: HubConfig | None = None, max_body: int = DEFAULT_MAX_BODY_BYTES,
                   signing_key: Ed25519PrivateKey | None = None) -> web.Application:
    """``backend`` is a ``HubStore`` (a bare feed ``Store`` is wrapped in ``SqliteHubStore``
    with the tokens of ``book``). ``config``: the ``[hub]`` section (its ``cursor``,
    ``token_lifetime_days`` and ``max_held_polls``; its defaults when None). ``signing_key``
    enables ``GET /v1/agent/entitlement``."""
    config = config or HubConfig()
    cursor = config.cursor
    if cursor not in ("ingest", "origin"):
        raise ValueError(f"hub.cursor must be ingest or origin, got {cursor!r}")
    if isinstance(backend, Store):
        tokens = FileTokens(backend.data_dir, book) if book is not None else None
        backend = SqliteHubStore(backend, tokens)
    sessions, metrics = PageSessions(backend), Metrics()
    app = web.Application(client_max_size=max_body,
                          middlewares=[metrics.middleware(), errors_middleware,
                                       _auth(backend, sessions), _no_nul_params])
    app[HUB], app[METRICS] = backend, metrics
    app[PAGE_SESSIONS], app[PAGE_KIND] = sessions, "hub"
    if signing_key is not None:
        app[ISSUER] = Issuer(backend, signing_key, config.token_lifetime_days)
    app[INVITE_ATTEMPTS] = Attempts()
    app[HELD_POLLS] = HeldPolls(config.max_held_polls)
    app[MEMORY] = HubMemory(backend, cursor=cursor, polls=app[HELD_POLLS])
    app.on_shutdown.append(_release_polls)
    surfacer = _surfacer(backend.usage)
    if isinstance(backend, SqliteHubStore):
        app[MCP] = McpServer(backend.store, surfacer)
    else:
        copy = WorkingCopy(backend)
        app[MCP] = CopyMcp(copy, surfacer)
        app.on_cleanup.append(lambda _app: copy.close())
    for method, path, handler, _role in ROUTES:
        app.router.add_route(method, path, handler)
    return app


def _surfacer(usage: UsageCounters) -> Surfacer:
    """``HUB_TOOLS`` counting into ``usage``, whatever store the tools run on."""
    def usage_of(_store: Store) -> UsageCounters:
        return usage
    return Surfacer(hub_tools(usage_of), usage_of)


def hub_of(request: web.Request) -> HubStore:
    return request.app[HUB]


async def _release_polls(app: web.Application) -> None:
    """A stopping hub answers its held polls now instead of waiting them out."""
    app[HELD_POLLS].release(app[HUB].commits)


class PageSessions:
    """The page's sessions in the hub's store (``HubStore.add_page_session``): kept by the
    SHA-256 of the cookie's id, each belonging to its token by the token's SHA-256, so neither
    the session id nor the token is ever stored."""

    def __init__(self, hub: HubStore, clock: Callable[[], int] = time.time_ns) -> None:
        self._hub, self._clock = hub, clock  # a wall clock: every hub process reads the expiry

    async def start(self, raw_token: str, name: str, role: str) -> tuple[str, Session]:
        """A new session of an authenticated token: its cookie value and the session."""
        sid, now = secrets.token_urlsafe(32), self._clock()
        stored = PageSession(token_sha256=token_hash(raw_token), csrf=secrets.token_urlsafe(32),
                             expires_ns=now + SESSION_TTL_SECS * 1_000_000_000)
        await self._hub.add_page_session(digest(sid), stored, now_ns=now,
                                         keep=MAX_SESSIONS_PER_TOKEN)
        return sid, _view(stored, now, name, role)

    async def find(self, request: web.Request) -> tuple[str | None, Session | None]:
        """The cookie's session id and its session, with its token's name and role as they are
        now; a session whose token was revoked ends here. (Its key is checked by the caller.)"""
        sid = session_cookie(request)
        if not sid:
            return None, None
        now = self._clock()
        stored = await self._hub.page_session(digest(sid), now_ns=now)
        if stored is None:
            return sid, None
        token = await self._hub.tokens.lookup_hash(stored.token_sha256)
        if token is None:
            await self._hub.end_page_session(digest(sid))
            return sid, None
        return sid, _view(stored, now, token[0], token[1])

    async def end(self, sid: str | None) -> None:
        if sid:
            await self._hub.end_page_session(digest(sid))


def _view(stored: PageSession, now_ns: int, name: str, role: str) -> Session:
    """A stored session as ``web.py`` checks it: the expiry on this process's monotonic clock."""
    left = (stored.expires_ns - now_ns) / 1e9
    return Session(csrf=stored.csrf, expires=time.monotonic() + left, role=role,
                   owner=stored.token_sha256, name=name)


PAGE_SESSIONS = web.AppKey("page_sessions", PageSessions)


@web.middleware
async def _no_nul_params(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A query parameter holding U+0000 names itself in a 422 (PostgreSQL text cannot hold it,
    so the PostgreSQL store failed with a 500 where SQLite answered)."""
    for name, value in request.query.items():
        if "\x00" in value:
            raise ValidationError(name, NUL_MESSAGE)
    return await handler(request)


class RefusalLog:
    """A warning for each refused request (what a browser asks every site for unprompted,
    ``BROWSER_NOISE``, is refused unlogged) — at most one per client address and reason per
    ``every`` seconds: the operator sees who is refused and why (a laptop with a revoked
    token, a wrong role), and a client retrying or guessing cannot flood the log."""

    def __init__(self, every: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.every, self._clock = every, clock
        self._last: dict[tuple[str | None, str], float] = {}

    def note(self, method: str, path: str, remote: str | None, exc: AuthError) -> None:
        """``path`` as ``shown_path`` gives it: redacted (a refused caller chose it)."""
        key, now = (remote, exc.code), self._clock()
        if key in self._last and now - self._last[key] < self.every:
            return
        if len(self._last) >= 1024:  # many addresses: forget them, never grow without bound
            self._last.clear()
        self._last[key] = now
        log.warning("refused %s %s from %s: %d %s", method, path, remote, exc.status,
                    exc.message)


def _auth(backend: HubStore,
          sessions: PageSessions) -> Middleware:
    needs = {(method, path): role for method, path, _, role in ROUTES}
    refusals = RefusalLog()

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        route = request.match_info.route.resource
        need = needs.get((request.method, route.canonical if route else ""), "read")
        if need != "none":
            session = None
            if request.headers.get("Authorization") is None:
                session = (await sessions.find(request))[1]
                if session is not None:  # the page (web.py): its refusals are not logged
                    check_session_request(request, session)
            try:
                if session is not None:
                    # found with its token's role now: a revoked token's session was not found
                    check_role((session.name or "", session.role), need)
                    request[SESSION_KEY] = session
                    request[CALLER_ROLE] = session.role
                else:
                    request[CALLER_ROLE] = (await backend.tokens.authenticate(
                        request.headers.get("Authorization"), need))[1]
            except AuthError as exc:
                if route is not None or request.path not in BROWSER_NOISE:
                    refusals.note(request.method, shown_path(request), request.remote, exc)
                if isinstance(exc, Unauthorized):
                    exc.headers["WWW-Authenticate"] = 'Bearer realm="syncd-hub"'
                raise
        admit(request)
        check_json(request)
        return await handler(request)

    return middleware


async def entitlement(request: web.Request) -> web.Response:
    """An entitlement for the requesting device: ``features`` from the bearer token's plan."""
    issuer = request.app.get(ISSUER)
    if issuer is None:
        raise RouteNotFound("this hub does not issue entitlements")
    device = request.query.get("device_id", "")
    if not 1 <= len(device) <= 128 or not device.isprintable() or device.strip() != device:
        raise ValidationError("device_id", "must be 1-128 printable characters")
    session = request.get(SESSION_KEY)  # the web page signs in with a token too
    sha256 = session.owner if session is not None else token_hash(
        request.headers.get("Authorization", "")[len("Bearer "):].strip())
    return reply(await issuer.issue(sha256, device))


async def redeem_invite(request: web.Request) -> web.Response:
    """An invite's token, once (rules above; ``invites.py``)."""
    wait = request.app[INVITE_ATTEMPTS].check(request.remote)
    if wait is not None:
        raise TooManyAttempts(f"too many invite attempts from this address; try again in "
                              f"{wait} s", headers={"Retry-After": str(wait)})
    issuer = request.app.get(ISSUER)
    if issuer is None:
        raise RouteNotFound("this hub does not issue entitlements, so it takes no invites")
    body = await read_json(request)
    fields = body if isinstance(body, dict) else {}
    invite_id, secret = fields.get("id"), fields.get("secret")
    if not isinstance(invite_id, str) or not ID_PATTERN.fullmatch(invite_id):
        raise ValidationError("id", "must be an invite's id: 12 hex digits")
    if not isinstance(secret, str) or not secret:
        raise ValidationError("secret", "is required: the invite's secret")
    try:
        got = await hub_of(request).invites.redeem(invite_id, secret, now=now_text())
    except InviteError as exc:
        log.warning("refused invite %s from %s: %s", invite_id, request.remote, exc.code)
        raise
    log.info("invite %s redeemed from %s: token %r (%s)", invite_id, request.remote, got.name,
             got.role)
    return reply({"token": got.token, "name": got.name, "role": got.role, "plan": got.plan,
                  "public_key": issuer.public_key()})


async def hub_mcp(request: web.Request) -> web.Response:
    allowed = CALLER_CAN_WRITE.set(role_allows(request[CALLER_ROLE], "write"))
    try:
        return await mcp(request)
    finally:
        CALLER_CAN_WRITE.reset(allowed)


async def page_login(request: web.Request) -> web.Response:
    """The hub's page logs in with a hub token (there is no `syncd open` on a server): the
    token becomes a session cookie with the token's role, and the answer holds the session's
    key, which the page keeps in its tab and sends on every request (``web.py``); the page
    never keeps the token."""
    origin = request.headers.get("Origin")
    if origin is not None and origin != own_origin(request):
        raise ForbiddenOrigin("a login from another origin")
    body = await read_json(request)
    raw = body.get("token") if isinstance(body, dict) else None
    if not isinstance(raw, str) or not raw.strip():
        raise ValidationError("token", "is required: a hub token (`syncd hub token create`)")
    name, role = await hub_of(request).tokens.authenticate(f"Bearer {raw.strip()}", "read")
    sid, session = await request.app[PAGE_SESSIONS].start(raw.strip(), name, role)
    response = reply({"name": name, "role": role, "csrf": session.csrf})
    set_session_cookie(request, response, sid)
    return response


async def page_session(request: web.Request) -> web.Response:
    """``GET /ui/session`` (``web.py``) for the hub's stored sessions: a revoked token's
    session ends here, so a reloaded page offers the sign-in form at once."""
    return web_pages.session_answer(request, (await request.app[PAGE_SESSIONS].find(request))[1])


async def page_logout(request: web.Request) -> web.Response:
    await request.app[PAGE_SESSIONS].end(session_cookie(request))
    return web_pages.logged_out(request)


async def hub_metrics(request: web.Request) -> web.Response:
    """Prometheus text: the daemon's page (``metrics.py``) for this process and its store."""
    hub = hub_of(request)
    size = await hub.store.maintenance.disk_bytes() if isinstance(hub, SqliteHubStore) else None
    return request.app[METRICS].page(store_gauges(await hub.stats(), size, outbox=False))


ROUTES: list[tuple[str, str, Handler, str]] = [  # the shared routes (routes.py) first
    ("POST", "/v1/agent/memory/query", routes.query, "read"),
    ("GET", "/v1/agent/memory/export", routes.export, "read"),
    ("GET", "/v1/agent/memory/changes", routes.changes, "read"),
    ("POST", "/v1/agent/memory/import", routes.import_rows, "write"),
    ("GET", "/v1/agent/memory/settings", routes.get_settings, "read"),
    ("PUT", "/v1/agent/memory/settings", routes.put_settings, "write"),
    ("GET", "/v1/agent/status", routes.status, "read"),
    ("GET", "/healthz", routes.healthz, "none"),
    ("GET", "/v1/agent/entitlement", entitlement, "read"),
    ("POST", "/v1/invites/redeem", redeem_invite, "none"),
    ("POST", "/mcp/v1", hub_mcp, "read"),
    ("GET", "/metrics", hub_metrics, "read"),
    ("GET", "/", web_pages.index, "none"),
    ("GET", "/static/{name}", web_pages.static_file, "none"),
    ("POST", "/ui/login", page_login, "none"),
    ("GET", "/ui/session", page_session, "none"),
    ("POST", "/ui/logout", page_logout, "read"),
]

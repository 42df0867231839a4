"""The web page for people (``syncd/web/static/``) and how a browser logs in to the local API.

Rules:
  * ``GET /`` and ``GET /static/<file>`` are data-free and served without credentials, like
    ``/healthz``; the page shows nothing until it has a session.
  * Login is a one-time URL: ``syncd open`` asks ``POST /ui/login-codes`` (bearer) for a code —
    32 random bytes, single use, valid ``CODE_TTL_SECS`` — and prints (or opens)
    ``/ui/login?code=…``. Visiting it swaps the code for a session and redirects to
    ``/#key=<the session's key>``: a fragment never reaches a server (nor, with
    ``Referrer-Policy: no-referrer``, another site); the page moves it into the tab's
    ``sessionStorage`` and takes it out of the address bar at once.
  * A session is a random id in a cookie named after the daemon's port (cookies ignore ports:
    another daemon on this host must not overwrite it): ``HttpOnly`` (page scripts cannot read
    it), ``SameSite=Strict`` (other sites' pages cannot send it), ``Path=/``. Sessions live in
    the daemon's memory (a restart logs the browser out) and end after ``SESSION_TTL_SECS``.
    Only the SHA-256 of a session's id is kept.
  * Each token keeps at most ``MAX_SESSIONS_PER_TOKEN`` sessions: one more ends that token's
    oldest, never another token's (the daemon has one token; a hub has many, and its page keeps
    its sessions in the hub's store, shared by every hub process: ``syncd/hub/app.py``).
  * A session has two secrets, and a request needs both: the cookie, and the session's key
    (``csrf``) in ``X-CSRF-Token`` on EVERY request, reads included (compared in constant
    time). The cookie alone is nothing: cookies ignore ports (RFC 6265 §8.5), so the browser
    also sends it to any other server on this host (a dev server, a container's port), which
    can replay it without ``Origin``/``Sec-Fetch-Site``. The key is handed out only with the
    login (in the redirect's fragment here; in ``POST /ui/login``'s answer on a hub), never
    for a cookie: ``GET /ui/session`` answers a cookie without the right key with the same
    401 as no session, and never includes the key. An ``Origin``, when sent, must be exactly
    this daemon's own origin, port included. The Host allow-list, the JSON-only rule and the
    absence of CORS headers (``security.py``) hold for the page as for every other client.
  * The cookie's name comes from the ``Host`` header's port, parsed here (``split_host``),
    never through ``request.url``, which raises on a port it cannot build a URL with: a
    ``Host`` whose port is not 1–65535 has no session (and, on the daemon, is refused by the
    allow-list first).
  * Page responses carry a ``Content-Security-Policy`` that allows only this origin's own
    files, and may not be framed.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from aiohttp import web

from local_store.redact import strip_private
from syncd.http.errors import BadHost, CsrfMissing, Forbidden, ForbiddenOrigin, RouteNotFound

CODE_TTL_SECS = 60
SESSION_TTL_SECS = 12 * 3600
MAX_SESSIONS_PER_TOKEN = 32
MAX_CODES = 16
CSRF_HEADER = "X-CSRF-Token"
SAFE_METHODS = frozenset({"GET", "HEAD"})
STATIC_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css",
                ".svg": "image/svg+xml", ".png": "image/png"}
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
                               "form-action 'self'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


@dataclass(slots=True)
class Session:
    csrf: str
    expires: float  # time.monotonic() of this process
    role: str = "admin"  # a hub session has its token's role; a daemon's has full access
    owner: str = ""  # whose: a hub token's SHA-256 (checked again on every request); daemon ""
    name: str | None = None  # a hub session's token name (shown by the page)


class Sessions:
    """One-time login codes and the browser sessions they became (rules above)."""

    def __init__(self) -> None:
        self._codes: dict[str, float] = {}  # sha256(code) → expiry (monotonic)
        self._sessions: dict[str, Session] = {}  # sha256(session id) → session

    def new_code(self) -> str:
        now = time.monotonic()
        self._codes = {k: v for k, v in self._codes.items() if v > now}
        while len(self._codes) >= MAX_CODES:
            self._codes.pop(next(iter(self._codes)))
        code = secrets.token_urlsafe(32)
        self._codes[digest(code)] = now + CODE_TTL_SECS
        return code

    def redeem(self, code: str) -> tuple[str, Session] | None:
        """A new session for a valid code (which is then spent), else None."""
        expiry = self._codes.pop(digest(code), None)
        if expiry is None or expiry <= time.monotonic():
            return None
        return self.start()

    def start(self, owner: str = "") -> tuple[str, Session]:
        """A new session of ``owner``, which then keeps its newest ``MAX_SESSIONS_PER_TOKEN``
        (rules): the expired and ``owner``'s oldest end, other owners' sessions stay."""
        now = time.monotonic()
        live = {k: s for k, s in self._sessions.items() if s.expires > now}
        mine = [k for k, s in live.items() if s.owner == owner]  # oldest first
        for key in mine[:max(0, len(mine) + 1 - MAX_SESSIONS_PER_TOKEN)]:
            del live[key]
        sid = secrets.token_urlsafe(32)
        session = Session(csrf=secrets.token_urlsafe(32), expires=now + SESSION_TTL_SECS,
                          owner=owner)
        live[digest(sid)] = session
        self._sessions = live
        return sid, session

    def find(self, sid: str | None) -> Session | None:
        if not sid:
            return None
        session = self._sessions.get(digest(sid))
        if session is None or session.expires <= time.monotonic():
            return None
        return session

    def end(self, sid: str | None) -> None:
        if sid:
            self._sessions.pop(digest(sid), None)


SESSIONS = web.AppKey("sessions", Sessions)
PAGE_KIND = web.AppKey("page_kind", str)  # "daemon" or "hub": which views the page offers
SESSION_KEY = web.RequestKey("session", Session)  # the Session a request was authenticated by


_HOST = re.compile(r"(\[[^\]]*\]|[^:\[\]]*)(?::(\d{1,5}))?")


def split_host(header: str) -> tuple[str, int | None] | None:
    """A ``Host`` header as its name and port: ``[::1]:7777`` → ``("[::1]", 7777)``,
    ``localhost`` → ``("localhost", None)``; None for anything else (``[::1]evil.com``,
    ``localhost:7777@evil.com``, a port that is not digits or not 1–65535)."""
    found = _HOST.fullmatch(header.strip())
    if found is None:
        return None
    if found.group(2) is None:
        return found.group(1), None
    port = int(found.group(2))
    return (found.group(1), port) if 1 <= port <= 65535 else None


def cookie_name(request: web.Request) -> str | None:
    """The session cookie's name for this server's port; None for a ``Host`` whose port is
    not 1–65535 or that is not a host name and port at all (rules: no session then)."""
    found = split_host(request.host)
    if found is None:
        return None
    port = found[1] or (443 if _scheme(request) == "https" else 80)
    return f"syncd_session_{port}"


def session_cookie(request: web.Request) -> str | None:
    """The session id the browser sent, if any."""
    name = cookie_name(request)
    return request.cookies.get(name) if name is not None else None


def session_of(request: web.Request) -> tuple[str | None, Session | None]:
    sessions = request.app.get(SESSIONS)
    if sessions is None:
        return None, None
    sid = session_cookie(request)
    return sid, sessions.find(sid)


def check_session_request(request: web.Request, session: Session) -> None:
    """Raises a 403 unless a cookie-authenticated request comes from this server's own page: its
    ``Origin`` (when sent) is exactly ours, ``Sec-Fetch-Site`` (when sent) is same-origin or a
    typed URL, and it carries the session's key, whatever its method (rules: the cookie alone
    also reaches other servers on this host)."""
    foreign = foreign_request(request)
    if foreign is not None:
        raise foreign
    if not has_key(request, session):
        raise CsrfMissing(f"a session request needs the {CSRF_HEADER} header: the key the page "
                          "got when it logged in")


def foreign_request(request: web.Request) -> ForbiddenOrigin | None:
    """The 403 for a request another origin's page made (``Origin``, ``Sec-Fetch-Site``)."""
    origin = request.headers.get("Origin")
    if origin is not None and origin != own_origin(request):
        return ForbiddenOrigin("a session request from another origin")
    if request.headers.get("Sec-Fetch-Site", "same-origin").lower() not in ("same-origin",
                                                                           "none"):
        return ForbiddenOrigin("a session request from another site")
    return None


def has_key(request: web.Request, session: Session) -> bool:
    """Whether ``X-CSRF-Token`` is the session's key (constant time; bytes that are not
    UTF-8 arrive as surrogate escapes and compare as those bytes)."""
    given = request.headers.get(CSRF_HEADER, "")
    return bool(given) and hmac.compare_digest(given.encode("utf-8", "surrogateescape"),
                                               session.csrf.encode())


# ---------------------------------------------------------------------- handlers

async def index(request: web.Request) -> web.StreamResponse:
    return await _static("index.html")


async def static_file(request: web.Request) -> web.StreamResponse:
    return await _static(request.match_info["name"])


_FILES: dict[str, bytes] = {}  # read once, off the event loop


async def _static(name: str) -> web.Response:
    """A file of ``syncd/web/static/``, else a 404: a name with a path, a leading dot, an
    unknown suffix or a NUL (which the file system cannot even look up) is never read."""
    suffix = Path(name).suffix
    if "/" in name or "\x00" in name or name.startswith(".") or suffix not in STATIC_TYPES:
        raise RouteNotFound(f"no static file {strip_private(name)[:80]!r}")
    body = _FILES.get(name)
    if body is None:
        try:
            body = await asyncio.to_thread(
                resources.files("syncd.web").joinpath("static", name).read_bytes)
        except (OSError, ValueError):  # missing, a directory, a name the OS refuses
            raise RouteNotFound(f"no static file {strip_private(name)[:80]!r}") from None
        _FILES[name] = body
    return web.Response(body=body, content_type=STATIC_TYPES[suffix], headers=PAGE_HEADERS)


async def new_login_code(request: web.Request) -> web.Response:
    """Bearer only (``syncd open``): a session cannot mint codes for other browsers."""
    if request.get(SESSION_KEY) is not None:
        raise Forbidden("login codes are issued to the bearer token only")
    code = request.app[SESSIONS].new_code()
    url = f"{own_origin(request)}/ui/login?code={code}"
    return web.json_response({"code": code, "url": url, "expires_in": CODE_TTL_SECS})


async def login(request: web.Request) -> web.StreamResponse:
    found = request.app[SESSIONS].redeem(request.query.get("code", ""))
    if found is None:
        return web.Response(status=401, headers=PAGE_HEADERS, content_type="text/plain",
                            text="This login link is used up or expired. Run `syncd open` "
                                 "for a new one.\n")
    sid, session = found  # the key goes in the fragment, which no server ever sees (rules)
    response = web.Response(status=303, headers={"Location": f"/#key={session.csrf}",
                                                 **PAGE_HEADERS})
    set_session_cookie(request, response, sid)
    return response


def set_session_cookie(request: web.Request, response: web.StreamResponse, sid: str) -> None:
    name = cookie_name(request)
    if name is None:  # the daemon's allow-list refuses such a Host first; a hub answers 400
        raise BadHost("the Host header is not a host name and a port 1-65535")
    response.set_cookie(name, sid, path="/", httponly=True, samesite="Strict",
                        max_age=SESSION_TTL_SECS, secure=_scheme(request) == "https")


def own_origin(request: web.Request) -> str:
    """This server's origin as the browser sees it (a hub behind a TLS proxy: https)."""
    return f"{_scheme(request)}://{request.host}"


def _scheme(request: web.Request) -> str:
    forwarded = request.headers.get("X-Forwarded-Proto", "").strip().lower()
    return forwarded if forwarded in ("http", "https") else request.scheme  # not request.url


async def session_info(request: web.Request) -> web.Response:
    """Public (the page asks before it knows whether it has a session): this browser's
    session, or a 401 that says which login this server offers."""
    return session_answer(request, session_of(request)[1])


def session_answer(request: web.Request, session: Session | None) -> web.Response:
    """``GET /ui/session``'s answer for the browser's session, however it was found: a cookie
    without its key is no session (rules), and the key is never in the answer."""
    if session is not None and (refused := foreign_request(request)):
        raise refused
    if session is not None and not has_key(request, session):
        session = None
    kind = request.app.get(PAGE_KIND, "daemon")
    if session is None:  # the page learns which login to offer: `syncd open`, or a hub token
        how = "sign in with a hub token" if kind == "hub" else "run `syncd open`"
        return web.json_response({"error": {"code": "unauthorized",
                                            "message": f"no browser session; {how}"},
                                  "kind": kind}, status=401)
    left = max(0.0, session.expires - time.monotonic())
    body = {"expires_in": int(left), "kind": kind, "role": session.role}
    if session.name is not None:
        body["name"] = session.name
    return web.json_response(body, headers={"Cache-Control": "no-store"})


async def logout(request: web.Request) -> web.StreamResponse:
    sid, _ = session_of(request)
    request.app[SESSIONS].end(sid)
    return logged_out(request)


def logged_out(request: web.Request) -> web.Response:
    """``POST /ui/logout``'s answer, once the session has ended: the cookie is deleted."""
    response = web.json_response({"ok": True})
    if (name := cookie_name(request)) is not None:
        response.del_cookie(name, path="/")
    return response


def digest(value: str) -> str:
    """SHA-256 hex: how a session id (or a login code) is kept, never the value itself. (A
    cookie's bytes that are not UTF-8 arrive as surrogate escapes: hashed as those bytes.)"""
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()


PUBLIC_PATHS = frozenset({"/", "/ui/login", "/ui/session"})
PUBLIC_PREFIXES = ("/static/",)
ROUTES = [
    ("GET", "/", index),
    ("GET", "/static/{name}", static_file),
    ("POST", "/ui/login-codes", new_login_code),
    ("GET", "/ui/login", login),
    ("GET", "/ui/session", session_info),
    ("POST", "/ui/logout", logout),
]

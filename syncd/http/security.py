"""The local API's guards, in the order they run (RELIABILITY L1–L7). Each answers before any
handler runs, so a refused request can never change the store.

1. Host allow-list (DNS rebinding): ``localhost``, ``127.0.0.1``, ``[::1]`` (any port
   1–65535) plus configured names; anything else → 421.
2. Browser requests from other origins: an ``Origin`` that is not exactly this server's
   (scheme, host and port: a page of another local program on another port is foreign too),
   ``null``, or ``Sec-Fetch-Site: cross-site`` → 403. No response ever carries ``Access-Control-Allow-*``.
3. Bearer token on every route but the data-free ``/healthz``, ``/`` and ``/static/*`` (and
   ``/ui/login``, whose one-time code is the credential), compared in constant time; a token in
   the query string is refused outright (it leaks into logs and history) → 401. Instead of the
   token, a browser may present the web page's session cookie together with the session's key
   in ``X-CSRF-Token`` on every request (``web.py``: own origin only; the cookie alone is
   nothing, since the browser also sends it to other servers on this host, whatever their port).
4. Writes must be ``application/json`` → 415; bodies over the limit → 413 (aiohttp enforces
   ``client_max_size`` while reading, so memory stays bounded).

Only a request that passes 1–3 is counted by route (``metrics.admit``); one refused there adds
to the unlabelled ``syncd_http_unauthorized_total`` and nothing else.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Iterable

from aiohttp import web
from aiohttp.typedefs import Middleware

from syncd.config import LOOPBACK_HOST_NAMES
from syncd.http import web as web_pages
from syncd.http.errors import (
    ForbiddenOrigin,
    MisdirectedHost,
    Unauthorized,
    UnsupportedMediaType,
)
from syncd.http.metrics import admit
from syncd.http.web import SESSION_KEY, check_session_request, own_origin, session_of, split_host

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

LOOPBACK_HOSTS = frozenset({*LOOPBACK_HOST_NAMES, "::1"})
PUBLIC_PATHS = frozenset({"/healthz", *web_pages.PUBLIC_PATHS})
TOKEN_QUERY_KEYS = frozenset({"token", "access_token", "api_key", "apikey", "auth"})
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def host_name(header: str) -> str:
    """``Host`` without its port: ``[::1]:7777`` → ``[::1]``, ``localhost:1`` → ``localhost``.
    Anything else after the name (``[::1]evil.com``, ``localhost:7777@evil.com``, a port that is
    not digits or not 1–65535) is returned whole, so it matches no allowed name."""
    header = header.strip().lower()
    found = split_host(header)
    return found[0] if found else header


def guards(token: str, extra_hosts: Iterable[str] = ()) -> Middleware:
    allowed = LOOPBACK_HOSTS | {h.lower() for h in extra_hosts}
    expected = token.encode()

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        host = request.headers.get("Host", "")
        if not host or host_name(host) not in allowed:
            raise MisdirectedHost("Host header is not an allowed local name")
        origin = request.headers.get("Origin")
        if origin is not None and origin.lower() != own_origin(request).lower():
            raise ForbiddenOrigin("cross-origin requests are refused")
        if request.headers.get("Sec-Fetch-Site", "").lower() == "cross-site":
            raise ForbiddenOrigin("cross-site requests are refused")
        if not _public(request.path):
            if TOKEN_QUERY_KEYS & {k.lower() for k in request.query}:
                raise _unauthorized("tokens are accepted only in the Authorization header")
            given = request.headers.get("Authorization")
            if given is None and (found := session_of(request)[1]) is not None:
                check_session_request(request, found)  # the page's cookie (web.py)
                request[SESSION_KEY] = found
            elif given is None or not given.startswith("Bearer ") or not hmac.compare_digest(
                    given[7:].strip().encode("utf-8", "surrogateescape"), expected):
                raise _unauthorized("missing or wrong Authorization: Bearer <token>")
        admit(request)
        check_json(request)
        return await handler(request)

    return middleware


def check_json(request: web.Request) -> None:
    """415 for a write whose body is not ``application/json`` (rule 4)."""
    if request.method in BODY_METHODS and request.can_read_body and (
            request.content_type != "application/json"):
        raise UnsupportedMediaType("request bodies must be application/json")


def _public(path: str) -> bool:
    return path in PUBLIC_PATHS or path.startswith(web_pages.PUBLIC_PREFIXES)


def _unauthorized(message: str) -> Unauthorized:
    return Unauthorized(message, headers={"WWW-Authenticate": 'Bearer realm="syncd"'})

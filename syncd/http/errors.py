"""The HTTP branch of syncd's error tree (``protocol/errors.py`` draws the whole tree) and the
one middleware that renders every failure as ``{"error": {"code", "message", "field"?}}``.

Rules:
  * A ``SyncdError`` is answered with its class's ``status`` and ``code``, its ``message``,
    ``field`` and ``headers``; aiohttp's own refusals (no route, wrong method, a body over the
    limit) become the classes below first. Anything else is a 500 ``internal``, logged with its
    traceback, never shown.
  * Guards and handlers raise; none builds an error answer itself.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable

from aiohttp import web

from local_store.redact import strip_private
from protocol.errors import SyncdError, error_body

log = logging.getLogger("syncd.http")


class BadJson(SyncdError):
    """The body is empty, not UTF-8, not JSON, nested too deeply or holds a lone surrogate."""

    status, code = 400, "bad_json"


class BadHost(SyncdError):
    """The ``Host`` header is not a host name and a port 1-65535 (no cookie can be named)."""

    status, code = 400, "bad_host"


class AuthError(SyncdError):
    """The credential is missing, wrong, or not enough for the route."""

    status, code = 401, "unauthorized"


class Unauthorized(AuthError):
    status, code = 401, "unauthorized"


class Forbidden(AuthError):
    status, code = 403, "forbidden"


class ForbiddenOrigin(SyncdError):
    """A browser request another origin's (or site's) page made."""

    status, code = 403, "forbidden_origin"


class CsrfMissing(SyncdError):
    """A session request without the session's key in ``X-CSRF-Token``."""

    status, code = 403, "csrf"


class RouteNotFound(SyncdError):
    """No such route, tool or static file (a missing memory is the store's ``NotFoundError``)."""

    status, code = 404, "not_found"


class MethodNotAllowed(SyncdError):
    status, code = 405, "method_not_allowed"


class NoGate(SyncdError):
    status, code = 409, "no_gate"


class SyncNotConfigured(SyncdError):
    status, code = 409, "sync_not_configured"


class TooLarge(SyncdError):
    status, code = 413, "too_large"


class UnsupportedMediaType(SyncdError):
    status, code = 415, "unsupported_media_type"


class MisdirectedHost(SyncdError):
    status, code = 421, "misdirected_host"


class TooManyAttempts(SyncdError):
    status, code = 429, "too_many_attempts"


class NoDaemon(SyncdError):
    """``POST /v1/agent/shutdown`` on a server that has no daemon to stop."""

    status, code = 501, "not_implemented"


class OtherHttpError(SyncdError):
    """One of aiohttp's refusals this tree has no class for: its status, as aiohttp chose it."""

    code = "http_error"

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status  # the one class whose instances choose their status


def error_response(exc: SyncdError) -> web.Response:
    return web.Response(status=exc.status, body=error_body(exc.code, exc.message, exc.field),
                        content_type="application/json", headers=exc.headers or None)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Render every failure in the one error shape (rules)."""
    try:
        return await handler(request)
    except SyncdError as exc:
        return error_response(exc)
    except web.HTTPException as exc:
        return error_response(_aiohttp_error(request, exc))
    except Exception:
        log.exception("%s %s failed", request.method, shown_path(request))
        return error_response(SyncdError("internal error; the daemon's log has the details"))


def _aiohttp_error(request: web.Request, exc: web.HTTPException) -> SyncdError:
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return TooLarge(f"request body over {request.app._client_max_size} bytes")
    if exc.status == 405:
        return MethodNotAllowed(f"{request.method} not allowed here")
    if exc.status == 404:
        return RouteNotFound(f"no route {shown_path(request)}")
    return OtherHttpError(exc.status, exc.reason)


def shown_path(request: web.Request, limit: int = 200) -> str:
    """The request's path fit for a message or a log line: redacted (a path can hold an id or a
    name the client chose, so a ``<private>`` span), control characters escaped (a decoded
    ``%0a`` would otherwise start a forged log line: a newline is shown as ``\\n``), then
    shortened."""
    return _CONTROL.sub(_escaped, strip_private(request.path))[:limit]


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")  # C0, DEL, C1, line separators


def _escaped(found: re.Match[str]) -> str:
    return found.group().encode("unicode_escape").decode("ascii")  # "\n" → "\\n"

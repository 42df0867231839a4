"""One error shape for every HTTP failure: ``{"error": {"code", "message", "field"?}}``.

    HttpError (status, code)
    ├── store errors mapped by code: invalid → 422, not_found → 404, store_locked/closed → 503,
    │   disk_full → 507
    ├── an entitlement check asked for while the daemon stops: 503 stopping
    ├── anything unexpected: 500 internal (logged with its traceback, never shown)
    └── protocol failures raised by the middlewares: 400 bad_json, 401 unauthorized,
        403 forbidden_origin, 413 too_large, 415 unsupported_media_type, 421 misdirected_host
"""

from __future__ import annotations

from aiohttp import web

from protocol.errors import error_body

STORE_STATUS = {"invalid": 422, "not_found": 404, "store_locked": 503, "store_closed": 503,
                "disk_full": 507}


class HttpError(Exception):
    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field


def error_response(status: int, code: str, message: str, field: str | None = None,
                   headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=error_body(code, message, field),
                        content_type="application/json", headers=headers)

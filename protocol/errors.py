"""syncd's one error tree and its one JSON body: ``{"error": {"code", "message"[, "field"]}}``.

Rules:
  * Every failure syncd answers over HTTP is a ``SyncdError``; each class carries its HTTP
    ``status`` and its stable, machine-readable ``code`` as class attributes, ``message`` is for
    humans and ``field`` (omitted when None) names the offending request field. One middleware
    (``syncd/http/errors.py``) renders them; nothing else maps an error to a status.
  * Anything that is not a ``SyncdError`` is rendered as the root: 500 ``internal``, logged with
    its traceback, its text never shown.
  * The plane's own errors are ``{"error": "<text>"}`` or plain text; syncd does not mimic that
    shape in its own errors.
  * The tree below is the class tree (``tests/test_error_tree.py`` compares them), with the
    module each class lives in:

    SyncdError                  500 internal               protocol.errors
    ├── StoreError              500 store_error            local_store.errors
    │   ├── ValidationError     422 invalid
    │   ├── NotFoundError       404 not_found
    │   ├── StoreLockedError    503 store_locked
    │   ├── StoreUnusableError  500 store_unusable
    │   ├── StoreFullError      507 disk_full
    │   ├── StoreClosedError    503 store_closed
    │   └── BackupError         500 backup_failed          local_store.backups
    ├── BadJson                 400 bad_json               syncd.http.errors
    ├── BadHost                 400 bad_host
    ├── AuthError               401 unauthorized
    │   ├── Unauthorized        401 unauthorized
    │   └── Forbidden           403 forbidden
    ├── ForbiddenOrigin         403 forbidden_origin
    ├── CsrfMissing             403 csrf
    ├── RouteNotFound           404 not_found
    ├── MethodNotAllowed        405 method_not_allowed
    ├── NoGate                  409 no_gate
    ├── SyncNotConfigured       409 sync_not_configured
    ├── TooLarge                413 too_large
    ├── UnsupportedMediaType    415 unsupported_media_type
    ├── MisdirectedHost         421 misdirected_host
    ├── TooManyAttempts         429 too_many_attempts
    ├── NoDaemon                501 not_implemented
    ├── OtherHttpError          4xx/5xx http_error         (aiohttp's status, whatever it is)
    ├── KeeperStopped           503 stopping               syncd.entitlement.keeper
    ├── TokenFileError          500 token_file             syncd.hub.tokens
    ├── BadPlan                 500 bad_plan               syncd.hub.entitlements
    ├── StoreUnavailableError   503 store_unavailable      syncd.hub.store
    ├── PollsFull               503 too_many_polls         syncd.hub.longpoll
    └── InviteError             401 invite_unknown         syncd.hub.invites
        ├── InviteUnknown       401 invite_unknown
        ├── InviteUsed          410 invite_used
        ├── InviteRevoked       410 invite_revoked
        ├── InviteExpired       410 invite_expired
        └── NameTaken           409 name_taken
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec


class SyncdError(Exception):
    """The root: ``status`` and ``code`` are the class's; ``headers`` go on the answer (a
    ``Retry-After``, a ``WWW-Authenticate``)."""

    status: int = 500
    code: str = "internal"

    def __init__(self, message: str, *, field: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.message, self.field = message, field
        self.headers: dict[str, str] = dict(headers or {})


class ErrorDetail(msgspec.Struct, kw_only=True, omit_defaults=True):
    code: str
    message: str
    field: str | None = None


class ErrorBody(msgspec.Struct, kw_only=True):
    error: ErrorDetail


_encoder = msgspec.json.Encoder()
error_body_decoder = msgspec.json.Decoder(ErrorBody)


def error_body(code: str, message: str, field: str | None = None) -> bytes:
    """Encode the error body for one failure."""
    return _encoder.encode(ErrorBody(error=ErrorDetail(code=code, message=message, field=field)))

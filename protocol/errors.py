"""syncd's one JSON error body: ``{"error": {"code", "message"[, "field"]}}``.

Rules: ``code`` is a stable machine-readable name, ``message`` is for humans, and ``field``
(omitted when None) names the offending request field. The plane's own errors are
``{"error": "<text>"}`` or plain text; syncd does not mimic that shape in its own errors.
"""

import msgspec


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

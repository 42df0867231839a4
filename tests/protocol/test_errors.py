"""protocol.errors: the one error body."""

import msgspec

from protocol.errors import ErrorBody, ErrorDetail, error_body, error_body_decoder


def test_error_body_omits_missing_field() -> None:
    assert error_body("not_found", "no such memory") == (
        b'{"error":{"code":"not_found","message":"no such memory"}}'
    )


def test_error_body_with_field() -> None:
    body = error_body("invalid", "must be >= 0", field="limit")
    assert msgspec.json.decode(body) == {
        "error": {"code": "invalid", "message": "must be >= 0", "field": "limit"}
    }
    assert error_body_decoder.decode(body) == ErrorBody(
        error=ErrorDetail(code="invalid", message="must be >= 0", field="limit")
    )

"""Entitlement tokens: Ed25519 signatures over exact payload bytes, verified before parsing.

Format (ASCII, one line): ``<kid>.<payload>.<signature>``
  * ``kid``: 16 lower-case hex digits, the first 8 bytes of SHA-256 of the raw public key.
  * ``payload``: base64url (no padding) of the JSON claims, exactly as signed.
  * ``signature``: base64url (no padding) of the 64-byte Ed25519 signature over
    ``DOMAIN + payload bytes`` (domain separation: a signature made for anything else with the
    same key never verifies here).

Rules:
  1. The framing is checked strictly (length, alphabet, three parts, canonical base64url) and
     the signature is verified against a *pinned* key chosen by ``kid`` — the token never
     supplies a key — before one byte of the payload is parsed.
  2. The claims are then decoded strictly (every field required, exact types, no extras).
  3. Every failure is a ``TokenError`` with a stable ``reason`` code; nothing else escapes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re

import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

DOMAIN = b"syncd-entitlement-v1\x00"
MAX_TOKEN_BYTES = 4096
FEATURES = ("sync", "graph")
_FRAME = re.compile(r"[0-9a-f]{16}\.[A-Za-z0-9_-]{2,4000}\.[A-Za-z0-9_-]{86}")


class TokenError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason, self.message = reason, message


class Claims(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    sub: str
    device_id: str
    plan: str
    features: list[str]
    iat: int  # seconds since the epoch
    nbf: int
    exp: int
    seq: int


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def unb64url(text: str) -> bytes:
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if b64url(raw) != text:  # one encoding per byte string: no malleable padding bits
        raise ValueError("non-canonical base64url")
    return raw


def key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes_raw()
    return hashlib.sha256(raw).hexdigest()[:16]


def public_key_text(public: Ed25519PublicKey) -> str:
    """How a key is pinned in ``[entitlement] public_keys``: base64url of the 32 raw bytes."""
    return b64url(public.public_bytes_raw())


def parse_public_key(text: str) -> Ed25519PublicKey:
    try:
        raw = unb64url(text.strip())
        if len(raw) != 32:
            raise ValueError(f"{len(raw)} bytes, want 32")
        return Ed25519PublicKey.from_public_bytes(raw)
    except (ValueError, binascii.Error) as exc:
        raise ValueError(f"not an Ed25519 public key (base64url of 32 bytes): {exc}") from None


def sign(private: Ed25519PrivateKey, claims: Claims) -> str:
    payload = msgspec.json.encode(claims)
    signature = private.sign(DOMAIN + payload)
    return f"{key_id(private.public_key())}.{b64url(payload)}.{b64url(signature)}"


def verify(token: str | bytes, pinned: dict[str, Ed25519PublicKey]) -> Claims:
    """The claims of a token signed by one of the ``pinned`` keys (``kid`` → key)."""
    if isinstance(token, bytes):
        if len(token) > MAX_TOKEN_BYTES:
            raise TokenError("malformed", f"token longer than {MAX_TOKEN_BYTES} bytes")
        try:
            token = token.decode("ascii")
        except UnicodeDecodeError:
            raise TokenError("malformed", "token is not ASCII") from None
    token = token.strip(" \t\r\n")  # ASCII whitespace only, as for bytes
    if len(token) > MAX_TOKEN_BYTES or not _FRAME.fullmatch(token):
        raise TokenError("malformed", "token is not <kid>.<payload>.<signature>")
    kid, payload_text, signature_text = token.split(".")
    key = pinned.get(kid)
    if key is None:
        raise TokenError("unknown_key", f"token signed by key {kid}, which is not pinned")
    try:
        payload, signature = unb64url(payload_text), unb64url(signature_text)
    except (ValueError, binascii.Error):
        raise TokenError("malformed", "token parts are not canonical base64url") from None
    try:
        key.verify(signature, DOMAIN + payload)
    except InvalidSignature:
        raise TokenError("invalid_signature", "signature does not verify") from None
    try:
        claims = msgspec.json.decode(payload, type=Claims)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise TokenError("bad_payload", f"signed payload is not valid claims: {exc}") from None
    return claims


def kid_of(token: str | bytes) -> str | None:
    """The ``kid`` a token's framing names (not verified: what ``verify`` would look up), or
    None when the text does not start like a token."""
    text = token.decode("ascii", "replace") if isinstance(token, bytes) else token
    kid = text.lstrip(" \t\r\n")[:17]
    return kid[:16] if re.fullmatch(r"[0-9a-f]{16}\.", kid) else None


def pin(texts: list[str] | tuple[str, ...]) -> dict[str, Ed25519PublicKey]:
    """Pinned keys by kid, from config (a bad key is a configuration error: ValueError)."""
    keys = {}
    for i, text in enumerate(texts):
        try:
            key = parse_public_key(text)
        except ValueError as exc:
            raise ValueError(f"entitlement.public_keys[{i}]: {exc}") from None
        keys[key_id(key)] = key
    return keys

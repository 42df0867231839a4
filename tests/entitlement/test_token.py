"""``syncd.entitlement.token`` on its own: the signed format, strict framing, domain separation
and the claim schema (RELIABILITY E1, E2, E6). Real Ed25519 keys, no mocks."""

from __future__ import annotations

import os

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from syncd.entitlement.token import (
    MAX_TOKEN_BYTES,
    Claims,
    TokenError,
    b64url,
    key_id,
    sign,
    verify,
)
from tests.entitlement.support import claims, flip, flip_in_part, parts, pinned, sign_raw

EXAMPLES = int(os.environ.get("SYNCD_PROPERTY_EXAMPLES", "50"))
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])
KEY = Ed25519PrivateKey.generate()
OTHER = Ed25519PrivateKey.generate()
PINNED = pinned(KEY)
NOW = 1_780_000_000
TOKEN = sign(KEY, claims(NOW))
ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

claim_values = st.builds(
    Claims, sub=st.text(min_size=1, max_size=40), device_id=st.text(min_size=1, max_size=64),
    plan=st.sampled_from(["free", "sync", "pro"]),
    features=st.lists(st.sampled_from(["sync", "graph"]), max_size=2, unique=True),
    iat=st.integers(0, 2**40), nbf=st.integers(0, 2**40), exp=st.integers(0, 2**40),
    seq=st.integers(0, 2**53))


def reason_of(token: str | bytes) -> str:
    with pytest.raises(TokenError) as caught:
        verify(token, PINNED)
    return caught.value.reason


def test_sign_verify_round_trip() -> None:
    """E1: a token signed by the pinned key verifies to exactly the claims it was made from."""
    original = claims(NOW, seq=7)
    token = sign(KEY, original)
    assert verify(token, PINNED) == original
    assert verify((token + "\n").encode(), PINNED) == original  # as read from a file
    assert token.split(".")[0] == key_id(KEY.public_key())


@PROPERTY
@given(original=claim_values, part=st.sampled_from(["payload", "signature"]), data=st.data())
def test_any_single_bit_flip_is_refused(original: Claims, part: str, data: st.DataObject) -> None:
    """E1: one bit flipped anywhere in the signed payload or the signature → invalid_signature."""
    token = sign(KEY, original)
    _, payload, signature = parts(token)
    size = len(payload if part == "payload" else signature) * 8
    bit = data.draw(st.integers(0, size - 1), label="bit")
    assert reason_of(flip_in_part(token, part, bit)) == "invalid_signature"


@PROPERTY
@given(original=claim_values, data=st.data())
def test_any_bit_flip_in_the_token_text_is_refused(original: Claims,
                                                   data: st.DataObject) -> None:
    """E1/E6: one bit flipped in the token as stored (any byte, kid included) never verifies and
    raises only TokenError (malformed, unknown_key or invalid_signature)."""
    raw = sign(KEY, original).encode()
    bit = data.draw(st.integers(0, len(raw) * 8 - 1), label="bit")
    tampered = flip(raw, bit)
    assert reason_of(tampered) in {"malformed", "unknown_key", "invalid_signature"}
    try:
        text = tampered.decode("ascii")
    except UnicodeDecodeError:
        return
    assert reason_of(text) in {"malformed", "unknown_key", "invalid_signature"}


def test_every_single_bit_flip_of_one_token() -> None:
    """E1: exhaustively, every bit of the payload and of the signature of one token."""
    _, payload, signature = parts(TOKEN)
    for part, size in (("payload", len(payload)), ("signature", len(signature))):
        reasons = {reason_of(flip_in_part(TOKEN, part, bit)) for bit in range(size * 8)}
        assert reasons == {"invalid_signature"}, part


@pytest.mark.parametrize("domain", [b"", b"syncd-entitlement-v2\x00", b"syncd-entitlement-v1"])
def test_a_signature_without_the_domain_prefix_does_not_verify(domain: bytes) -> None:
    """E1: domain separation — the same key signing the same payload bytes under another (or no)
    prefix never yields an entitlement."""
    _, payload, _ = parts(TOKEN)
    assert reason_of(sign_raw(KEY, payload, domain=domain)) == "invalid_signature"
    assert verify(sign_raw(KEY, payload), PINNED) == verify(TOKEN, PINNED)  # the control


def test_a_key_that_is_not_pinned_is_refused_whatever_the_kid_says() -> None:
    """E2: another key's token is unknown_key; forging the pinned key's kid is invalid_signature;
    with nothing pinned nothing verifies."""
    payload = msgspec.json.encode(claims(NOW))
    assert reason_of(sign_raw(OTHER, payload)) == "unknown_key"
    assert reason_of(sign_raw(OTHER, payload, kid=key_id(KEY.public_key()))) == \
        "invalid_signature"
    with pytest.raises(TokenError) as caught:
        verify(TOKEN, {})
    assert caught.value.reason == "unknown_key"


def _trailing_bits_token() -> str:
    """A token whose payload encoding has unused trailing bits, with those bits set."""
    for pad in range(3):
        payload = msgspec.json.encode(msgspec.structs.replace(claims(NOW), sub="x" * (1 + pad)))
        text = b64url(payload)
        if len(text) % 4:
            last = ALPHABET[ALPHABET.index(text[-1]) | 1]
            assert last != text[-1]
            token = sign_raw(KEY, payload)
            kid, _, signature = token.split(".")
            return f"{kid}.{text[:-1]}{last}.{signature}"
    raise AssertionError("unreachable: some padding leaves trailing bits")


def _malformed_cases() -> dict[str, str | bytes]:
    kid, payload, signature = TOKEN.split(".")
    sig_trailing = signature[:-1] + ALPHABET[ALPHABET.index(signature[-1]) | 1]
    assert sig_trailing != signature  # 64 bytes → 86 chars, 4 unused bits in the last one
    return {
        "empty str": "",
        "empty bytes": b"",
        "whitespace only": " \n\t",
        "padding on the payload": f"{kid}.{payload}==.{signature}",
        "padding on the signature": f"{kid}.{payload}.{signature}==",
        "trailing bits in the payload": _trailing_bits_token(),
        "trailing bits in the signature": f"{kid}.{payload}.{sig_trailing}",
        "standard alphabet": f"{kid}.{payload.replace('-', '+')}+.{signature}",
        "two parts": f"{kid}.{payload}",
        "four parts": f"{TOKEN}.{signature}",
        "no kid": f".{payload}.{signature}",
        "upper-case kid": f"{kid.upper()}.{payload}.{signature}"
        if kid.upper() != kid else f"A{kid[1:]}.{payload}.{signature}",
        "short signature": f"{kid}.{payload}.{signature[:-1]}",
        "truncated": TOKEN[: len(TOKEN) // 2],
        "non-ASCII inside (str)": f"{kid}.{payload[:5]}é{payload[5:]}.{signature}",
        "non-ASCII inside (bytes)": f"{kid}.{payload[:5]}é{payload[5:]}.{signature}".encode(),
        "non-ASCII whitespace around (str)": f"\u2003{TOKEN}\u00a0",
        "non-ASCII whitespace around (bytes)": f"\u2003{TOKEN}\u00a0".encode(),
        "NUL inside": f"{kid}.{payload}\x00.{signature}",
        "over-long bytes": TOKEN.encode() + b" " * (MAX_TOKEN_BYTES + 1 - len(TOKEN)),
        "over-long str": f"{kid}.{'A' * (MAX_TOKEN_BYTES)}.{signature}",
        "binary": bytes(range(256)),
    }


@pytest.mark.parametrize("case", list(_malformed_cases()))
def test_bad_framing_is_malformed(case: str) -> None:
    """E6: empty, padded, non-canonical, wrongly split, non-ASCII or over-long → malformed."""
    assert reason_of(_malformed_cases()[case]) == "malformed"


def _bad_payloads() -> dict[str, bytes]:
    good = msgspec.to_builtins(claims(NOW))
    missing = {k: v for k, v in good.items() if k != "seq"}
    return {
        "missing seq": msgspec.json.encode(missing),
        "missing device_id": msgspec.json.encode(
            {k: v for k, v in good.items() if k != "device_id"}),
        "extra claim": msgspec.json.encode({**good, "admin": True}),
        "seq as a string": msgspec.json.encode({**good, "seq": "9"}),
        "exp as a float": msgspec.json.encode({**good, "exp": 1.5e9}),
        "exp as a bool": msgspec.json.encode({**good, "exp": True}),
        "features as a string": msgspec.json.encode({**good, "features": "sync"}),
        "device_id as null": msgspec.json.encode({**good, "device_id": None}),
        "a JSON array": msgspec.json.encode(list(good.values())),
        "not JSON": b"sync graph forever",
        "truncated JSON": msgspec.json.encode(good)[:-1],
    }


@pytest.mark.parametrize("case", list(_bad_payloads()))
def test_a_validly_signed_bad_payload_is_bad_payload(case: str) -> None:
    """E6: a signature that verifies over claims that do not parse strictly → bad_payload."""
    assert reason_of(sign_raw(KEY, _bad_payloads()[case])) == "bad_payload"

"""Shared pieces for the entitlement tests (RELIABILITY E1–E7): real Ed25519 keys, tokens signed
exactly as the product signs them, a hand-moved wall clock (seconds), a real hub app that
issues entitlements on a loopback port, and helpers to run ``syncd`` as real processes."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from local_store import HashingEmbedder, Store
from syncd.config import HubConfig
from syncd.entitlement.gate import LICENSE_FILENAME, TOKEN_FILENAME, Gate
from syncd.entitlement.token import DOMAIN, Claims, b64url, key_id, unb64url
from syncd.hub.app import create_hub_app
from syncd.hub.keys import load_or_create_key
from syncd.hub.tokens import TokenBook, create_token

DAY = 86_400
DEVICE = "laptop-0123456789abcdef"


class Clock:
    """The gate's injected wall clock (seconds since the epoch), moved by hand."""

    def __init__(self, now: float) -> None:
        self.now = float(now)

    def __call__(self) -> float:
        return self.now


def pinned(*keys: Ed25519PrivateKey) -> dict[str, Ed25519PublicKey]:
    return {key_id(k.public_key()): k.public_key() for k in keys}


def claims(now: float, *, device: str = DEVICE, seq: int = 1, plan: str = "pro",
           features: tuple[str, ...] = ("sync", "graph"), nbf: float | None = None,
           exp: float | None = None, iat: float | None = None) -> Claims:
    return Claims(sub="laptops", device_id=device, plan=plan, features=list(features),
                  iat=int(now if iat is None else iat),
                  nbf=int(now - 300 if nbf is None else nbf),
                  exp=int(now + 7 * DAY if exp is None else exp), seq=seq)


def sign_raw(key: Ed25519PrivateKey, payload: bytes, *, kid: str | None = None,
             domain: bytes = DOMAIN) -> str:
    """A token over arbitrary payload bytes, signed with ``domain`` (the product's by
    default) and labelled with ``kid`` (the signing key's own by default)."""
    kid = key_id(key.public_key()) if kid is None else kid
    return f"{kid}.{b64url(payload)}.{b64url(key.sign(domain + payload))}"


def parts(token: str) -> tuple[str, bytes, bytes]:
    kid, payload, signature = token.split(".")
    return kid, unb64url(payload), unb64url(signature)


def flip(data: bytes, bit: int) -> bytes:
    out = bytearray(data)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


def flip_in_part(token: str, part: str, bit: int) -> str:
    """``token`` with one bit of its decoded payload or signature flipped, re-encoded
    canonically (so the framing stays valid and only the signature can catch it)."""
    kid, payload, signature = parts(token)
    if part == "payload":
        payload = flip(payload, bit)
    else:
        signature = flip(signature, bit)
    return f"{kid}.{b64url(payload)}.{b64url(signature)}"


def token_path(data: Path) -> Path:
    return data / TOKEN_FILENAME


def license_path(data: Path) -> Path:
    return data / LICENSE_FILENAME


def make_gate(data: Path, keys: dict[str, Ed25519PublicKey], clock: Clock, *,
              device: str = DEVICE) -> Gate:
    data.mkdir(parents=True, exist_ok=True, mode=0o700)
    return Gate(data, keys, device, wall=clock)


# ---------------------------------------------------------------------- a hub that signs


@dataclass
class SigningHub:
    """``create_hub_app`` with the hub's own signing key, on 127.0.0.1, over a real store."""

    data_dir: Path
    store: Store
    runner: web.AppRunner
    url: str
    token: str
    key: Ed25519PrivateKey

    async def issue(self, device: str) -> tuple[str, dict[str, Any]]:
        """``GET /v1/agent/entitlement?device_id=`` with the laptops' bearer token."""
        async with aiohttp.ClientSession() as session, session.get(
                self.url + "/v1/agent/entitlement", params={"device_id": device},
                headers={"Authorization": f"Bearer {self.token}"}) as resp:
            assert resp.status == 200, await resp.text()
            body = await resp.json()
        return str(body["token"]), dict(body["claims"])

    async def count(self, sql: str) -> int:
        rows = await self.store._fetch(sql)
        return int(rows[0][0] or 0)

    async def close(self) -> None:
        await self.runner.cleanup()
        await self.store.close()


async def start_signing_hub(data_dir: Path, *, lifetime_days: float = 7.0) -> SigningHub:
    store = await Store.open(data_dir, embedder=HashingEmbedder(), feed=True)
    token = await asyncio.to_thread(create_token, data_dir, role="write", name="laptops")
    book = await asyncio.to_thread(TokenBook, data_dir)
    key = await asyncio.to_thread(load_or_create_key, data_dir)
    runner = web.AppRunner(create_hub_app(store, book, signing_key=key, config=HubConfig(
        token_lifetime_days=lifetime_days)))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    return SigningHub(data_dir, store, runner, f"http://127.0.0.1:{port}", token, key)


# ---------------------------------------------------------------------- processes


def now() -> int:
    return int(time.time())

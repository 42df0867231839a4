"""Invites: a one-use secret a new laptop trades for its own hub token (``syncd hub invite``
makes one, ``syncd join`` redeems it at ``POST /v1/invites/redeem``; docs/pairing.md).

Rules:
1. The invite's text (``invite_text``) carries the hub's URL, the invite's id, its secret and
   the hub's entitlement public key (what ``join`` pins, so the key never comes from the
   network). The text is the only place the secret exists: the hub keeps its SHA-256.
2. Redeeming finds the invite by id and compares the SHA-256 of the offered secret with the
   stored one in constant time (``hmac.compare_digest``). An unknown id and a wrong secret get
   the same answer (``invite_unknown``); only a caller holding the secret learns that the
   invite was used, revoked or has expired.
3. Redeeming is atomic: the invite is marked used and its token created together — under one
   ``flock`` of the data directory on SQLite (``FileInvites``), in one transaction on
   PostgreSQL (``pg/invites.py``) — so two laptops racing with one invite get one token between
   them. On SQLite the invites file is replaced (used) before the token is added: a crash
   between the two spends the invite and grants nothing, never two tokens.
4. The token is a normal hub token with the invite's name, role and plan. A name an active
   token holds refuses the redeem (``name_taken``) and leaves the invite unused; creating an
   invite whose name an active token or a pending invite holds is refused.
5. Invites grant ``read`` or ``write``, never ``admin``. They expire (``MAX_LIFETIME_SECS``
   at most); times are the hub's clock as ``YYYY-MM-DDTHH:MM:SSZ`` text, as tokens' are, and an
   invite has expired when ``now >= expires_at``.
6. ``hub-invites.json`` follows ``hub-tokens.json``'s rules (``tokens.py``): 0600 in the 0700
   data directory, replaced atomically under the lock; one that others can read or write, or
   that does not parse, grants nothing (``TokenFileError``).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import re
import secrets
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal, Protocol

import msgspec

from protocol.errors import SyncdError
from syncd.entitlement.token import b64url, parse_public_key, unb64url
from syncd.hub.tokens import (
    TokenFileError,
    active_names,
    add_token_locked,
    check_new_token,
    locked,
    now_text,
    write_private,
)

INVITES_FILENAME = "hub-invites.json"
INVITE_PREFIX = "syncd-invite-1."
INVITE_ROLES = ("read", "write")
MAX_LIFETIME_SECS = 30 * 86400
MAX_INVITE_CHARS = 2048
REDEEM_PATH = "/v1/invites/redeem"
ID_PATTERN = re.compile(r"[0-9a-f]{12}")
SECRET_PATTERN = re.compile(r"[A-Za-z0-9_-]{43}")
State = Literal["pending", "used", "revoked", "expired"]


class InviteError(SyncdError):
    """A redeem the hub refuses: the class's ``status`` and ``code`` are its HTTP answer."""

    status, code = 401, "invite_unknown"


class InviteUnknown(InviteError):
    status, code = 401, "invite_unknown"


class InviteUsed(InviteError):
    status, code = 410, "invite_used"


class InviteRevoked(InviteError):
    status, code = 410, "invite_revoked"


class InviteExpired(InviteError):
    status, code = 410, "invite_expired"


class NameTaken(InviteError):
    status, code = 409, "name_taken"


class MalformedInvite(ValueError):
    """The text is not an invite (the message names the part that is wrong)."""


@dataclass(frozen=True, slots=True)
class Redeemed:
    name: str
    role: str
    plan: str
    token: str  # the raw token: returned once, to the redeeming laptop only


class Invite(msgspec.Struct, kw_only=True):
    id: str
    name: str
    role: str
    plan: str
    secret_sha256: str
    created_at: str
    expires_at: str
    used_at: str | None = None
    revoked_at: str | None = None


class _File(msgspec.Struct, kw_only=True):
    version: Literal[1]
    invites: list[Invite]


_DECODER = msgspec.json.Decoder(_File)
_ENCODER = msgspec.json.Encoder()
UNKNOWN = InviteUnknown("this hub knows no such invite (mistyped, or made for another hub); "
                        "ask for a new one")


class InviteStore(Protocol):
    async def create(self, *, name: str, role: str, plan: str, expires_at: str) -> tuple[str, str]:
        """A new pending invite: its ``(id, secret)``; the secret is shown once."""
        ...

    async def list(self) -> list[dict[str, str | None]]: ...

    async def revoke(self, invite_id: str, *, now: str) -> Invite | None:
        """Revoke a pending (or expired) invite; the invite as it was before, None if unknown.
        A used or revoked one is left as it is (the caller reads ``state`` of what came back)."""
        ...

    async def redeem(self, invite_id: str, secret: str, *, now: str) -> Redeemed:
        """The token the invite becomes (rules 2-4); ``InviteError`` otherwise."""
        ...


# --- the rules, shared by both stores ------------------------------------------------------------

def secret_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).hexdigest()


def new_invite_id() -> str:
    return secrets.token_hex(6)


def new_secret() -> str:
    return secrets.token_urlsafe(32)


def state(invite: Invite, now: str) -> State:
    if invite.used_at is not None:
        return "used"
    if invite.revoked_at is not None:
        return "revoked"
    return "expired" if now >= invite.expires_at else "pending"


def check_new_invite(*, name: str, role: str, plan: str) -> None:
    """A ``ValueError`` naming the field when a new invite's name, role or plan is bad."""
    if role not in INVITE_ROLES:
        raise ValueError(f"role: {role!r} is not one of {', '.join(INVITE_ROLES)} (an admin "
                         "token is made with `syncd hub token create`)")
    check_new_token(role=role, name=name, plan=plan)


def check_redeemable(invite: Invite | None, secret: str, now: str) -> Invite:
    """The invite when ``secret`` is its secret and it is pending; ``InviteError`` otherwise."""
    offered = secret_hash(secret)
    stored = invite.secret_sha256 if invite is not None else "0" * 64
    if not hmac.compare_digest(offered, stored) or invite is None:
        raise UNKNOWN
    found = state(invite, now)
    if found == "used":
        raise InviteUsed(f"this invite was already used (at {invite.used_at}); an invite works "
                         "once: ask for a new one")
    if found == "revoked":
        raise InviteRevoked(f"this invite was revoked (at {invite.revoked_at}); ask for a new "
                            "one")
    if found == "expired":
        raise InviteExpired(f"this invite expired at {invite.expires_at}; ask for a new one")
    return invite


def name_taken(name: str) -> InviteError:
    return NameTaken(f"an active token on the hub is already named {name!r}: revoke it (`syncd "
                     "hub token revoke --name …`) or ask for an invite with another --name; "
                     "this invite is still unused")


def expires_at(lifetime_secs: float, now: datetime | None = None) -> str:
    when = (now or datetime.now(UTC)) + timedelta(seconds=lifetime_secs)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_lifetime(text: str) -> float:
    """``90s``, ``30m``, ``24h``, ``7d``: above 0 and at most ``MAX_LIFETIME_SECS``."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", text.strip())
    if match is None:
        raise ValueError(f"expires: {text!r} is not a duration like 30m, 24h or 7d")
    secs = float(match[1]) * _UNITS[match[2]]
    if not 0 < secs <= MAX_LIFETIME_SECS:
        raise ValueError(f"expires: {text!r} must be more than 0 and at most 30d")
    return secs


def invite_row(invite: Invite, now: str) -> dict[str, str | None]:
    """An invite as ``list`` shows it: never the secret's hash."""
    return {"id": invite.id, "name": invite.name, "role": invite.role, "plan": invite.plan,
            "state": state(invite, now), "created_at": invite.created_at,
            "expires_at": invite.expires_at, "used_at": invite.used_at,
            "revoked_at": invite.revoked_at}


# --- the invite's text -------------------------------------------------------------------------

class InviteText(msgspec.Struct, kw_only=True, frozen=True):
    url: str
    id: str
    secret: str
    key: str  # the hub's entitlement public key, as ``[entitlement] public_keys`` pins it


def invite_text(invite: InviteText) -> str:
    return INVITE_PREFIX + b64url(msgspec.json.encode(invite))


def parse_invite(text: str) -> InviteText:
    """The invite in ``text``; ``MalformedInvite`` naming what is wrong (never repeating a
    secret: only the text's length and start are shown)."""
    text = text.strip()
    if text.startswith("syncd_"):
        raise MalformedInvite("this is a hub token, not an invite (an invite starts with "
                              f"{INVITE_PREFIX!r}; `syncd hub invite` makes one)")
    if not text.startswith(INVITE_PREFIX):
        raise MalformedInvite(f"an invite starts with {INVITE_PREFIX!r}; this text starts "
                              f"with {text[:12]!r}")
    if len(text) > MAX_INVITE_CHARS:
        raise MalformedInvite(f"an invite is at most {MAX_INVITE_CHARS} characters; this one "
                              f"has {len(text)}")
    try:
        raw = unb64url(text[len(INVITE_PREFIX):])
        found = msgspec.json.decode(raw, type=InviteText)
    except (ValueError, msgspec.DecodeError) as exc:  # binascii.Error is a ValueError
        raise MalformedInvite(f"the invite is damaged (cut short or mistyped?): {exc}") from None
    return _checked(found)


def _checked(found: InviteText) -> InviteText:
    from syncd.config import ConfigError, ControlPlaneConfig
    try:
        url = ControlPlaneConfig(url=found.url).url or ""
    except ConfigError as exc:
        raise MalformedInvite(f"the invite's url: {exc}") from None
    if not ID_PATTERN.fullmatch(found.id):
        raise MalformedInvite("the invite's id is not 12 hex digits")
    if not SECRET_PATTERN.fullmatch(found.secret):
        raise MalformedInvite("the invite's secret is not 43 base64url characters")
    try:
        parse_public_key(found.key)
    except ValueError as exc:
        raise MalformedInvite(f"the invite's key: {exc}") from None
    return msgspec.structs.replace(found, url=url)


# --- rate limit ----------------------------------------------------------------------------------

class Attempts:
    """At most ``limit`` redeem attempts per client address per ``window`` seconds: a secret of
    256 bits needs no lockout, but a client looping on a wrong invite must not load the hub or
    flood its log. ``check`` says how long to wait (seconds) or None to go ahead."""

    def __init__(self, limit: int = 10, window: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit, self.window, self._clock = limit, window, clock
        self._seen: dict[str | None, list[float]] = {}

    def check(self, remote: str | None) -> int | None:
        now = self._clock()
        if len(self._seen) >= 1024 and remote not in self._seen:
            self._seen.clear()  # many addresses: forget them, never grow without bound
        recent = [t for t in self._seen.get(remote, []) if now - t < self.window]
        if len(recent) >= self.limit:
            self._seen[remote] = recent
            return max(1, int(recent[0] + self.window - now) + 1)
        self._seen[remote] = [*recent, now]
        return None


# --- SQLite hub: hub-invites.json ---------------------------------------------------------------

def _load(data_dir: Path) -> _File:
    path = data_dir / INVITES_FILENAME
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return _File(version=1, invites=[])
    with f:
        mode = stat.S_IMODE(os.fstat(f.fileno()).st_mode)
        if mode & 0o077:
            raise TokenFileError(f"{path} is mode {mode:o}, readable or writable by others; "
                                 f"run `chmod 600 {path}`")
        try:
            return _DECODER.decode(f.read())
        except msgspec.DecodeError as e:
            raise TokenFileError(f"{path} is not a valid invites file: {e}") from None


def _save(data_dir: Path, dir_fd: int, book: _File) -> None:
    write_private(data_dir, dir_fd, INVITES_FILENAME, msgspec.json.format(_ENCODER.encode(book)))


def create_invite(data_dir: Path, *, name: str, role: str, plan: str,
                  expires_at: str) -> tuple[str, str]:
    check_new_invite(name=name, role=role, plan=plan)
    with locked(data_dir) as dir_fd:
        book, now = _load(data_dir), now_text()
        if name in active_names(data_dir):
            raise ValueError(f"name: an active token is already named {name!r}")
        if any(i.name == name and state(i, now) == "pending" for i in book.invites):
            raise ValueError(f"name: a pending invite is already named {name!r} (`syncd hub "
                             "invite --list` shows it; `--revoke ID` ends it)")
        invite_id, secret = new_invite_id(), new_secret()
        while any(i.id == invite_id for i in book.invites):
            invite_id = new_invite_id()
        book.invites.append(Invite(id=invite_id, name=name, role=role, plan=plan,
                                   secret_sha256=secret_hash(secret), created_at=now,
                                   expires_at=expires_at))
        _save(data_dir, dir_fd, book)
    return invite_id, secret


def revoke_invite(data_dir: Path, invite_id: str, now: str) -> Invite | None:
    with locked(data_dir) as dir_fd:
        book = _load(data_dir)
        found = next((i for i in book.invites if i.id == invite_id), None)
        if found is None:
            return None
        before = msgspec.structs.replace(found)
        if state(found, now) in ("pending", "expired"):
            found.revoked_at = now
            _save(data_dir, dir_fd, book)
        return before


def redeem_invite(data_dir: Path, invite_id: str, secret: str, now: str) -> Redeemed:
    with locked(data_dir) as dir_fd:
        book = _load(data_dir)
        invite = check_redeemable(next((i for i in book.invites if i.id == invite_id), None),
                                  secret, now)
        if invite.name in active_names(data_dir):
            raise name_taken(invite.name)
        invite.used_at = now
        _save(data_dir, dir_fd, book)  # first (rule 3)
        token = add_token_locked(data_dir, dir_fd, role=invite.role, name=invite.name,
                                 plan=invite.plan)
    return Redeemed(name=invite.name, role=invite.role, plan=invite.plan, token=token)


class FileInvites:
    """``InviteStore`` over ``hub-invites.json``, on a worker thread."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir

    async def create(self, *, name: str, role: str, plan: str, expires_at: str) -> tuple[str, str]:
        return await asyncio.to_thread(create_invite, self.data_dir, name=name, role=role,
                                       plan=plan, expires_at=expires_at)

    async def list(self) -> list[dict[str, str | None]]:
        book, now = await asyncio.to_thread(_load, self.data_dir), now_text()
        return [invite_row(i, now) for i in book.invites]

    async def revoke(self, invite_id: str, *, now: str) -> Invite | None:
        return await asyncio.to_thread(revoke_invite, self.data_dir, invite_id, now)

    async def redeem(self, invite_id: str, secret: str, *, now: str) -> Redeemed:
        return await asyncio.to_thread(redeem_invite, self.data_dir, invite_id, secret, now)

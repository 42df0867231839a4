"""Hub API tokens: ``<data-dir>/hub-tokens.json``, hashed, 0600 inside a 0700 directory.

Rules:
1. Only the SHA-256 hex of a raw token is stored (the key of the plane's ``api_tokens`` table,
   contract §8). ``create_token`` returns the raw token once; it is never stored or logged.
2. Roles are ordered ``read < write < admin``; a token passes when its role is at least the need.
3. Writers hold ``flock`` on the data directory for the whole read-modify-write, and replace the
   file atomically (0600 temp file in the same directory, fsync, ``os.replace``, fsync the
   directory): concurrent ``token create`` runs lose nothing, readers never see half a file.
4. A missing file means no tokens. A file that does not parse, names a plan not in ``PLANS``, or
   that group/others can read or write, grants nothing: loading it raises ``TokenFileError`` (the hub answers 500, never 200).
5. ``TokenBook`` re-reads the file when its (inode, mtime_ns, size, mode) changes, so a token
   created or revoked by another process, or a ``chmod``, takes effect without restarting the
   hub. Every write is a new inode, so a change inside one mtime tick is still seen.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import secrets
import stat
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Literal, TypeGuard

import msgspec

from protocol.errors import SyncdError
from syncd.http.errors import AuthError, Forbidden, Unauthorized

__all__ = ["AuthError", "Forbidden", "TokenFileError", "Unauthorized"]

Role = Literal["read", "write", "admin"]
ROLE_RANK: dict[str, int] = {"read": 0, "write": 1, "admin": 2}
# A plan names the paid features its entitlements grant.
PLANS: dict[str, tuple[str, ...]] = {"free": (), "sync": ("sync",), "pro": ("sync", "graph")}
TOKENS_FILENAME = "hub-tokens.json"
MAX_NAME_LEN = 64
_BEARER = "Bearer "


class TokenFileError(SyncdError, ValueError):
    """The tokens file exists but cannot be trusted (corrupt, or exposed to other users)."""

    status, code = 500, "token_file"


class _Entry(msgspec.Struct, kw_only=True):
    name: str
    role: Role
    sha256: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]
    created_at: str
    revoked_at: str | None = None
    plan: str = "pro"  # what entitlements issued to this token's devices grant (PLANS)


class _File(msgspec.Struct, kw_only=True):
    version: Literal[1]
    tokens: list[_Entry]


_Key = tuple[int, int, int, int]  # (st_ino, st_mtime_ns, st_size, st_mode)
_DECODER = msgspec.json.Decoder(_File)
_ENCODER = msgspec.json.Encoder()


def role_allows(have: str, need: str) -> bool:
    return ROLE_RANK[have] >= ROLE_RANK[need]


def _is_role(value: str) -> TypeGuard[Role]:
    return value in ROLE_RANK


def token_hash(raw: str) -> str:
    """A header's bytes that are not UTF-8 reach us as surrogate escapes (aiohttp): hashed
    back as those bytes, such a token is simply unknown (401), never an encoding error (500)."""
    return hashlib.sha256(raw.encode("utf-8", "surrogateescape")).hexdigest()


def _key(st: os.stat_result) -> _Key:
    return st.st_ino, st.st_mtime_ns, st.st_size, st.st_mode


def _load(path: Path) -> tuple[_Key | None, _File]:
    """The file and the key it was read under; (None, empty) when it does not exist."""
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return None, _File(version=1, tokens=[])
    with f:
        st = os.fstat(f.fileno())
        if stat.S_IMODE(st.st_mode) & 0o077:
            raise TokenFileError(f"{path} is mode {stat.S_IMODE(st.st_mode):o}, readable or "
                                 f"writable by others; run `chmod 600 {path}`")
        try:
            book = _DECODER.decode(f.read())
        except msgspec.DecodeError as e:  # ValidationError is a DecodeError
            raise TokenFileError(f"{path} is not a valid tokens file: {e}") from None
    for i, t in enumerate(book.tokens):
        if t.plan not in PLANS:
            raise TokenFileError(f"{path} is not a valid tokens file: tokens[{i}].plan: "
                                 f"{t.plan!r} is not one of {', '.join(PLANS)}")
    return _key(st), book


class TokenBook:
    """Active tokens by hash, reloaded when the file changes (rule 5)."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / TOKENS_FILENAME
        self._state: tuple[_Key | None, dict[str, _Entry]] = (None, {})
        self._refresh()  # a corrupt file fails hub startup, not the first request

    def _refresh(self) -> dict[str, _Entry]:
        try:
            current: _Key | None = _key(self.path.stat())
        except FileNotFoundError:
            current = None
        if current != self._state[0]:  # (None, {}) is already right for a missing file
            key, book = _load(self.path)
            # One assignment: threads calling lookup see the old pair or the new one.
            self._state = (key, {t.sha256: t for t in book.tokens if t.revoked_at is None})
        return self._state[1]

    def lookup(self, raw: str) -> tuple[str, str] | None:
        # Keyed by the hash, so timing reveals nothing about the raw token.
        entry = self._refresh().get(token_hash(raw))
        return None if entry is None else (entry.name, entry.role)

    def by_hash(self, sha256: str) -> tuple[str, str, str] | None:
        """``(name, role, plan)`` of the active token whose SHA-256 hex is ``sha256``."""
        entry = self._refresh().get(sha256)
        return None if entry is None else (entry.name, entry.role, entry.plan)

    def plan_of(self, raw: str) -> str | None:
        entry = self._refresh().get(token_hash(raw))
        return None if entry is None else entry.plan


def authenticate(book: TokenBook, header: str | None, need: str) -> tuple[str, str]:
    """``(name, role)`` for ``Authorization: Bearer <token>`` with at least ``need``."""
    return check_role(book.lookup(bearer(header)), need)


def bearer(header: str | None) -> str:
    """The raw token of an ``Authorization`` header; 401 when there is none."""
    if header is None or not header.startswith(_BEARER):
        raise Unauthorized("missing Authorization: Bearer <token>")
    return header[len(_BEARER):].strip()


def check_role(found: tuple[str, str] | None, need: str) -> tuple[str, str]:
    """``found`` is ``(name, role)`` of the token or None: 401 unknown, 403 below ``need``."""
    if found is None:
        raise Unauthorized("unknown token")
    if not role_allows(found[1], need):
        raise Forbidden(f"token role `{found[1]}` below required `{need}`")
    return found


@contextlib.contextmanager
def locked(data_dir: Path) -> Iterator[int]:
    """The data directory, created 0700, opened and exclusively locked (rule 3)."""
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(data_dir, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)


def _save(data_dir: Path, dir_fd: int, book: _File) -> None:
    write_private(data_dir, dir_fd, TOKENS_FILENAME, msgspec.json.format(_ENCODER.encode(book)))


def write_private(data_dir: Path, dir_fd: int, filename: str, data: bytes) -> None:
    """Replace ``data_dir/filename`` with ``data`` (rule 3: a 0600 temp file, fsync, rename,
    fsync the directory); the caller holds ``locked(data_dir)``, whose fd is ``dir_fd``."""
    fd, tmp = tempfile.mkstemp(prefix=f".{filename}.", suffix=".tmp", dir=data_dir)  # 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data + b"\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, data_dir / filename)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    os.fsync(dir_fd)


def now_text() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_new_token(*, role: str, name: str, plan: str) -> None:
    """A ``ValueError`` naming the field when a new token's role, plan or name is bad."""
    if not _is_role(role):
        raise ValueError(f"role: {role!r} is not one of {', '.join(ROLE_RANK)}")
    if plan not in PLANS:
        raise ValueError(f"plan: {plan!r} is not one of {', '.join(PLANS)}")
    if not name or len(name) > MAX_NAME_LEN or not name.isprintable():
        raise ValueError(f"name: {name!r} must be 1-{MAX_NAME_LEN} printable characters")


def new_raw_token() -> str:
    return "syncd_" + secrets.token_urlsafe(32)


def create_token(data_dir: Path, *, role: str, name: str, plan: str = "pro") -> str:
    """Add a token and return it raw; the caller shows it once."""
    check_new_token(role=role, name=name, plan=plan)
    with locked(data_dir) as dir_fd:
        return add_token_locked(data_dir, dir_fd, role=role, name=name, plan=plan)


def add_token_locked(data_dir: Path, dir_fd: int, *, role: str, name: str, plan: str) -> str:
    """``create_token``'s work, for a caller already holding ``locked(data_dir)`` (an invite
    is redeemed and its token added under one lock: ``invites.py``)."""
    check_new_token(role=role, name=name, plan=plan)
    assert _is_role(role)
    _, book = _load(data_dir / TOKENS_FILENAME)
    if any(t.name == name and t.revoked_at is None for t in book.tokens):
        raise ValueError(f"name: an active token is already named {name!r}")
    raw = new_raw_token()
    book.tokens.append(_Entry(name=name, role=role, sha256=token_hash(raw), created_at=now_text(),
                              plan=plan))
    _save(data_dir, dir_fd, book)
    return raw


def active_names(data_dir: Path) -> set[str]:
    """The names of the active tokens (an invite's name must not be one)."""
    _, book = _load(data_dir / TOKENS_FILENAME)
    return {t.name for t in book.tokens if t.revoked_at is None}


def revoke_token(data_dir: Path, name: str) -> bool:
    """Revoke the active token called ``name``; False when there is none."""
    with locked(data_dir) as dir_fd:
        _, book = _load(data_dir / TOKENS_FILENAME)
        active = [t for t in book.tokens if t.name == name and t.revoked_at is None]
        for t in active:
            t.revoked_at = now_text()
        if active:
            _save(data_dir, dir_fd, book)
    return bool(active)


def list_tokens(data_dir: Path) -> list[dict[str, str | None]]:
    _, book = _load(data_dir / TOKENS_FILENAME)
    return [{"name": t.name, "role": t.role, "plan": t.plan, "created_at": t.created_at,
             "revoked_at": t.revoked_at} for t in book.tokens]

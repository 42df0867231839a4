"""The hub's entitlement signing key: ``<data-dir>/entitlement-key.pem`` (PKCS#8, 0600),
created on first use; its public half is what laptops pin (``syncd hub key``)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from local_store.db import fsync

KEY_FILENAME = "entitlement-key.pem"


class KeyFileError(ValueError):
    pass


def load_or_create_key(data_dir: Path) -> Ed25519PrivateKey:
    """The key in ``data_dir``, created on first use. The file appears whole or not at all: the
    PEM is written and fsynced under a temporary name, then hard-linked into place, so a
    second process starting at the same moment (or a crash) never finds it empty; the loser
    of the race loads the winner's key."""
    path = data_dir / KEY_FILENAME
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.exists():
        return load_key(path)
    pem = new_key_pem()
    fd, partial = tempfile.mkstemp(prefix=f".{KEY_FILENAME}.", dir=data_dir)  # 0600
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(pem)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(partial, path)
        except FileExistsError:
            return load_key(path)
        fsync(data_dir)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)
    return key_from_pem(pem, str(path))


def load_key(path: Path) -> Ed25519PrivateKey:
    if os.stat(path).st_mode & 0o077:
        raise KeyFileError(f"{path} is readable or writable by others; run `chmod 600 {path}`")
    return key_from_pem(path.read_bytes(), str(path))


def new_key_pem() -> bytes:
    """A new Ed25519 key as unencrypted PKCS#8 PEM."""
    return Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption())


def key_from_pem(pem: bytes, where: str) -> Ed25519PrivateKey:
    """The Ed25519 key in ``pem``; ``KeyFileError`` naming ``where`` otherwise."""
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except ValueError as exc:
        raise KeyFileError(f"{where} is not a PEM private key: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"{where} is not an Ed25519 key")
    return key

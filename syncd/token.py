"""The local API token: ``<data-dir>/api-token``, 0600 inside a 0700 directory.

A token file that other users can read is not trusted: it is replaced with a fresh token and a
warning (RELIABILITY L5). The token never appears in logs or URLs.

``read_token`` and ``token_path`` need only ``os``, ``stat`` and ``pathlib``: the prompt hook
(``syncd.hook``) reads the token on every prompt, so ``logging`` and ``secrets`` are imported
only by ``ensure_token``, which the daemon calls once.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

TOKEN_FILENAME = "api-token"


def token_path(data_dir: Path) -> Path:
    return data_dir / TOKEN_FILENAME


def ensure_token(data_dir: Path) -> str:
    """Read the token, creating (or replacing an exposed or empty) one as needed."""
    import logging
    log = logging.getLogger(__name__)
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    mode = stat.S_IMODE(data_dir.stat().st_mode)
    if mode & 0o077:
        log.warning("data directory %s was mode %o; tightening to 0700", data_dir, mode)
        data_dir.chmod(0o700)
    path = token_path(data_dir)
    if path.exists():
        mode = stat.S_IMODE(path.stat().st_mode)
        token = path.read_text(encoding="utf-8").strip()
        if mode & 0o077:
            log.warning("token file %s was readable by others (mode %o); replacing the token",
                        path, mode)
        elif token:
            return token
    return _write_new(path)


def read_token(path: Path) -> str:
    """For clients (CLI, MCP bridge): the token, or a clear error."""
    try:
        token = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        from syncd.storelock import store_in_use
        if store_in_use(path.parent):  # the daemon writes its token once its store is open
            raise FileNotFoundError(
                f"no API token at {path} yet: the daemon for {path.parent} is starting "
                "(its store is open); try again in a moment") from None
        raise FileNotFoundError(
            f"no API token at {path}; start the daemon once with `syncd run` to create it"
        ) from None
    if not token:
        raise ValueError(f"the API token file {path} is empty")
    return token


def _write_new(path: Path) -> str:
    import secrets
    token = secrets.token_urlsafe(32)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, token.encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return token

"""Where a hub keeps its data: ``sqlite`` (the data directory) or a PostgreSQL DSN, given on
the command line (``--store``), in the config (``[hub] store``) or — so the password never
shows in ``ps`` or in a world-readable config — in a credentials file (``--store-file``,
``[hub] store_file``): one line holding the DSN, mode 0600 (or 0640 with a group that is the
service's own; anything readable by others is refused)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

SCHEMES = ("postgresql://", "postgres://")


def check_store(value: str, field: str = "store") -> str | None:
    """None for SQLite, else the DSN; ``ValueError`` naming ``field`` otherwise."""
    text = value.strip()
    if text in ("", "sqlite"):
        return None
    if text.startswith(SCHEMES):
        return text
    raise ValueError(f"{field}: must be `sqlite` or a postgresql:// DSN, got "
                     f"{text.split('://', 1)[0] + '://…' if '://' in text else text!r}")


def read_store_file(path: Path) -> str:
    """The DSN in a credentials file (see the module doc)."""
    try:
        st = os.stat(path)
        if stat.S_IMODE(st.st_mode) & 0o007:
            raise ValueError(f"store_file: {path} is readable by others; run `chmod 600 {path}`")
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise ValueError(f"store_file: {path} does not exist") from None
    except OSError as exc:
        raise ValueError(f"store_file: {path}: {exc.strerror}") from None
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    if len(lines) != 1:
        raise ValueError(f"store_file: {path} must hold exactly one DSN line")
    dsn = check_store(lines[0], "store_file")
    if dsn is None:
        raise ValueError(f"store_file: {path} must hold a postgresql:// DSN")
    return dsn


def resolve_dsn(store: str | None, store_file: Path | None) -> str | None:
    """The DSN from ``--store``/``--store-file`` (at most one), or None for SQLite."""
    if store is not None and store_file is not None and check_store(store) is not None:
        raise ValueError("store: give either a DSN or a store_file, not both")
    if store_file is not None:
        return read_store_file(store_file.expanduser())
    return None if store is None else check_store(store)

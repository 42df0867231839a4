"""Whether a daemon or hub has a data directory's store open, asked without opening it.

The store's ``DataDirLock`` (``local_store.db``) holds an exclusive ``flock`` on
``<data-dir>/syncd.lock`` while the store is open. This module probes that lock with ``os`` and
``fcntl`` alone: the prompt hook reads the token on every prompt and, when the token is missing,
asks this; importing ``local_store`` would load SQLite, numpy and the store for one question.
``tests/syncd/test_token.py`` checks that the file name agrees with ``local_store.db``.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Final

STORE_LOCK_FILENAME: Final = "syncd.lock"


def store_in_use(data_dir: Path) -> bool:
    """Whether a process holds the store lock of ``data_dir`` (a shared probe, released at
    once)."""
    try:
        fd = os.open(data_dir / STORE_LOCK_FILENAME, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False

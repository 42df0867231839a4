"""The local SQLite memory store.

Rules of the package:
  * It never imports ``syncd`` and never does network I/O (enforced by import-linter).
  * Every mutation goes through one write path (``writes.py``) on one writer connection,
    inside one ``BEGIN IMMEDIATE`` transaction; reads use their own connections.
  * Every string that enters the store passes ``redact.strip_private`` first.
"""

from local_store.embed import Embedder, HashingEmbedder
from local_store.errors import (
    NotFoundError,
    StoreClosedError,
    StoreError,
    StoreFullError,
    StoreLockedError,
    StoreUnusableError,
    ValidationError,
)
from local_store.store import Store

__all__ = [
    "Embedder",
    "HashingEmbedder",
    "NotFoundError",
    "Store",
    "StoreClosedError",
    "StoreError",
    "StoreFullError",
    "StoreLockedError",
    "StoreUnusableError",
    "ValidationError",
]

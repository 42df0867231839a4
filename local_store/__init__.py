"""The local SQLite memory store.

Rules of the package:
  * It never imports ``syncd`` and never does network I/O (enforced by import-linter).
  * Every mutation goes through one write path (``writes.py``) on one writer connection,
    inside one ``BEGIN IMMEDIATE`` transaction; reads use their own connections.
  * Every string that enters the store passes ``redact.strip_private`` first.
  * ``Store`` is imported on first use (PEP 562 ``__getattr__``): a process that needs one
    module of the package — the embedding child, ``local_store.embed_worker`` — does not load
    the whole store with it (16 MB resident, bench/memory.py).
"""

from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
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


def __getattr__(name: str) -> Any:
    if name == "Store":
        from local_store.store import Store
        return Store
    raise AttributeError(f"module 'local_store' has no attribute {name!r}")

"""The local SQLite memory store.

Rules of the package:
  * It never imports ``syncd`` and never does network I/O (enforced by import-linter).
  * Every mutation goes through one write path (``writes.py``) on one writer connection,
    inside one ``BEGIN IMMEDIATE`` transaction; reads use their own connections.
  * Every string that enters the store passes ``redact.strip_private`` first.
  * The names below are imported on first use (PEP 562 ``__getattr__``): a process that needs
    one module of the package — the embedding child, ``local_store.embed_worker`` — loads
    neither the store (16 MB resident, bench/memory.py) nor msgspec with it.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_HOMES = {
    "Embedder": "local_store.embed",
    "HashingEmbedder": "local_store.embed",
    "NotFoundError": "local_store.errors",
    "Store": "local_store.store",
    "StoreClosedError": "local_store.errors",
    "StoreError": "local_store.errors",
    "StoreFullError": "local_store.errors",
    "StoreLockedError": "local_store.errors",
    "StoreUnusableError": "local_store.errors",
    "ValidationError": "local_store.errors",
}
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
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'local_store' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # found directly from now on
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])

"""``Store``: the memory store — the shell's connections and transactions, the services on it.

Open with ``await Store.open(data_dir)``; close with ``await store.close()``. Each concern is a
service, an attribute of the store (``local_store/services/``): ``memories`` (save, edit,
delete, read), ``graph`` (entities, notes, links, verdicts), ``versions`` (history,
conflicts), ``recall``, ``replication`` (the sync engine's and a hub's writes), ``feed`` (every
read of rows for replication and export), ``settings``, ``embedding`` (re-embedding) and
``maintenance`` (counts, size, checkpoints). The shell (``local_store/shell.py``) holds the
rules every one of them runs under; it knows none of them.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from local_store import db
from local_store.embed import Embedder
from local_store.reader import SyncReader
from local_store.services.embedding import Embedding
from local_store.services.feed import Feed
from local_store.services.graph import Graph
from local_store.services.maintenance import Maintenance
from local_store.services.memories import Memories
from local_store.services.recall import Recaller
from local_store.services.replication import Replication
from local_store.services.settings import Settings
from local_store.services.versions import Versions
from local_store.shell import Shell
from local_store.writes import Writer

__all__ = ["Store"]


class Store(Shell):
    """The shell with its services (the module's docstring)."""

    def __init__(self, data_dir: Path, embedder: Embedder, writer: Writer, reader: SyncReader,
                 lock: db.DataDirLock, pool: ThreadPoolExecutor, store_id: str) -> None:
        super().__init__(data_dir, embedder, writer, reader, lock, pool, store_id)
        self.settings = Settings(self)
        self.recall = Recaller(self, self.settings)
        self.memories = Memories(self, self.recall)
        self.graph = Graph(self)
        self.versions = Versions(self)
        self.replication = Replication(self)
        self.feed = Feed(self)
        self.embedding = Embedding(self)
        self.maintenance = Maintenance(self)

    async def _load(self) -> None:
        await super()._load()
        await self.settings.load()

"""``store.maintenance``: the store's counts, size on disk and WAL checkpoints, for status and ops.

Rules:
  * Nothing here changes a memory; a checkpoint runs on the writer thread (``Checkpointer``),
    so it never races a write.
"""

from __future__ import annotations

import asyncio

from local_store import db
from local_store.errors import StoreClosedError
from local_store.shell import Shell


class Maintenance:
    """Counts, size and checkpoints (``store.maintenance``)."""

    def __init__(self, shell: Shell) -> None:
        self._shell = shell

    async def stats(self) -> dict[str, int]:
        (counts,) = await self._shell._fetch(
            "SELECT (SELECT count(*) FROM memories WHERE deleted = 0), "
            "(SELECT count(*) FROM memories WHERE deleted = 1), "
            "(SELECT count(*) FROM edges WHERE deleted = 0), (SELECT count(*) FROM outbox)")
        return {"memories": counts[0], "tombstones": counts[1], "edges": counts[2],
                "outbox": counts[3]}

    async def indexed_vectors(self) -> int:
        """How many vectors recall ranks: the in-RAM index's, or while it is dropped until the
        next recall (``Shell.drop_index``), the stored vectors it will be rebuilt from."""
        shell = self._shell
        if not shell.index_stale:
            return len(shell.index)
        (row,) = await shell._fetch("SELECT count(*) FROM vectors WHERE model = ? AND dim = ?",
                                    (shell.embedder.model_id, shell.embedder.dim))
        return int(row[0])

    async def checkpoint(self) -> tuple[int, int, int]:
        """``wal_checkpoint(TRUNCATE)`` on the writer thread: copy the WAL into the database and
        truncate it when no reader still needs it. Returns SQLite's (busy, log, checkpointed)."""
        if self._shell._closed:
            raise StoreClosedError("the store is closed")
        return await self._shell.checkpointer.truncate()

    async def disk_bytes(self) -> int:
        """Bytes on disk of the database and its WAL/shared-memory files."""
        data_dir = self._shell.data_dir

        def size() -> int:
            return sum(p.stat().st_size for p in data_dir.glob(db.DB_FILENAME + "*")
                       if p.is_file())
        return await asyncio.get_running_loop().run_in_executor(None, size)

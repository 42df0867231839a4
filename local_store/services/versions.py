"""``store.versions``: a memory's kept versions and conflicts, restoring and reviewing them.

Rules (the history itself: ``local_store/versions.py``):
  * A restore is a new local edit (it syncs), embedded like a save; a conflict restored is
    reviewed. A dismiss marks a conflict reviewed and leaves the memory unchanged.
  * A purged memory has no history to show: it is ``not_found``.
"""

from __future__ import annotations

from typing import Any

from local_store import versions as version_store
from local_store.columns import NODE_COLUMNS, NODE_SELECT
from local_store.errors import NotFoundError
from local_store.records import normalise_memory_id
from local_store.records import preview as content_preview
from local_store.shell import Shell
from local_store.writes import Vector, Writer


class Versions:
    """A memory's history (``store.versions``)."""

    def __init__(self, shell: Shell) -> None:
        self._shell = shell

    async def history(self, memory_id: object) -> dict[str, Any]:
        """The memory's versions, newest first, the current one first (``reason`` current)."""
        mid = normalise_memory_id(memory_id)
        rows = await self._shell._fetch(NODE_SELECT + " WHERE id = ?", (mid,))
        current = dict(zip(NODE_COLUMNS, rows[0], strict=True)) if rows else None
        if current is None or (current["deleted"] and not current["content"]):
            raise NotFoundError(f"memory_id: memory {mid} not found")
        kept = await self._shell._fetch(version_store.LIST_SQL, (mid,))
        return {"memory_id": mid, "versions": [version_store.current_view(current)]
                + [version_store.version_view(r) for r in kept]}

    async def restore(self, memory_id: object, n: object) -> dict[str, Any]:
        """Make version ``n`` current: a new local edit (it syncs), embedded like a save.
        A conflict restored is reviewed."""
        mid, number = normalise_memory_id(memory_id), version_store.parse_n(n)
        found = await self._shell._fetch("SELECT content FROM memory_versions WHERE n = ? AND "
                                         "memory_id = ?", (number, mid))
        if not found:
            await self.history(mid)  # an unknown memory is named as such
            raise NotFoundError(f"n: version {number} of memory {mid} not found")

        def run(w: Writer, vectors: list[Vector | None]) -> dict[str, Any]:
            version = version_store.version_row(w, mid, number)
            current = w.node(mid)
            if current is None or (current["deleted"] and not current["content"]):
                raise NotFoundError(f"memory_id: memory {mid} not found")
            row = version_store.restored_row(current, version)
            same = vectors[0] is not None and row["content"] == found[0][0]
            w.put_node(row, vectors[0] if same else None)
            version_store.mark_reviewed(w, mid, number)
            return {"ok": True, "memory_id": mid, "restored": number,
                    "updated_at": row["updated_at"]}

        return await self._shell._write_embedded([found[0][0]], run)

    async def dismiss(self, memory_id: object, n: object) -> dict[str, Any]:
        """Mark conflict ``n`` reviewed; the memory is unchanged."""
        mid, number = normalise_memory_id(memory_id), version_store.parse_n(n)
        await self.history(mid)
        return await self._shell._write(lambda w: version_store.dismiss(w, mid, number))

    async def conflicts(self, limit: int = version_store.CONFLICT_LIST) -> dict[str, Any]:
        """Conflict versions not yet reviewed: their count and the newest ``limit``."""
        (count,) = await self._shell._fetch("SELECT count(*) FROM memory_versions WHERE "
                                            "reason = 'conflict' AND reviewed = 0")
        rows = await self._shell._fetch(version_store.OPEN_CONFLICTS_SQL, (limit,))
        return {"count": int(count[0]), "items": [
            {"memory_id": r[0], "n": r[1], "title": r[2], "content_preview": content_preview(r[3]),
             "updated_at": r[4], "origin": r[5]} for r in rows]}

    async def prune(self) -> int:
        """Forget versions older than the policy's age bound (the daemon runs it now and
        then; writes prune as they keep). Returns how many went."""
        return await self._shell._write(version_store.prune_old)

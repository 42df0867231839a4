"""``store.embedding``: giving every live memory a vector of the current embedder's model.

Rules:
  * A pass re-embeds what lacks a vector of the model (saved while the embedder failed, pulled
    with another model's vector), a batch per transaction; a memory changed meanwhile keeps
    the vector its new version got. Vectors are derived data: no new version, no outbox entry.
  * A batch the embedder fails on is embedded a text at a time: a text it cannot take is left
    without a vector (keyword recall still finds it) and the pass goes on past it. When every
    text of a batch fails, the embedder is what fails: the error is raised, and
    ``vectors_owed`` stays set.
  * A pass that ends without that clears ``vectors_owed``, unless something owed a vector
    meanwhile (a save the embedder failed, an apply): it never reads False while a pass is
    under way. Passes run one at a time (the daemon's and the one after a pull).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sqlite3
from collections.abc import Callable
from typing import Any

from local_store.shell import Shell
from local_store.writes import Vector, Writer

log = logging.getLogger("local_store")

_MISSING_VECTOR = ("FROM memories WHERE deleted = 0 AND content <> '' AND id NOT IN "
                   "(SELECT memory_id FROM vectors WHERE model = ?)")


class Embedding:
    """Re-embedding passes (``store.embedding``)."""

    def __init__(self, shell: Shell) -> None:
        self._shell = shell
        self._reembedding = asyncio.Lock()  # one re-embedding pass at a time

    async def reembed_missing(self, batch: int = 64,
                              progress: Callable[[int, int], None] | None = None) -> int:
        """Give every live memory a vector of the current embedder's model; returns how many.
        ``progress(done, total)`` is called after each batch (``total`` is counted at the
        start: memories saved meanwhile embed themselves)."""
        shell = self._shell
        async with self._reembedding:
            marks = shell._owed_marks
            count = await self._reembed_pass(batch, progress)
            if shell._owed_marks == marks:
                shell.vectors_owed = False
            return count

    async def _reembed_pass(self, batch: int,
                            progress: Callable[[int, int], None] | None) -> int:
        shell = self._shell
        model, done, after = shell.embedder.model_id, 0, -1
        total = int((await shell._fetch("SELECT count(*) " + _MISSING_VECTOR, (model,)))[0][0])
        while True:
            rows = await shell._fetch("SELECT id, content, local_seq " + _MISSING_VECTOR
                                      + " AND local_seq > ? ORDER BY local_seq LIMIT ?",
                                      (model, after, batch))
            if not rows:
                return done
            after = rows[-1][2]
            try:
                embedded = list(zip(rows, await shell._embed([r[1] for r in rows]), strict=True))
            except Exception:
                embedded = await self._embed_one_by_one(rows)
            items = [(r[0], r[1], v) for r, v in embedded]
            await shell._write(functools.partial(_put_embedded, items))
            done += len(items)
            if progress is not None:
                progress(done, max(total, done))

    async def _embed_one_by_one(self, rows: list[sqlite3.Row]) -> list[tuple[Any, Vector]]:
        embedded, failure = [], None
        for row in rows:
            try:
                (vector,) = await self._shell._embed([row[1]])
            except Exception as exc:
                failure = exc
                continue
            embedded.append((row, vector))
        if not embedded and failure is not None:
            raise failure
        if failure is not None:
            log.warning("re-embedding skipped %d memories the embedder %s fails on (%s); "
                        "keyword recall still finds them", len(rows) - len(embedded),
                        self._shell.embedder.model_id, failure)
        return embedded


def _put_embedded(items: list[tuple[str, str, Vector]], w: Writer) -> None:
    """Store re-embedded vectors unless the memory changed meanwhile (its new version embedded
    itself)."""
    for memory_id, content, vector in items:
        row = w.node(memory_id)
        if row is not None and not row["deleted"] and row["content"] == content:
            w.put_vector(memory_id, vector)

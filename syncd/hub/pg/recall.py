"""Recall on the PostgreSQL hub: the laptops' own pipeline (``local_store/recall.py``) over the
hub's tables, with two backend pieces swapped in.

  * Keyword leg: a GIN-indexed ``tsvector`` of each memory's words, split by the laptops'
    tokeniser (``keyword_words``), queried with one ``plainto_tsquery`` per word (so no user
    text is query syntax), AND-ed (strict) or OR-ed (relaxed), ranked by ``ts_rank_cd``.
  * Semantic leg: each hub process holds a float32 index of the ``vectors`` table
    (``VectorTail``), loaded at start and kept current by following the feed: a vector written
    by any process is searchable in every process within ``FOLLOW_SECS``. (Debian's PostgreSQL
    has no pgvector; with 384-d vectors, exact numpy cosine over the index is fast enough.)

The pipeline is synchronous (it runs on a worker thread); its SQL goes back to the event loop,
on one pooled connection, with ``?`` placeholders renumbered to ``$n``.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from local_store.arguments import redact_request
from local_store.embed import Embedder, from_blob
from local_store.ranking import fts_words, keyword_words
from local_store.recall import CAND_K, ROW_COLUMNS, ROW_SQL, Recall, Semantic
from local_store.records import parse_timestamp
from local_store.reference import Reference, load_reference
from local_store.vectors import VectorIndex
from protocol.query import QueryRequest, QueryResponse
from protocol.settings import MemorySettings
from syncd.hub.pg.marks import batch_end
from syncd.hub.pg.migrate import Conn

MARKS_PER_READ = 500
ROWS_PER_READ = 20_000
_PLACEHOLDER = re.compile(r"\?")


def keyword_text(title: str | None, content: str, tags: str) -> str:
    return keyword_words(f"{title or ''} {content} {tags}")


def numbered(sql: str) -> str:
    """``?`` placeholders as ``$1, $2, …`` (the pipeline's SQL has no literal question marks)."""
    counter = iter(range(1, 1 << 20))
    return _PLACEHOLDER.sub(lambda _: f"${next(counter)}", sql)


class PgRecall(Recall):
    def _keyword_rows(self, tokens: list[str], relaxed: bool, where: str,
                      params: list[object]) -> list[tuple[float, dict[str, Any]]]:
        words = fts_words(tokens, relaxed=relaxed)
        if not words:
            return []
        query = (" || " if relaxed else " && ").join(
            "plainto_tsquery('simple', ?)" for _ in words)
        rows = self._fetch(
            f"SELECT ts_rank_cd(m.fts, q.q), m.content, {ROW_SQL} "
            f"FROM (SELECT {query} AS q) AS q, memories m "
            f"WHERE m.fts @@ q.q AND {where} ORDER BY 1 DESC, m.id LIMIT {CAND_K}",
            [*words, *params])
        out = []
        for r in rows:
            row = dict(zip(ROW_COLUMNS, r[2:], strict=True))
            row["content"] = r[1]
            out.append((float(r[0]), row))
        return out


async def run_recall(conn: Conn, request: QueryRequest,
                     settings: MemorySettings, embedder: Embedder,
                     vectors: VectorTail) -> QueryResponse:
    request = redact_request(request)
    if request.as_of is not None:
        parse_timestamp(request.as_of, "as_of")
    started = time.perf_counter()
    loop = asyncio.get_running_loop()

    def fetch(sql: str, params: Sequence[object]) -> list[Any]:
        call = conn.fetch(numbered(sql), *params)
        return asyncio.run_coroutine_threadsafe(call, loop).result()

    def run() -> QueryResponse:
        semantic = None
        if len(vectors.index) and request.query.strip():
            vector = np.asarray(embedder.embed([request.query])[0], dtype=np.float32)
            if vector.any():
                semantic = Semantic(*vectors.index.snapshot(vector), vector=vector,
                                    reference=vectors.reference(embedder),
                                    index=vectors.index)
        return PgRecall(fetch, semantic, settings).run(request, "syncd", True, started)

    return await asyncio.to_thread(run)


class VectorTail:
    """This process's float32 index of one model's vectors, following the feed by ``seq``.
    Marks are read a batch at a time and whole (a transaction's vectors are never split), so
    the position is always the last mark fully applied."""

    def __init__(self, model: str, dim: int) -> None:
        self.index = VectorIndex(model, dim)
        self.seq = 0
        self._reference: Reference | None = None
        self._referencing = threading.Lock()

    def reference(self, embedder: Embedder) -> Reference | None:
        """The confident tier's generic texts under the model (``local_store/reference.py``),
        embedded by the first recall that needs them; None while the embedder fails."""
        with self._referencing:
            if self._reference is None:
                try:
                    self._reference = load_reference(embedder, None)
                except Exception:  # the next recall tries again; keyword evidence meanwhile
                    return None
            return self._reference

    async def catch_up(self, conn: Conn) -> int:
        applied = 0
        while True:
            # A transaction writes no more vectors than rows (or a re-embed batch of them), so
            # a process starting on a big database never holds more than one batch in flight.
            end = await batch_end(conn, self.seq, MARKS_PER_READ, ROWS_PER_READ)
            if end is None:
                return applied
            rows = await conn.fetch(
                "SELECT v.memory_id, v.vec FROM vectors v JOIN feed_tx f ON f.tx = v.tx "
                "WHERE f.seq > $1 AND f.seq <= $2 AND v.model = $3 ORDER BY f.seq",
                self.seq, end, self.index.model)
            changes: list[tuple[str, npt.NDArray[np.float32] | None]] = []
            for mid, blob in rows:
                values = None if blob is None else from_blob(blob)
                if values is not None and len(values) != self.index.dim:
                    values = None  # another width under this model name: never compared
                changes.append((mid, values))
            self.index.apply(changes)
            applied += len(changes)
            self.seq = int(end)

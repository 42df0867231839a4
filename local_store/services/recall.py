"""``store.recall``: the entry of hybrid recall, running its two legs on their own threads.

Rules (the ranking itself: ``local_store/recall.py``):
  * The keyword leg runs on the recall reader's thread; the query is embedded and compared
    with the in-RAM index on the query thread meanwhile (``_semantic_for``). The keyword leg's
    thread gets its work first: started second, it waited for a core until the product was
    done.
  * The semantic leg's future always settles (a refused or cancelled job fails it), so the
    recall waiting on it never hangs; a failing embedder leaves the keyword leg to answer alone.
  * Graph expansion runs unless the caller or the store's ``graph_gate`` says it may not; a
    gated recall says so (``gated``/``gate_reason``).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Mapping
from concurrent.futures import Future
from typing import TypeVar

import numpy as np

from local_store.arguments import query_request
from local_store.errors import StoreClosedError
from local_store.recall import Mode, Recall, Semantic
from local_store.records import parse_timestamp
from local_store.services.settings import Settings
from local_store.shell import Shell
from protocol.query import QueryRequest, QueryResponse

T = TypeVar("T")


class Recaller:
    """Hybrid recall over the store (``store.recall``)."""

    def __init__(self, shell: Shell, settings: Settings) -> None:
        self._shell, self._settings = shell, settings

    async def query(self, request: QueryRequest | Mapping[str, object], *,
                    mode: Mode = "syncd", graph: bool = True) -> QueryResponse:
        """Hybrid recall (``POST /v1/agent/memory/query``); ``graph=False`` when gated."""
        shell = self._shell
        if shell._closed:  # its thread pools are shut down: say so, as writes and reads do
            raise StoreClosedError("the store is closed")
        request = query_request(request)
        if request.as_of is not None:
            parse_timestamp(request.as_of, "as_of")
        started = time.perf_counter()
        gated = shell.graph_gate() if graph and shell.graph_gate is not None else None
        if mode != "keyword" and shell.index_stale:
            await shell.ensure_index()
        semantic: Future[Semantic | None] | None = None
        if mode != "keyword" and len(shell.index) and request.query.strip():
            semantic = Future()
        loop = asyncio.get_running_loop()
        engine = Recall(shell._recall_reader.fetch, semantic, self._settings.current,
                        memo=shell._recall_reader.memo)
        running = loop.run_in_executor(shell._recall_reader.pool, functools.partial(
            engine.run, request, mode, graph and gated is None, started))
        if semantic is not None:
            self._start_semantic(semantic, request.query)
        response = await running
        if gated is not None:
            response.gated, response.gate_reason = ["graph"], gated
        return response

    def _start_semantic(self, into: Future[Semantic | None], query: str) -> None:
        """Compute ``_semantic_for(query)`` on the query thread into ``into``."""
        try:
            job = self._shell._query_pool.submit(self._semantic_for, query)
        except BaseException as exc:  # the recall's own thread raises it
            into.set_exception(exc)
            return
        job.add_done_callback(functools.partial(_settle, into))

    def _semantic_for(self, query: str) -> Semantic | None:
        """On the query thread: embed the query and compare it with the index (a locked
        snapshot). OpenBLAS runs a large product on both cores, so the overlap with the
        keyword leg is partial."""
        shell = self._shell
        try:
            vector = np.asarray(shell._run_embedder([query])[0], dtype=np.float32)
        except Exception:  # logged; the keyword leg answers alone
            return None
        if not vector.any():
            return None
        return Semantic(*shell.index.snapshot(vector), vector=vector,
                        reference=shell._reference_now(), index=shell.index)


def _settle(into: Future[T], done: Future[T]) -> None:
    """Pass ``done``'s outcome on to ``into``."""
    if done.cancelled():
        into.set_exception(StoreClosedError("the store closed during recall"))
    elif (error := done.exception()) is not None:
        into.set_exception(error)
    else:
        into.set_result(done.result())

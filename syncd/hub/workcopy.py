"""MCP on a hub whose store is not a local store (PostgreSQL): the tool table runs on a
*working copy*, a local ``Store`` that replicates the ``HubStore`` through its own interface
(``feed`` in, ``apply`` out), as a laptop replicates with a hub. The tools (``syncd/tools.py``)
stay one table over one store type; nothing of them is written twice.

Rules:
  * One copy per hub process, in a temporary directory of its own, made by the first MCP
    request (a process that serves no MCP holds none) and deleted when the app stops. It holds
    every row of the hub, on disk and in its vector index: the cost of MCP on a PostgreSQL
    hub, per process that serves it.
  * Every JSON-RPC body is served as: push what the copy still owes the hub, read the hub's
    feed up to now, answer, push what the answer wrote. So a call sees every write committed
    before it began, through any process (reads are the hub's as of the call), and a write
    tool answers only once the hub holds what it wrote: another process's next call sees it.
  * Pulls leave out the copy's own versions (``exclude_origin``); a pushed row is applied by
    the hub's own ``apply`` (validated, redacted, last-writer-wins against every other
    process), and acknowledged only when applied. A row the hub refuses stays queued and is
    logged by id and field; it is retried with every later body.
  * A hub that cannot be reached makes the body a 503 + Retry-After (``StoreUnavailableError``),
    before any tool ran when the first push or the pull fails. When only the last push fails,
    the answer is lost but its writes are kept in the copy and pushed by the process's next
    MCP body; a process that stops before one comes loses them.
  * Counters (``list_memory_usage``) are the hub's own (``HubStore.usage``), never the copy's.
  * One lock orders the copy's pulls and pushes; the tools themselves run concurrently (the
    copy's writer thread serialises their writes).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from local_store import Store, ValidationError
from syncd.hub.store import HubStore
from syncd.mcp import McpServer
from syncd.tools import Surfacer

log = logging.getLogger("syncd.hub.mcp")

PULL_ROWS = 1000  # rows per feed page read into the copy
PUSH_ROWS = 500  # outbox items per push
KEEP_ALL_NS = 2**62  # as ``stage_push``'s ``keep_within_ns``: nothing is re-stamped


class WorkingCopy:
    """A local store replicating ``hub`` (rules above). ``open`` on first use, ``close`` once."""

    def __init__(self, hub: HubStore) -> None:
        self.hub = hub
        self._store: Store | None = None
        self._dir: Path | None = None
        self._cursor: str | None = None
        self._open_lock, self._sync_lock = asyncio.Lock(), asyncio.Lock()

    async def store(self) -> Store:
        """The copy, opened and filled on the first call."""
        async with self._open_lock:
            if self._store is None:
                self._dir = Path(await asyncio.to_thread(tempfile.mkdtemp,
                                                         prefix="syncd-hub-mcp-"))
                self._store = await Store.open(self._dir, embedder=self.hub.embedder)
                log.info("MCP working copy opened in %s", self._dir)
            return self._store

    async def sync(self) -> None:
        """Push what the copy owes the hub, then pull the hub's feed up to now."""
        store = await self.store()
        async with self._sync_lock:
            await self._push(store)
            await self._pull(store)

    async def push(self) -> None:
        store = await self.store()
        async with self._sync_lock:
            await self._push(store)

    async def _pull(self, store: Store) -> None:
        model = self.hub.embedder.model_id
        applied = 0
        while True:
            nodes, edges, until, more = await self.hub.feed(
                self._cursor, limit=PULL_ROWS, exclude_origin=store.replica_id)
            if nodes or edges:
                result = await store.replication.pull(nodes, edges, model=model, state={}, until=until)
                applied += result.applied_nodes
                for problem in result.problems:  # the hub holds it; the copy cannot
                    log.warning("MCP working copy: %s %s not applied (%s: %s)", problem.kind,
                                problem.id, problem.field, problem.message[:200])
            self._cursor = until
            if not more:
                break
        if applied:  # rows the hub has no vector of yet: the copy's recall still ranks them
            await store.embedding.reembed_missing()

    async def _push(self, store: Store) -> None:
        """The outbox to the hub, ``PUSH_ROWS`` at a time, each version as the tool wrote it
        (nothing re-stamped: the hub's ingest feed never skips a late row). A refused row
        ends the push: it stays queued, first in the outbox, for the next one."""
        model, dim = self.hub.embedder.model_id, self.hub.embedder.dim
        while True:
            entries, nodes, edges = await store.replication.stage_push(PUSH_ROWS, model=model, dim=dim,
                                                           keep_within_ns=KEEP_ALL_NS)
            if not entries:
                return
            await store.replication.mark_sent(entries)  # the hub may hold them from now on
            result = await self.hub.apply(nodes, edges, model=model)
            refused = {(p.kind, p.index) for p in result.problems}
            for problem in result.problems:
                log.warning("MCP working copy: the hub refused %s %s (%s: %s); kept queued",
                            problem.kind, problem.id, problem.field, problem.message[:200])
            await store.replication.ack_push([e for kind in ("node", "edge") for i, e in enumerate(
                [e for e in entries if e[0] == kind]) if (kind, i) not in refused])
            if refused or len(entries) < PUSH_ROWS:
                return

    async def close(self) -> None:
        if self._store is not None:
            await self._store.close()
            self._store = None
        if self._dir is not None:
            await asyncio.to_thread(shutil.rmtree, self._dir, True)
            self._dir = None


NUL_MESSAGE = "must not contain the NUL character (U+0000)"


def refuse_nul(arguments: Mapping[str, Any]) -> None:
    """PostgreSQL text cannot hold U+0000: a tool call whose arguments hold it is refused,
    naming the field (``content``, ``tags[1]``, ``edges[0].target``), before the working copy
    stores what the database would then refuse on every push."""
    field = _nul_path(arguments, "")
    if field is not None:
        raise ValidationError(field or "arguments", NUL_MESSAGE)


def _nul_path(value: object, path: str) -> str | None:
    if isinstance(value, str):
        return path if "\x00" in value else None
    if isinstance(value, Mapping):
        for key, item in value.items():
            here = f"{path}.{key}" if path else str(key)
            if "\x00" in str(key):
                return here
            if (found := _nul_path(item, here)) is not None:
                return found
    if isinstance(value, list):
        for i, item in enumerate(value):
            if (found := _nul_path(item, f"{path}[{i}]")) is not None:
                return found
    return None


class CopyMcp:
    """The hub's MCP server on a ``WorkingCopy``: what ``syncd/http/app.py``'s ``mcp`` route
    calls (``handle_bytes``), each body between a sync and a push (rules above)."""

    def __init__(self, copy: WorkingCopy, surfacer: Surfacer) -> None:
        self.copy, self.surfacer = copy, surfacer
        self._server: McpServer | None = None

    async def handle_bytes(self, body: bytes) -> bytes | None:
        await self.copy.sync()
        if self._server is None:
            self._server = McpServer(await self.copy.store(), self.surfacer, check=refuse_nul)
        answer = await self._server.handle_bytes(body)
        await self.copy.push()
        return answer

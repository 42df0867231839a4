"""``store.replication``: the sync engine's and a hub's writes and state (apply, pull, stage, ack).

Rules (the writer-thread work itself: ``local_store/replica.py`` and ``apply.py``):
  * Remote rows apply last-writer-wins and idempotently; ``model`` names the embedder of their
    vectors. Vectors of this store's own model must be of its width (a row with another is
    refused, naming ``embedding``); another model's keep theirs. A batch apply skips SQLite's
    foreign-key check (``Shell._transaction`` says why that holds).
  * A pull's rows, the HLC's receipt of ``until`` and the new cursor commit together.
  * Staged rows are read with their vectors in the staging transaction: read after it, a save
    landing in between could pair a staged row with its next version's vector.
  * Applied rows may lack a vector of the embedder's model: the store is then owed one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from local_store import replica
from local_store.apply import ApplyResult, apply_batch
from local_store.feed import stored_vectors
from local_store.shell import Shell
from local_store.views import wire_edge, wire_embeddings, wire_nodes
from local_store.writes import Writer
from protocol.rows import EdgeRow, NodeRow


class Replication:
    """The sync engine's and the hub's writes and state (``store.replication``)."""

    def __init__(self, shell: Shell) -> None:
        self._shell = shell

    async def apply(self, nodes: Sequence[NodeRow], edges: Sequence[EdgeRow], *,
                    model: str, kept: tuple[str, ...] = ()) -> ApplyResult:
        """Apply remote rows (LWW, idempotent). ``kept``: node columns the sender never
        returns, whose held values a row without them keeps (``apply.held_columns``)."""
        shell = self._shell
        node_list, edge_list = list(nodes), list(edges)
        dim = shell._width(model)
        result = await shell._write(lambda w: apply_batch(w, node_list, edge_list, model,
                                                             shell._hash_pool, dim=dim,
                                                             kept=kept),
                                    foreign_keys=False)
        if result.applied_nodes:  # rows of another model, or without a vector, need one
            shell._owe_vectors()
        return result

    async def pull(self, nodes: Sequence[NodeRow], edges: Sequence[EdgeRow], *, model: str,
                   state: Mapping[str, str | None], until: str | None = None,
                   kept: tuple[str, ...] = ()) -> ApplyResult:
        """Apply a pulled batch, let the HLC receive ``until``, and store ``state`` (the new
        cursor) — all in one transaction. ``kept`` as for ``apply``."""
        node_list, edge_list = list(nodes), list(edges)
        dim = self._shell._width(model)
        return await self._shell._write(
            lambda w: replica.pull(w, node_list, edge_list, model, state, until, dim=dim,
                                   kept=kept),
            foreign_keys=False)

    def expect_vectors(self, count: int, model: str) -> None:
        """A pull is about to apply up to ``count`` rows with ``model`` vectors for ids the
        index does not hold (``holds_vector``). When the in-RAM index has no room for them,
        it is dropped now and rebuilt when recall next needs it (``Shell.drop_index``):
        grown in place instead, the larger matrix and the old one it is copied from would be
        resident together beside the pull's own batches."""
        index = self._shell.index
        if count > 0 and model == index.model and not self._shell.index_stale \
                and len(index) + count > index.capacity:
            self._shell.drop_index()

    def holds_vector(self, memory_id: object) -> bool:
        """Whether the in-RAM index holds a vector for ``memory_id`` — from any thread, as a
        hint (a write landing meanwhile may change it): a pull counts the rows it will add
        with it, so a body of rows already held (a Kyma plane sends its whole feed every
        pass) makes no room for them again."""
        return isinstance(memory_id, str) and memory_id.strip() in self._shell.index

    async def sync_state(self) -> dict[str, str]:
        """The sync engine's persisted state (``meta`` keys ``sync.*``, prefix removed)."""
        rows = await self._shell._fetch("SELECT key, value FROM meta WHERE key LIKE 'sync.%'")
        return {r[0].removeprefix(replica.SYNC_PREFIX): r[1] for r in rows}

    async def set_sync_state(self, state: Mapping[str, str | None]) -> None:
        await self._shell._write(lambda w: replica.set_state(w, state))

    async def next_counter(self, name: str) -> int:
        """A durable counter (``meta`` key ``counter.<name>``): 1, 2, 3, … across restarts."""
        def run(w: Writer) -> int:
            value = int(w.meta(f"counter.{name}") or 0) + 1
            w.set_meta(f"counter.{name}", str(value))
            return value
        return await self._shell._write(run)

    async def correct_clock(self, offset_ns: int) -> bool:
        """Use ``offset_ns`` (to the plane's clock) from now on; when the HLC had run ahead of
        the corrected time by more than the drift bound, pull it back. True if it was. (Queued
        edits it stamped meanwhile are stamped again when staged: ``replica.stage``.)"""
        def run(w: Writer) -> bool:
            w.clock.offset_ns = offset_ns
            now = w.clock.physical_ns()
            ahead = w.clock.last_ns > now + w.clock.max_drift_ns
            if ahead:
                w.clock.rewind(now)
            replica.set_state(w, {"clock_offset_ns": str(offset_ns)})
            return ahead
        return await self._shell._write(run)

    async def stage_push(self, limit: int, *, model: str, dim: int, realm: str | None = None,
                         keep_within_ns: int = 0,
                         ) -> tuple[list[replica.Entry], list[NodeRow], list[EdgeRow]]:
        """Stage up to ``limit`` queued items (re-stamping those older than ``keep_within_ns``)
        and return them as wire rows. Each node carries its ``model`` vector, or zeros when
        there is none or it is not ``dim`` wide (the plane requires a vector of its width; a
        syncd hub reads zeros as none, and the sync engine sends a Kyma plane no zeros it could
        rank: ``syncd.sync.staged.Prepare.plane_vectors``)."""
        def run(w: Writer) -> tuple[replica.Staged, list[tuple[str, bytes]]]:
            staged = replica.stage(w, limit, realm, keep_within_ns)
            ids = [row["id"] for row in staged.nodes]
            return staged, stored_vectors(w.fetch, ids, model)
        staged, found = await self._shell._write(run)
        nodes = wire_nodes(staged.nodes, wire_embeddings(found), dim)
        return staged.entries, nodes, [wire_edge(row) for row in staged.edges]

    async def outbox_depth(self) -> int:
        (row,) = await self._shell._fetch("SELECT count(*) FROM outbox")
        return int(row[0])

    async def mark_sent(self, entries: Sequence[replica.Entry]) -> list[replica.Sent]:
        """Before a push goes out: the plane may hold these versions from now on."""
        items = list(entries)
        return await self._shell._write(lambda w: replica.mark_sent(w, items))

    async def unmark_sent(self, before: Sequence[replica.Sent]) -> None:
        """The push never reached the plane: back to what ``mark_sent`` found."""
        items = list(before)
        await self._shell._write(lambda w: replica.unmark_sent(w, items))

    async def ack_push(self, entries: Sequence[replica.Entry]) -> int:
        items = list(entries)
        return await self._shell._write(lambda w: replica.ack(w, items))

    async def requeue_unseen(self, remote_nodes: Mapping[str, str],
                             remote_edges: Mapping[str, str], *, realm: str | None = None,
                             state: Mapping[str, str | None] | None = None) -> tuple[int, int]:
        """The second half of a paged anti-entropy (after each page went through ``apply``):
        queue what the plane lacks or holds older; maps from ``replica.remote_versions``."""
        return await self._shell._write(lambda w: replica.requeue_unseen(
            w, remote_nodes, remote_edges, realm, state or {}))

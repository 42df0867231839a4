"""Anti-entropy: a full diff against the plane's export — its rows applied page by page, then
whatever the plane lacks or holds older queued again — and what the plane says its model is.

Rules:
  * Only id → version maps of the export are kept, not its rows; a spooled page is applied a
    batch at a time. An export row that cannot be read is recorded at ``UNREAD``, after every
    canonical version, so the local copy of that id is not re-queued over a row nobody here
    has seen.
  * A walk ends with an error, never loops, when the export's ``next_cursor`` was already
    walked.
  * ``resync_pending`` (a suspected reset) and ``restored_outbox`` (a store restored from a
    backup) are cleared only in the transaction that re-queues what the plane lacks
    (``Store.requeue_unseen``), so a failed pass cannot forget them.
  * A hub names its embedding model in its settings; the plane does not (then the configured
    ``control_plane.embedding_model`` is assumed).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from local_store.replica import RESTORED_OUTBOX, remote_versions
from protocol.rows import EdgeRow, ExportBody, NodeRow
from syncd.sync.context import NAMES_MODEL, RESYNC, Link, kept
from syncd.sync.plane import PlaneError, UnreadableRow, spooled_rows
from syncd.sync.pull import PAGE_ROWS
from syncd.sync.push import Push
from syncd.sync.status import PassReport

# The version anti-entropy records for an export row it could not read: after every canonical
# version, so the local copy of that id is not re-queued over a row nobody here has seen.
UNREAD = "\uffff"
Versions = tuple[dict[str, str], dict[str, str]]  # the plane's node and edge id → version


class AntiEntropy:
    """Diffs the store against the plane's export; pushes what it re-queued."""

    def __init__(self, link: Link, push: Push) -> None:
        self.link, self.push = link, push

    def due(self, state: dict[str, str]) -> bool:
        """Whether a full diff is due by the clock (``anti_entropy_secs`` since the last)."""
        last = int(state.get("anti_entropy_ns", "0") or 0)
        return self.link.wall() - last >= self.link.options.anti_entropy_secs * 1e9

    async def learn_plane_model(self) -> dict[str, str]:
        """A hub names its embedding model in its settings; the plane does not (then the
        configured ``control_plane.embedding_model`` is assumed)."""
        store = self.link.store
        self.link.admit()
        settings = await self.link.client.settings()
        model = settings.embedding_model or self.link.options.plane_model
        await store.replication.set_sync_state({"plane_model": model,
                                    NAMES_MODEL: "1" if settings.embedding_model else ""})
        return await store.replication.sync_state()

    async def run(self, report: PassReport) -> None:
        """Apply the plane's export page by page (only id → version maps are kept, not the
        rows), then queue whatever the plane lacks or holds older."""
        learnt = await self.learn_plane_model()
        remote: Versions = ({}, {})
        cursor: str | None = None
        walked: set[str] = set()  # the cursors of this walk: one met again is a loop
        while True:
            page = await self._apply_page(report, learnt, cursor, remote)
            if not page.has_more or page.next_cursor is None:
                break
            if page.next_cursor in walked:
                raise PlaneError(f"export: the plane's next_cursor {page.next_cursor!r} was "
                                 f"already walked: anti-entropy stopped")
            cursor = page.next_cursor
            walked.add(cursor)
        requeued = await self.link.store.replication.requeue_unseen(
            *remote, realm=self.link.options.realm,
            state={"anti_entropy_ns": str(self.link.wall()), RESYNC: None, RESTORED_OUTBOX: None})
        report.anti_entropy = True
        report.requeued += sum(requeued)
        if report.requeued:
            await self.push.run(report)

    async def _apply_page(self, report: PassReport, learnt: dict[str, str], cursor: str | None,
                          remote: Versions) -> ExportBody:
        """Fetch and apply one export page (a spooled one a batch at a time), adding its
        versions to ``remote``."""
        self.link.admit()
        unreadable: list[UnreadableRow] = []
        replication = self.link.store.replication
        page, spool = await self.link.client.export_spooled(
            self.link.options.realm, PAGE_ROWS, cursor, unreadable=unreadable,
            held=replication.holds_vector)
        try:
            if spool is not None:  # room for the rows it adds, made once (as a pull does)
                replication.expect_vectors(spool.new_nodes, learnt["plane_model"])
            parts = (spooled_rows(spool, unreadable) if spool is not None
                     else _one(page.memory_nodes, page.memory_edges))
            async for nodes, edges in parts:  # a spooled page a batch at a time
                applied = await self.link.store.replication.apply(nodes, edges, model=learnt["plane_model"],
                                                      kept=kept(learnt))
                report.pulled_nodes += applied.applied_nodes
                report.pulled_edges += applied.applied_edges
                remote_versions(nodes, edges, remote)
                del nodes, edges  # before the next batch is read: one batch held at a time
        finally:
            if spool is not None:
                spool.close()
        for row in unreadable:  # the plane holds a version of it: never pushed over blind
            if row.id is not None:
                remote[0 if row.kind == "node" else 1][row.id] = UNREAD
            self.link.health.note_skipped(
                f"export {row.kind} {row.id}: {row.field}: {row.message}")
        return page

async def _one(nodes: list[NodeRow], edges: list[EdgeRow],
               ) -> AsyncIterator[tuple[list[NodeRow], list[EdgeRow]]]:
    yield nodes, edges

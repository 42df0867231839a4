"""The push path of a pass: the outbox staged in pages, packed into import batches, and the
plane's answers — acknowledged rows, batches too large, refused rows, held-back rows.

Rules:
  * Push stages the outbox (local edits older than half the overlap window are re-stamped at
    push time, after the pull; repairs, and versions already sent once, keep their versions —
    see ``local_store/replica.py`` and docs/sync-causality.md), packs batches under
    ``push_batch_bytes``, halves a batch on 413, clears entries only on 2xx with no errors (per
    row when the plane reports rows; nothing when a row error names no row of the batch),
    halves a batch refused with errors that name no row until the refused rows are alone
    (``Push.bisect``), and stops the pass on any other failure. A row the plane refuses even
    alone (413, or errors), or refuses by a row error, stays queued and is skipped for the
    rest of the pass, which pushes the rest and ends ``held_back`` (no backoff: the plane
    answered).
  * Nothing is re-stamped in a pass whose pull stopped short: re-stamped, a stale local edit
    would beat a delete the pull has not reached yet (R12). Queued versions old enough to need
    it stay queued until a pull completes; recent ones are pushed as they are.
  * Entries are marked sent before the request and unmarked when the plane holds none of the
    batch (413, or a failure before it was sent), so a version the plane may hold keeps its
    stamp when sent again.
"""

from __future__ import annotations

import msgspec

from local_store.replica import needs_restamp, restamp_bound
from syncd.sync.context import NAMES_MODEL, Link
from syncd.sync.plane import PlaneError, TooLarge, Transient
from syncd.sync.staged import Prepare, keeps_private, label, pair_rows
from syncd.sync.status import PassReport

STAGE_ROWS = 2000
BISECT_SPLITS = 64  # a pass's halvings of batches the plane refused naming no row
PLANE_DIM = 384
KEEP_ALL_NS = 2**62  # as ``keep_within_ns``: staging re-stamps nothing
_encoder = msgspec.json.Encoder()
Batch = list[tuple[tuple[str, str, int], bytes]]  # outbox entries with their encoded rows


class Push:
    """Pushes the outbox to the plane."""

    def __init__(self, link: Link, prepare: Prepare) -> None:
        self.link, self.prepare = link, prepare

    async def run(self, report: PassReport) -> bool:
        """Push the outbox; True if anything was sent. After a short pull nothing is re-stamped
        and versions old enough to need it stay queued (R12)."""
        store = self.link.store
        depth = await store.replication.outbox_depth()
        if not depth:
            return False  # the idle pass: one count, no state read, no write
        state = await store.replication.sync_state()
        model = self.link.plane_model(state)
        dim = store.embedder.dim if model == store.embedder.model_id else PLANE_DIM
        # Zeros are "no vector" to a syncd hub (it names its model); Kyma ranks them first.
        needs_vector = model != store.embedder.model_id and not state.get(NAMES_MODEL)
        local_only = not keeps_private(self.link.options.private_memories, state)
        keep = int(self.link.options.overlap_secs * 1e9) // 2
        hold = report.pull_stopped
        held: set[str] = set()
        awaiting: set[str] = set()
        pushed = False
        for _ in range(depth // STAGE_ROWS + 2):
            entries, nodes, edges = await store.replication.stage_push(
                STAGE_ROWS, model=model, dim=dim, realm=self.link.options.realm,
                keep_within_ns=KEEP_ALL_NS if hold else keep)
            if not entries:
                break
            rows = pair_rows(entries, nodes, edges)
            if local_only:
                rows = await self.prepare.keep_private_local(rows, report)
            if needs_vector:
                rows, waiting = await self.prepare.plane_vectors(rows, model, report)
                awaiting |= waiting
            if hold:
                bound = restamp_bound(store.clock.physical_ns(), keep)
                held |= {label(e) for e, row in rows if needs_restamp(row.updated_at, bound)}
            # too large (refused alone) or refused row by row: tried once a pass
            skip = held | awaiting | set(report.push_too_large) | set(report.push_refused)
            items = [(e, _encoder.encode(row)) for e, row in rows if label(e) not in skip]
            for batch in pack(items, self.link.options.push_batch_bytes):
                await self.send(batch, report)
                pushed = True
            if len(entries) < STAGE_ROWS or not items:
                break
        report.push_held = max(report.push_held, len(held))
        report.push_awaiting_vector = max(report.push_awaiting_vector, len(awaiting))
        self.link.health.status.awaiting_vector = report.push_awaiting_vector
        return pushed

    async def send(self, batch: Batch, report: PassReport) -> None:
        """Send one batch and settle its entries by the plane's answer."""
        nodes = [raw for (kind, _, _), raw in batch if kind == "node"]
        edges = [raw for (kind, _, _), raw in batch if kind == "edge"]
        body = b'{"memory_nodes":[' + b",".join(nodes) + b'],"memory_edges":[' + \
            b",".join(edges) + b"]}"
        self.link.admit()
        before = await self.link.store.replication.mark_sent([e for e, _ in batch])
        try:
            result = await self.link.client.import_rows(body)
        except (TooLarge, Transient) as exc:
            if isinstance(exc, TooLarge) or exc.unsent:  # the plane holds none of it
                await self.link.store.replication.unmark_sent(before)
            if isinstance(exc, Transient):
                raise
            if len(batch) == 1:  # too large even alone: it stays queued, the rest still go
                report.push_too_large.append(label(batch[0][0]))
                return
            report.push_splits += 1
            half = len(batch) // 2
            await self.send(batch[:half], report)
            await self.send(batch[half:], report)
            return
        report.push_requests += 1
        if result.error:
            raise PlaneError(f"import: {result.error}")
        node_entries = [e for e, _ in batch if e[0] == "node"]
        edge_entries = [e for e, _ in batch if e[0] == "edge"]
        refused: set[tuple[str, int]] = set()
        if result.errors or result.row_errors:
            if not result.row_errors:  # the plane's all-or-nothing, naming no row
                await self.bisect(batch, result.errors, report)
                return
            sizes = {"node": len(node_entries), "edge": len(edge_entries)}
            stray = [r for r in result.row_errors if not 0 <= r.index < sizes.get(r.kind, 0)]
            if stray:  # which rows the plane refused is unknown: keep every entry
                raise PlaneError(
                    f"import reported a row error for {stray[0].kind} {stray[0].index}, no row "
                    f"of this batch ({sizes['node']} nodes, {sizes['edge']} edges): nothing "
                    f"acknowledged: {stray[0].message[:200]}")
            refused = {(r.kind, r.index) for r in result.row_errors}
            report.push_row_errors += len(refused)
        accepted = [e for i, e in enumerate(node_entries) if ("node", i) not in refused]
        accepted += [e for i, e in enumerate(edge_entries) if ("edge", i) not in refused]
        await self.link.store.replication.ack_push(accepted)
        report.pushed_nodes += sum(1 for e in accepted if e[0] == "node")
        report.pushed_edges += sum(1 for e in accepted if e[0] == "edge")
        if refused:  # they stay queued; the rest of the outbox still goes (a refused row
            # first in the outbox must not hold back every row after it, pass after pass)
            said = result.errors or [r.message for r in result.row_errors or ()]
            report.push_refused += [label(e) for i, e in enumerate(node_entries)
                                    if ("node", i) in refused]
            report.push_refused += [label(e) for i, e in enumerate(edge_entries)
                                    if ("edge", i) in refused]
            report.push_refusal = report.push_refusal or said[0][:200]

    async def bisect(self, batch: Batch, errors: list[str], report: PassReport) -> None:
        """The plane refused ``batch`` naming no row (its import is all-or-nothing per table):
        nothing of it is acknowledged, and its halves are sent apart until the refused rows
        are alone. Only they stay queued (tried again next pass, named in the report and in
        status); the rest goes in this pass. Import is idempotent, so a half the plane had
        partly written (its other table) is safely sent again. At most ``BISECT_SPLITS`` splits
        a pass (one bad row in 500 takes 9): a plane that refuses everything fails the pass
        with what it said, the rest still queued."""
        said = "; ".join(errors)[:300]
        if len(batch) == 1:
            report.push_refused.append(label(batch[0][0]))
            report.push_refusal = report.push_refusal or said[:200]
            return
        if report.push_bisections >= BISECT_SPLITS:
            raise PlaneError(f"import reported errors naming no row, and {BISECT_SPLITS} smaller "
                             f"batches did not single out the refused rows: {said}")
        report.push_bisections += 1
        half = len(batch) // 2
        await self.send(batch[:half], report)
        await self.send(batch[half:], report)


def pack(items: Batch, budget: int) -> list[Batch]:
    """Greedy batches whose encoded body stays under ``budget`` bytes (a lone row that is
    bigger goes alone: the plane answers 413 and the row stays queued, reported)."""
    batches: list[Batch] = []
    current: Batch = []
    size = 64
    for item in items:
        if current and size + len(item[1]) + 1 > budget:
            batches.append(current)
            current, size = [], 64
        current.append(item)
        size += len(item[1]) + 1
    if current:
        batches.append(current)
    return batches

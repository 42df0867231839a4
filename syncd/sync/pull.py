"""The pull path of a pass: ``changes`` pages from the stored cursor, applied with their cursor
(spooled bodies a batch at a time), rows that cannot be applied, and a plane reset.

Rules:
  * Pull ``changes?since=`` the stored cursor minus the overlap window (none against a hub
    that says its feed follows ingest order). Each page's rows and its verbatim ``until`` commit
    in one transaction (``Store.pull``). A page with a row that cannot be applied does not
    advance the cursor; after ``BAD_ROW_PASSES`` passes with the same failure the cursor moves
    past it and the rows are reported as skipped, so one poisoned row cannot stall sync forever.
    A row that does not even fit the row schema (``plane.decode_rows``) counts the same.
  * An ``until`` that is not a timestamp (an empty one included) is not stored: the cursor
    stays, as Kyma's own client keeps it for an empty one.
  * A pull ends with an error, never loops, when the plane's paging does not advance: a page
    with ``has_more`` whose ``until`` is not after the ``since`` it answered (its rows are
    applied first).
  * The next page is fetched while this one is applied (the apply runs on the writer thread);
    a page is applied only after the one before it committed.
  * A reset is suspected when the plane's ``store_id`` changes or ``until`` goes backwards: the
    cursor restarts from the beginning (the learnt ``plane_model`` and ``feed`` stay) and
    ``resync_pending`` is stored with it (``RESET_STATE``); anti-entropy clears it
    (``reconcile.py``), and a cursor-less pull does not count as a bootstrap meanwhile.
  * A cursor is never reset because of a transient error.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from protocol.rows import ChangesResponse
from protocol.timestamp import format_ns, parse_ns
from syncd.sync.clock import PlaneClock
from syncd.sync.context import RESYNC, Link, kept
from syncd.sync.plane import PlaneError, UnreadableRow, spooled_rows
from syncd.sync.spool import Spool
from syncd.sync.status import PassReport

log = logging.getLogger("syncd.sync")
PAGE_ROWS = 2000
FIRST_PAGE_ROWS = 250  # small, so applying starts early while the next page streams in
BAD_ROW_PASSES = 3
RESET_STATE: dict[str, str | None] = {"cursor": None, "plane_store_id": None, RESYNC: "1"}


class Pull:
    """Pulls the plane's feed into the store; remembers the rows that keep failing."""

    def __init__(self, link: Link, clock: PlaneClock) -> None:
        self.link, self.clock = link, clock
        self._bad_streak: tuple[str, int, int] | None = None  # rows, passes, the last pass
        self._skipped: set[str] = set()  # rows given up on: they no longer hold the cursor

    async def run(self, report: PassReport, state: dict[str, str]) -> bool:
        """Pull every page; True when a reset of the plane was detected (cursor restarted).
        The next page is fetched while this one is applied (the apply runs on the writer
        thread); a page is applied only after the one before it committed."""
        store, reset = self.link.store, False
        cursor = state.get("cursor")
        cursor_was_empty = cursor is None
        asked = self.since(cursor, state.get("feed"))  # the since of the page in flight
        fetch = asyncio.ensure_future(self.fetch_page(asked, FIRST_PAGE_ROWS))
        try:
            while True:
                page, unreadable, spool = await fetch
                try:
                    report.pull_pages += 1
                    await self.clock.estimate(report,
                                              page.until if page.feed != "ingest" else None)
                    suspicion = reset_suspected(state, cursor, page.until, page.store_id)
                    if suspicion and not reset:
                        log.warning("control plane reset suspected (%s): full resync", suspicion)
                        report.reset, reset, cursor_was_empty = suspicion, True, False
                        await store.replication.set_sync_state(RESET_STATE)
                        state, cursor, asked = after_reset(state), None, None
                        fetch = asyncio.ensure_future(self.fetch_page(None, FIRST_PAGE_ROWS))
                        continue
                    readable = is_stamp(page.until)
                    stuck = page.has_more and not (readable and advances(asked, page.until))
                    if page.has_more and not stuck:
                        asked = page.until
                        fetch = asyncio.ensure_future(self.fetch_page(page.until))
                    if not await self.apply_page(report, state, page, unreadable,
                                                 keep_cursor=not readable, spool=spool):
                        report.pull_stopped = True
                        return reset
                finally:
                    if spool is not None:
                        spool.close()
                if stuck:  # asking again would get this page again, forever
                    raise PlaneError(
                        f"changes: the plane's cursor does not advance: asked since "
                        f"{asked!r}, it answered until {page.until!r} with has_more; "
                        f"pull stopped there")
                if readable:
                    cursor, state = page.until, {**state, "cursor": page.until}
                else:  # as Kyma's own client does with an empty one: the cursor stays
                    report.cursor_kept = page.until
                    self.link.health.warn("changes: the plane's until %r is not a timestamp: "
                                          "the cursor stays at %r", page.until[:64], cursor)
                if not page.has_more:
                    if cursor_was_empty and RESYNC not in state and not report.pull_problems:
                        # a bootstrap from the beginning is a full export: no diff due for now
                        await store.replication.set_sync_state({"anti_entropy_ns": str(self.link.wall())})
                    return reset
        finally:  # a prefetched page not used: cancelled, and its failure (if any) read
            if not fetch.done():
                fetch.cancel()
            (left,) = await asyncio.gather(fetch, return_exceptions=True)
            if isinstance(left, tuple) and left[2] is not None:  # closing twice is harmless
                left[2].close()

    async def fetch_page(self, since: str | None, limit: int = PAGE_ROWS,
                         ) -> tuple[ChangesResponse, list[UnreadableRow], Spool | None]:
        """An ingest-feed hub leaves out this replica's own versions (a plane ignores the
        parameter, and already-held rows are skipped cheaply when they come back). A body
        too large to hold (a Kyma plane's whole feed) comes as its envelope and a ``Spool``."""
        self.link.admit()
        store = self.link.store
        unreadable: list[UnreadableRow] = []
        page, spool = await self.link.client.changes_spooled(
            since, self.link.options.realm, limit, store.replica_id, unreadable=unreadable,
            held=store.replication.holds_vector)
        return page, unreadable, spool

    async def apply_page(self, report: PassReport, state: dict[str, str],
                         page: ChangesResponse, unreadable: list[UnreadableRow], *,
                         keep_cursor: bool = False, spool: Spool | None = None) -> bool:
        """Apply one page with its cursor (without it when ``keep_cursor``: an ``until`` that
        is no timestamp); False when the cursor must not move past it. Rows that could not be
        read hold the cursor as rows the store refuses do (R5). A spooled page is applied a
        batch at a time, and its cursor stored with its last batch: only once every row it
        covers is in."""
        store = self.link.store
        new_state: dict[str, str | None] = {
            "cursor": page.until, "feed": page.feed or "", "plane_store_id": page.store_id}
        if spool is None and not page.memory_nodes and not page.memory_edges and not (
                unreadable) and all(state.get(k) == v for k, v in new_state.items()):
            return True  # nothing new and nothing to record: no write transaction
        problems: list[Any] = []
        if spool is not None:
            store.replication.expect_vectors(spool.new_nodes, self.link.plane_model(state))
            async for nodes, edges in spooled_rows(spool, unreadable):
                batch = await store.replication.pull(nodes, edges, model=self.link.plane_model(state),
                                         state={}, until=page.until, kept=kept(state))
                _count_pulled(report, batch)
                problems += batch.problems
                del nodes, edges  # before the next batch is read: one batch held at a time
        if unreadable or keep_cursor or problems:
            del new_state["cursor"]
        result = await store.replication.pull(page.memory_nodes, page.memory_edges,
                                  model=self.link.plane_model(state), state=new_state,
                                  until=page.until, kept=kept(state))
        _count_pulled(report, result)
        problems = [*unreadable, *problems, *result.problems]
        if problems:
            report.pull_problems += len(problems)
            if not self.give_up_on(problems):
                return False
            if not keep_cursor:
                await store.replication.set_sync_state({"cursor": page.until})
        return True

    def since(self, cursor: str | None, feed: str | None) -> str | None:
        """The ``since`` to ask from: the cursor, less the overlap window unless the feed
        follows ingest order."""
        if cursor is None or feed == "ingest":
            return cursor
        overlap_ns = int(self.link.options.overlap_secs * 1e9)
        try:
            return format_ns(max(0, parse_ns(cursor) - overlap_ns))
        except ValueError:
            return None

    def give_up_on(self, problems: list[Any]) -> bool:
        """After the same rows failed ``BAD_ROW_PASSES`` times, skip them (and say so once);
        a plane that keeps serving them (an origin-ordered one does) no longer holds the
        cursor back."""
        keys = {f"{p.kind}:{p.id}:{p.field}" for p in problems}
        if keys <= self._skipped:
            return True
        key = ";".join(sorted(keys))
        if self._bad_streak and self._bad_streak[0] == key:
            # passes, not pulls: a pass that pushed pulls twice
            streak = self._bad_streak[1] + (self._bad_streak[2] != self.link.passes)
        else:
            streak = 1
        self._bad_streak = (key, streak, self.link.passes)
        if streak < BAD_ROW_PASSES:
            return False
        self._skipped |= keys
        self.link.health.status.skipped_rows.extend(
            f"{p.kind} {p.id}: {p.field}: {p.message}" for p in problems)
        log.error("skipping %d rows the plane keeps sending that cannot be applied: %s",
                  len(problems), key)
        self._bad_streak = None
        return True


def _count_pulled(report: PassReport, result: Any) -> None:
    report.pulled_nodes += result.applied_nodes
    report.pulled_edges += result.applied_edges
    report.future_rows += len(result.beyond_drift)


def reset_suspected(state: dict[str, str], cursor: str | None, until: str,
                    store_id: str | None) -> str | None:
    """Why the plane seems to have been reset (its store changed, its feed went back), or None."""
    known = state.get("plane_store_id")
    if known and store_id and known != store_id:
        return "store_id changed"
    if cursor:
        try:
            if parse_ns(until) < parse_ns(cursor):
                return "until went backwards"
        except ValueError:
            return None
    return None


def after_reset(state: dict[str, str]) -> dict[str, str]:
    """The state a reset leaves: cursor and plane identity gone, what was learnt kept."""
    return {k: v for k, v in state.items() if k not in RESET_STATE} | {RESYNC: "1"}


def is_stamp(text: str) -> bool:
    try:
        parse_ns(text)
    except ValueError:
        return False
    return True


def advances(since: str | None, until: str) -> bool:
    """Whether ``until`` is after ``since``: compared as instants (the plane's AutoSi strings
    do not sort with canonical ones), or, when either is not a timestamp, by being new."""
    if not since:
        return True
    try:
        return parse_ns(until) > parse_ns(since)
    except ValueError:
        return until != since

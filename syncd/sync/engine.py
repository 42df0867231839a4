"""The sync engine: one pass at a time — pull, push, pull again if anything was pushed, and a
full anti-entropy diff when it is due or a reset is suspected (ARCHITECTURE §5.3).

Rules:
  * Pull ``changes?since=`` the stored cursor minus the overlap window (none against a hub
    that says its feed follows ingest order). Each page's rows and its verbatim ``until`` commit
    in one transaction (``Store.pull``). A page with a row that cannot be applied does not
    advance the cursor; after ``BAD_ROW_PASSES`` passes with the same failure the cursor moves
    past it and the rows are reported as skipped, so one poisoned row cannot stall sync forever.
    A row that does not even fit the row schema (``plane.decode_rows``) counts the same.
  * An ``until`` that is not a timestamp (an empty one included) is not stored: the cursor
    stays, as Kyma's own client keeps it for an empty one.
  * A pass ends with an error, never loops, when the plane's paging does not advance: a
    ``changes`` page with ``has_more`` whose ``until`` is not after the ``since`` it answered
    (its rows are applied first), or an ``export`` ``next_cursor`` already walked.
  * Push stages the outbox (local edits older than half the overlap window are re-stamped at
    push time, after the pull; repairs, and versions already sent once, keep their versions —
    see ``local_store/replica.py`` and docs/sync-causality.md),
    packs batches under ``push_batch_bytes``, halves a batch on 413, clears entries only on 2xx
    with no errors (per row when the plane reports rows; nothing when a row error names no
    row of the batch), halves a batch refused with errors that name no row until the refused
    rows are alone (``_bisect``), and stops the pass on any other failure. A row the plane
    refuses even alone (413, or errors), or refuses by a row error, stays queued and is
    skipped for the rest of the pass, which pushes the rest and ends ``held_back`` (no
    backoff: the plane answered).
  * Nothing is re-stamped in a pass whose pull stopped short: re-stamped, a stale local edit
    would beat a delete the pull has not reached yet (R12). Queued versions old enough to need
    it stay queued until a pull completes; recent ones are pushed as they are.
  * A pass that reached its end but left queued rows behind (held by a short pull, or too
    large) is not ok: it reports ``held_back`` and why, without backing off (the plane
    answered).
  * Clock: each response's ``Date`` (and a plane's ``until``) estimates this machine's offset to
    the plane; an offset over ``OFFSET_MIN_NS`` is applied to every later stamp. One that puts
    the plane's clock outside ``PLAUSIBLE_NS`` is refused (a broken ``Date``, not a clock:
    applied, a Date in year 9999 stamped past what a timestamp holds and every write failed),
    reported until a sane one comes, and never stored — nor restored at start. This machine's
    own clock may be any distance off (an RTC reset to 1970): the plane's sane clock corrects it.
    Queued edits stamped while the clock ran beyond the drift bound are stamped again when
    staged, after the version each replaced (``local_store/replica.py``).
  * A store restored from a backup with a non-empty outbox (``restored_outbox``, set by
    ``restore``) runs anti-entropy before its first push: the outbox may hold versions this
    install superseded after the backup, and a hub leaves its own later versions out of
    ``changes``; applying the export replaces them (and drops their entries) first.
  * A reset is suspected when the plane's ``store_id`` changes or ``until`` goes backwards: the
    cursor restarts from the beginning (the learnt ``plane_model`` and ``feed`` stay) and
    ``resync_pending`` is stored with it. Anti-entropy runs in every pass while it is set; it is
    cleared only in the transaction that re-queues what the plane lacks, so a failed pass
    cannot forget the reset, and a cursor-less pull does not count as a bootstrap meanwhile.
  * Long-poll (docs/long-poll.md): against a plane whose ``changes`` answers advertise it
    (``PlaneClient.long_poll_secs``) and whose feed follows ingest order, ``watch`` holds
    ``changes?wait=`` requests from the stored cursor, each at most ``LONG_POLL_SECS``, and
    returns once the plane has a row after it: the caller then runs a pass, which pulls it.
    An empty answer moves only the watch's own ``since`` (never the stored cursor). A watch
    runs only while a scheduled pass would (not blocked on auth, not backing off, not
    gated); a failed poll raises, and the caller waits for its next pass. A pass cancels the
    poll it finds held and the watch polls again after it: never two requests at once (R22),
    and never a pass waiting on a poll.
  * Errors: 401/403 stop and block scheduled passes until a manual run; other failures back
    off exponentially (capped, jittered, at least ``Retry-After`` up to the cap — a value too
    large for a float is the cap). A cursor is never reset because of a transient error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import msgspec

from local_store import Store
from local_store.embed import Embedder
from local_store.replica import (
    RESTORED_OUTBOX,
    Entry,
    needs_restamp,
    remote_versions,
    restamp_bound,
)
from protocol.rows import NODE_LATE_COLUMNS, ChangesResponse, EdgeRow, NodeRow
from protocol.timestamp import format_ns, parse_ns
from syncd.sync.plane import (
    AuthFailed,
    PlaneClient,
    PlaneError,
    TooLarge,
    Transient,
    UnreadableRow,
    spooled_rows,
)
from syncd.sync.spool import Spool

log = logging.getLogger("syncd.sync")
PAGE_ROWS = 2000
FIRST_PAGE_ROWS = 250  # small, so applying starts early while the next page streams in
STAGE_ROWS = 2000
BISECT_SPLITS = 64  # a pass's halvings of batches the plane refused naming no row
BAD_ROW_PASSES = 3
OFFSET_MIN_NS = 2_000_000_000  # Date has 1 s resolution: smaller offsets are noise
# The instants a plane's clock is believed to read (its Date, its until): outside them it is a
# broken header, not a clock. The bound is on the plane's clock, not on the offset: a laptop
# whose clock reset years back must still be corrected (R9, R10), over http:// too.
PLAUSIBLE_NS = (parse_ns("2024-01-01T00:00:00Z"), parse_ns("2100-01-01T00:00:00Z"))
# The version anti-entropy records for an export row it could not read: after every canonical
# version, so the local copy of that id is not re-queued over a row nobody here has seen.
UNREAD = "\uffff"
BACKOFF_BASE_SECS = 1.0
BACKOFF_CAP_SECS = 600.0
LOG_EVERY_SECS = 60.0
PLANE_DIM = 384
LONG_POLL_SECS = 25.0  # the longest wait asked for (under a hub's 30 and most proxies' 60)
RESYNC = "resync_pending"  # sync state: a reset was detected, anti-entropy has not finished
PRIVATE_PREFIX = "private:"
NAMES_MODEL = "plane_names_model"  # sync state: "1" when the plane's settings name its model
HELD_BACK = "held_back"  # error_kind of a pass that reached its end but left rows behind
RESET_STATE: dict[str, str | None] = {"cursor": None, "plane_store_id": None, RESYNC: "1"}
KEEP_ALL_NS = 2**62  # as ``keep_within_ns``: staging re-stamps nothing
_encoder = msgspec.json.Encoder()


class _Closed(Exception):
    """The entitlement gate closed during a pass (the message is its reason)."""


@dataclass(slots=True)
class SyncOptions:
    realm: str | None = None
    plane_model: str = "bge-small-en-v1.5"
    private_memories: str = "auto"  # "auto", "push" or "local" (``_keeps_private``)
    overlap_secs: float = 120.0
    push_batch_bytes: int = 3 * 1024 * 1024 // 2
    anti_entropy_secs: float = 3600.0
    long_poll: bool = True  # use a plane's long-poll when it offers one


@dataclass(slots=True)
class PassReport:
    trigger: str
    started_at: str
    ok: bool = False
    pulled_nodes: int = 0
    pulled_edges: int = 0
    pull_pages: int = 0
    pull_problems: int = 0
    pull_stopped: bool = False  # a row that cannot be applied held the cursor (R5)
    pushed_nodes: int = 0
    pushed_edges: int = 0
    push_requests: int = 0
    push_splits: int = 0
    push_bisections: int = 0  # halvings of batches refused naming no row (``_bisect``)
    push_row_errors: int = 0
    push_too_large: list[str] = field(default_factory=list)  # refused alone (413): still queued
    push_refused: list[str] = field(default_factory=list)  # row errors: still queued
    push_refusal: str | None = None  # the plane's word on the first of them
    push_held: int = 0  # old queued versions kept back by a short pull: still queued
    push_kept_private: int = 0  # private memories a plane that drops space never gets
    push_awaiting_vector: int = 0  # memories with no vector of the plane's model: still queued
    push_vector_missing: str | None = None  # why none could be made (what to do)
    anti_entropy: bool = False
    requeued: int = 0
    reset: str | None = None
    future_rows: int = 0
    clock_rewound: bool = False
    clock_refused: str | None = None  # an absurd reading of the plane's clock, not applied
    cursor_kept: str | None = None  # an ``until`` that is no timestamp, not stored
    requests: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    took_ms: float = 0.0
    error: str | None = None
    error_kind: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class SyncStatus:
    url: str
    realm: str | None
    passes: int = 0
    failures: int = 0
    consecutive_failures: int = 0
    last_success: str | None = None
    last_error: str | None = None
    last_error_at: str | None = None
    auth_blocked: bool = False
    gated: str | None = None
    next_attempt_in_secs: float = 0.0
    clock_offset_ms: float = 0.0
    clock_offset_refused: str | None = None  # the plane's clock read absurd: not applied
    future_rows: int = 0
    drift_rejections: int = 0
    egress_refusals: int = 0
    skipped_rows: list[str] = field(default_factory=list)
    too_large_rows: list[str] = field(default_factory=list)  # as of the last pass that saw any
    awaiting_vector: int = 0  # as of the last pass: memories held for a plane-model vector
    totals: dict[str, int] = field(default_factory=dict)
    last_pass: dict[str, Any] | None = None


class SyncEngine:
    def __init__(self, store: Store, client: PlaneClient, options: SyncOptions, *,
                 wall: Callable[[], int] = time.time_ns,
                 gate: Callable[[], str | None] | None = None,
                 plane_embedder: Callable[[], Embedder] | None = None) -> None:
        """``gate`` answers None while sync may run, else why not (the entitlement gate).
        ``plane_embedder`` builds an embedder of the plane's model (it raises, saying what is
        missing, when it cannot): a memory the plane could rank and that has no vector of that
        model is embedded with it before it is pushed, or held (``_plane_vectors``)."""
        self.store, self.client, self.options = store, client, options
        self.gate = gate
        self._plane_embedder_factory = plane_embedder
        self._plane_embedder: Embedder | None = None
        self.status = SyncStatus(url=client.url, realm=options.realm)
        self._flight = asyncio.Lock()
        self._held: asyncio.Future[ChangesResponse | None] | None = None  # a long-poll
        self._wall = wall
        self._not_before = 0.0  # monotonic seconds
        self._bad_streak: tuple[str, int, int] | None = None  # rows, passes, the last pass
        self._passes = 0
        self._skipped: set[str] = set()  # rows given up on: they no longer hold the cursor
        self._last_log = 0.0

    async def start(self) -> None:
        """Restore the clock offset learnt by an earlier run (before the first pass). An
        absurd one (stored by a version without the bound) is dropped: applied, every stamp
        would fail; dropping it also pulls back an HLC it had dragged ahead."""
        state = await self.store.replication.sync_state()
        offset = int(state.get("clock_offset_ns", "0") or 0)
        if offset and not _plausible(self._wall() + offset):
            self._refuse_offset(self._wall() + offset, "the stored clock offset")
            await self.store.replication.correct_clock(0)
        elif offset:
            await self.store.replication.correct_clock(offset)
            self.status.clock_offset_ms = offset / 1e6

    async def close(self) -> None:
        await self.client.close()

    # ------------------------------------------------------------------ scheduling

    async def scheduled(self, trigger: str = "schedule") -> PassReport | None:
        """The scheduler's pass (a tick, a local write, a long-poll that saw rows): skipped
        while backing off or blocked on auth."""
        if self._held_off():
            return None
        return await self.run_pass(trigger)

    def _held_off(self) -> bool:
        return self.status.auth_blocked or time.monotonic() < self._not_before

    def long_poll_wait(self) -> float | None:
        """Seconds a long-poll may be held for now, or None: not offered by the plane (or
        turned off), or no scheduled pass would run now (auth, backoff, the gate)."""
        offered = self.client.long_poll_secs
        if not self.options.long_poll or offered is None or self._held_off() or (
                self.gate is not None and self.gate() is not None):
            return None
        return min(offered, LONG_POLL_SECS)

    async def watch(self) -> str | None:
        """Long-poll until the plane holds something after the stored cursor: returns that
        cursor (a pass should run), or None when no poll may run (``long_poll_wait``; no
        cursor yet, or a feed not in ingest order). A pass pre-empts the poll it finds held
        (``run_pass``); the watch then polls again from the cursor that pass left. Raises
        ``PlaneError`` as a request does."""
        while self.long_poll_wait() is not None:
            async with self._flight:  # behind every pass in flight or queued
                state = await self.store.replication.sync_state()
            cursor = state.get("cursor")
            if cursor is None or state.get("feed") != "ingest":
                return None
            if await self._poll_after(cursor, state.get("plane_store_id")):
                return cursor
        return None

    async def _poll_after(self, cursor: str, store_id: str | None) -> bool:
        """Polls from ``cursor`` until one finds something (True), or a pass pre-empts one or
        no poll may run (False)."""
        since = cursor
        while (wait := self.long_poll_wait()) is not None:
            self._held = asyncio.ensure_future(self.client.poll_changes(
                since, self.options.realm, self.store.replica_id, wait))
            try:
                page = await self._held
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise
                return False  # a pass started: it pulls what the poll was waiting for
            finally:
                self._held = None
            if page is None or page.memory_nodes or page.memory_edges or page.has_more or (
                    store_id and page.store_id and page.store_id != store_id):
                return True
            if page.until != since:
                if not (_is_stamp(page.until) and _advances(since, page.until)):
                    return True  # went backwards, or no timestamp: the pass judges it
                since = page.until  # only this replica's own versions came in between
        return False

    @contextlib.asynccontextmanager
    async def idle(self) -> AsyncIterator[None]:
        """Hold the single-flight lock: no pass runs inside (waits for one in flight)."""
        async with self._flight:
            yield

    async def run_pass(self, trigger: str = "manual") -> PassReport:
        """One full pass; concurrent callers queue behind the pass in flight. A held long-poll
        is cancelled first: a pass pulls anyway, and one request at a time goes out (R22)."""
        async with self._flight:
            if self._held is not None:  # set between passes only
                self._held.cancel()
            return await self._pass(trigger)

    async def _pass(self, trigger: str) -> PassReport:
        self._passes += 1
        report = PassReport(trigger=trigger, started_at=format_ns(self._wall()))
        gated = self.gate() if self.gate is not None else None
        if gated is not None:  # paused, not failed: no request, no backoff; writes queue up
            report.error, report.error_kind = f"sync is paused: {gated}", "gated"
            self.status.gated = gated
            self._record(report)
            return report
        self.status.gated = None
        started = time.perf_counter()
        before = (self.client.requests, self.client.bytes_in, self.client.bytes_out)
        try:
            state = await self.store.replication.sync_state()
            if "plane_model" not in state or NAMES_MODEL not in state:
                state = await self._learn_plane_model()
            reset = await self._pull(report, state)
            if RESTORED_OUTBOX in await self.store.replication.sync_state():
                await self._anti_entropy(report)  # before the restored outbox is pushed
            if await self._push(report):
                await self._pull(report, await self.store.replication.sync_state())
            state = await self.store.replication.sync_state()
            due = RESYNC in state or self._anti_entropy_due(state)
            if due or (reset and not report.anti_entropy):  # not twice for one reset
                await self._anti_entropy(report)
            report.error = _held_back(report)
            report.ok = report.error is None
            report.error_kind = None if report.ok else HELD_BACK
        except _Closed as exc:  # the gate closed mid-pass: paused, as at the start
            report.error, report.error_kind = f"sync is paused: {exc}", "gated"
            self.status.gated = str(exc)
        except PlaneError as exc:
            report.error, report.error_kind = str(exc), exc.kind
            self._failed(exc)
        finally:
            report.requests = self.client.requests - before[0]
            report.bytes_in = self.client.bytes_in - before[1]
            report.bytes_out = self.client.bytes_out - before[2]
            report.took_ms = round((time.perf_counter() - started) * 1000, 3)
            self._record(report)
        return report

    def _admit(self) -> None:
        """Before each request of a pass: the gate is asked again, so a licence that ends
        mid-pass (``exp`` is exact, E3) stops the pass before its next request, not after."""
        gated = self.gate() if self.gate is not None else None
        if gated is not None:
            raise _Closed(gated)

    def _failed(self, exc: PlaneError) -> None:
        status = self.status
        status.failures += 1
        status.consecutive_failures += 1
        status.last_error, status.last_error_at = str(exc), format_ns(self._wall())
        if isinstance(exc, AuthFailed):
            status.auth_blocked = True
            log.error("sync stopped: the control plane refused the token (%s); fix the file "
                      "named by control_plane.token_file, then run `syncd sync` (it re-reads "
                      "the file)", exc.status)
            return
        delay = min(BACKOFF_CAP_SECS, BACKOFF_BASE_SECS * 2 ** (status.consecutive_failures - 1))
        delay = random.uniform(delay / 2, delay)
        if exc.retry_after is not None and not math.isnan(exc.retry_after):
            # honoured up to the cap: a plane's "come back in 30 years" must not end sync, and
            # one too long for a float (inf) is no less a request for the longest pause
            delay = max(delay, min(exc.retry_after, BACKOFF_CAP_SECS))
        self._not_before = time.monotonic() + delay
        status.next_attempt_in_secs = round(delay, 3)
        self._warn("sync pass failed (%s), retrying in %.1f s: %s", exc.kind, delay, exc)

    def _warn(self, message: str, *args: object) -> None:
        """Rate-limited: one line a minute at most."""
        now = time.monotonic()
        if now - self._last_log >= LOG_EVERY_SECS:
            self._last_log = now
            log.warning(message, *args)

    def _record(self, report: PassReport) -> None:
        status = self.status
        status.passes += 1
        if report.ok or report.error_kind == HELD_BACK:  # the plane answered: no backoff
            status.consecutive_failures = 0
            status.auth_blocked = False
            status.next_attempt_in_secs = 0.0
            self._not_before = 0.0
        if report.ok:
            status.last_success = report.started_at
            status.too_large_rows = []
        elif report.error_kind == HELD_BACK:
            status.last_error, status.last_error_at = report.error, report.started_at
            self._warn("sync pass left rows behind: %s", report.error)
        if report.push_too_large:
            status.too_large_rows = list(report.push_too_large)
        status.future_rows += report.future_rows
        status.drift_rejections = self.store.clock.drift_rejections
        status.egress_refusals = self.client.egress_refusals
        for key in ("pulled_nodes", "pulled_edges", "pushed_nodes", "pushed_edges",
                    "requeued", "requests", "bytes_in", "bytes_out", "push_splits",
                    "push_bisections"):
            status.totals[key] = status.totals.get(key, 0) + int(getattr(report, key))
        status.last_pass = report.as_dict()

    # ------------------------------------------------------------------ pull

    async def _pull(self, report: PassReport, state: dict[str, str]) -> bool:
        """Pull every page; True when a reset of the plane was detected (cursor restarted).
        The next page is fetched while this one is applied (the apply runs on the writer
        thread); a page is applied only after the one before it committed."""
        reset = False
        cursor = state.get("cursor")
        cursor_was_empty = cursor is None
        asked = self._since(cursor, state.get("feed"))  # the since of the page in flight
        fetch = asyncio.ensure_future(self._fetch_page(asked, FIRST_PAGE_ROWS))
        try:
            while True:
                page, unreadable, spool = await fetch
                try:
                    report.pull_pages += 1
                    await self._estimate_offset(report,
                                                page.until if page.feed != "ingest" else None)
                    suspicion = self._reset_suspected(state, cursor, page.until, page.store_id)
                    if suspicion and not reset:
                        log.warning("control plane reset suspected (%s): full resync", suspicion)
                        report.reset, reset, cursor_was_empty = suspicion, True, False
                        await self.store.replication.set_sync_state(RESET_STATE)
                        state, cursor, asked = _after_reset(state), None, None
                        fetch = asyncio.ensure_future(self._fetch_page(None, FIRST_PAGE_ROWS))
                        continue
                    readable = _is_stamp(page.until)
                    stuck = page.has_more and not (readable and _advances(asked, page.until))
                    if page.has_more and not stuck:
                        asked = page.until
                        fetch = asyncio.ensure_future(self._fetch_page(page.until))
                    if not await self._apply_page(report, state, page, unreadable,
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
                    self._warn("changes: the plane's until %r is not a timestamp: the cursor "
                               "stays at %r", page.until[:64], cursor)
                if not page.has_more:
                    if cursor_was_empty and RESYNC not in state and not report.pull_problems:
                        # a bootstrap from the beginning is a full export: no diff due for now
                        await self.store.replication.set_sync_state({"anti_entropy_ns": str(self._wall())})
                    return reset
        finally:  # a prefetched page not used: cancelled, and its failure (if any) read
            if not fetch.done():
                fetch.cancel()
            (left,) = await asyncio.gather(fetch, return_exceptions=True)
            if isinstance(left, tuple) and left[2] is not None:  # closing twice is harmless
                left[2].close()

    async def _fetch_page(self, since: str | None, limit: int = PAGE_ROWS,
                          ) -> tuple[ChangesResponse, list[UnreadableRow], Spool | None]:
        """An ingest-feed hub leaves out this replica's own versions (a plane ignores the
        parameter, and already-held rows are skipped cheaply when they come back). A body
        too large to hold (a Kyma plane's whole feed) comes as its envelope and a ``Spool``."""
        self._admit()
        unreadable: list[UnreadableRow] = []
        page, spool = await self.client.changes_spooled(
            since, self.options.realm, limit, self.store.replica_id, unreadable=unreadable)
        return page, unreadable, spool

    async def _apply_page(self, report: PassReport, state: dict[str, str],
                          page: ChangesResponse, unreadable: list[UnreadableRow], *,
                          keep_cursor: bool = False, spool: Spool | None = None) -> bool:
        """Apply one page with its cursor (without it when ``keep_cursor``: an ``until`` that
        is no timestamp); False when the cursor must not move past it. Rows that could not be
        read hold the cursor as rows the store refuses do (R5). A spooled page is applied a
        batch at a time, and its cursor stored with its last batch: only once every row it
        covers is in."""
        new_state: dict[str, str | None] = {
            "cursor": page.until, "feed": page.feed or "", "plane_store_id": page.store_id}
        if spool is None and not page.memory_nodes and not page.memory_edges and not (
                unreadable) and all(state.get(k) == v for k, v in new_state.items()):
            return True  # nothing new and nothing to record: no write transaction
        problems: list[Any] = []
        if spool is not None:
            self.store.replication.expect_vectors(spool.counts.get("memory_nodes", 0),
                                      self._plane_model(state))
            async for nodes, edges in spooled_rows(spool, unreadable):
                batch = await self.store.replication.pull(nodes, edges, model=self._plane_model(state),
                                              state={}, until=page.until, kept=_kept(state))
                self._count_pulled(report, batch)
                problems += batch.problems
        if unreadable or keep_cursor or problems:
            del new_state["cursor"]
        result = await self.store.replication.pull(page.memory_nodes, page.memory_edges,
                                       model=self._plane_model(state), state=new_state,
                                       until=page.until, kept=_kept(state))
        self._count_pulled(report, result)
        problems = [*unreadable, *problems, *result.problems]
        if problems:
            report.pull_problems += len(problems)
            if not self._give_up_on(problems):
                return False
            if not keep_cursor:
                await self.store.replication.set_sync_state({"cursor": page.until})
        return True

    @staticmethod
    def _count_pulled(report: PassReport, result: Any) -> None:
        report.pulled_nodes += result.applied_nodes
        report.pulled_edges += result.applied_edges
        report.future_rows += len(result.beyond_drift)

    def _since(self, cursor: str | None, feed: str | None) -> str | None:
        if cursor is None or feed == "ingest":
            return cursor
        try:
            return format_ns(max(0, parse_ns(cursor) - int(self.options.overlap_secs * 1e9)))
        except ValueError:
            return None

    def _reset_suspected(self, state: dict[str, str], cursor: str | None, until: str,
                         store_id: str | None) -> str | None:
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

    def _give_up_on(self, problems: list[Any]) -> bool:
        """After the same rows failed ``BAD_ROW_PASSES`` times, skip them (and say so once);
        a plane that keeps serving them (an origin-ordered one does) no longer holds the
        cursor back."""
        keys = {f"{p.kind}:{p.id}:{p.field}" for p in problems}
        if keys <= self._skipped:
            return True
        key = ";".join(sorted(keys))
        if self._bad_streak and self._bad_streak[0] == key:
            # passes, not pulls: a pass that pushed pulls twice
            streak = self._bad_streak[1] + (self._bad_streak[2] != self._passes)
        else:
            streak = 1
        self._bad_streak = (key, streak, self._passes)
        if streak < BAD_ROW_PASSES:
            return False
        self._skipped |= keys
        self.status.skipped_rows.extend(f"{p.kind} {p.id}: {p.field}: {p.message}"
                                        for p in problems)
        log.error("skipping %d rows the plane keeps sending that cannot be applied: %s",
                  len(problems), key)
        self._bad_streak = None
        return True

    def _plane_model(self, state: dict[str, str]) -> str:
        return state.get("plane_model") or self.options.plane_model

    async def _estimate_offset(self, report: PassReport, until: str | None) -> None:
        timing = self.client.last_timing
        if timing is None or timing.date_ns is None:
            return
        midpoint = (timing.sent_ns + timing.received_ns) // 2
        server = timing.date_ns + 500_000_000
        if until is not None:  # a plane's `until` is its clock, to the nanosecond
            try:
                exact = parse_ns(until)
                if timing.date_ns <= exact < timing.date_ns + 1_000_000_000:
                    server = exact
            except ValueError:
                pass
        offset = server - midpoint
        if not _plausible(server):
            report.clock_refused = self._refuse_offset(server, "the plane's Date header")
            return
        self.status.clock_offset_refused = None
        offset = offset if abs(offset) >= OFFSET_MIN_NS else 0
        if offset == 0 and self.store.clock.offset_ns == 0:
            return
        if abs(offset - self.store.clock.offset_ns) < OFFSET_MIN_NS // 2 and offset != 0:
            return
        if await self.store.replication.correct_clock(offset):  # marks what it stamped ahead (replica.py)
            report.clock_rewound = True
        self.status.clock_offset_ms = offset / 1e6

    def _refuse_offset(self, plane_ns: int, source: str) -> str:
        """Report an absurd reading of the plane's clock (status, a rate-limited warning)
        without applying it: the clock keeps the offset it had, and local writes keep working."""
        try:
            reads = format_ns(plane_ns)
        except ValueError:  # beyond what a timestamp holds
            reads = f"{plane_ns} ns after 1970"
        low, high = (format_ns(bound)[:10] for bound in PLAUSIBLE_NS)
        why = (f"{source} says the plane's clock reads {reads}, outside {low}..{high}: "
               "offset not applied")
        self.status.clock_offset_refused = why
        self._warn("%s", why)
        return why

    # ------------------------------------------------------------------ push

    async def _push(self, report: PassReport) -> bool:
        """Push the outbox; True if anything was sent. After a short pull nothing is re-stamped
        and versions old enough to need it stay queued (R12)."""
        depth = await self.store.replication.outbox_depth()
        if not depth:
            return False  # the idle pass: one count, no state read, no write
        state = await self.store.replication.sync_state()
        model = self._plane_model(state)
        dim = self.store.embedder.dim if model == self.store.embedder.model_id else PLANE_DIM
        # Zeros are "no vector" to a syncd hub (it names its model); Kyma ranks them first.
        needs_vector = model != self.store.embedder.model_id and not state.get(NAMES_MODEL)
        local_only = not _keeps_private(self.options.private_memories, state)
        keep = int(self.options.overlap_secs * 1e9) // 2
        hold = report.pull_stopped
        held: set[str] = set()
        awaiting: set[str] = set()
        pushed = False
        for _ in range(depth // STAGE_ROWS + 2):
            entries, nodes, edges = await self.store.replication.stage_push(
                STAGE_ROWS, model=model, dim=dim, realm=self.options.realm,
                keep_within_ns=KEEP_ALL_NS if hold else keep)
            if not entries:
                break
            rows = _rows(entries, nodes, edges)
            if local_only:
                rows = await self._keep_private_local(rows, report)
            if needs_vector:
                rows, waiting = await self._plane_vectors(rows, model, report)
                awaiting |= waiting
            if hold:
                bound = restamp_bound(self.store.clock.physical_ns(), keep)
                held |= {_label(e) for e, row in rows if needs_restamp(row.updated_at, bound)}
            # too large (refused alone) or refused row by row: tried once a pass
            skip = held | awaiting | set(report.push_too_large) | set(report.push_refused)
            items = [(e, _encoder.encode(row)) for e, row in rows if _label(e) not in skip]
            for batch in _pack(items, self.options.push_batch_bytes):
                await self._send(batch, report)
                pushed = True
            if len(entries) < STAGE_ROWS or not items:
                break
        report.push_held = max(report.push_held, len(held))
        report.push_awaiting_vector = max(report.push_awaiting_vector, len(awaiting))
        self.status.awaiting_vector = report.push_awaiting_vector
        return pushed

    async def _keep_private_local(self, rows: list[tuple[Entry, NodeRow | EdgeRow]],
                                  report: PassReport) -> list[tuple[Entry, NodeRow | EdgeRow]]:
        """A plane that cannot keep a memory's ``space`` serves it back to every laptop with
        none, visible to every agent there: a ``private:<agent>`` memory stays on this laptop
        (its outbox entry is done with, counted in ``push_kept_private``). Its tombstone still
        goes, content scrubbed: the plane may hold an older, public version."""
        private = [(entry, row) for entry, row in rows if isinstance(row, NodeRow)
                   and not row.deleted and (row.space or "").startswith(PRIVATE_PREFIX)]
        if not private:
            return rows
        await self.store.replication.ack_push([entry for entry, _ in private])
        report.push_kept_private += len(private)
        local = {id(entry) for entry, _ in private}
        return [(entry, row) for entry, row in rows if id(entry) not in local]

    async def _plane_vectors(self, rows: list[tuple[Entry, NodeRow | EdgeRow]], model: str,
                             report: PassReport,
                             ) -> tuple[list[tuple[Entry, NodeRow | EdgeRow]], set[str]]:
        """A Kyma plane takes the vector a row carries as it is and ranks by it: a vector of
        another model gets ranks it did not earn, and a zero vector (the "no vector" of a syncd
        hub) has a NULL cosine, which its semantic leg sorts first. So a memory the plane's
        recall can return (active, not invalidated) goes with a vector of the plane's model or
        not yet: one staged without (zeros) is embedded with ``plane_embedder``, or, when there
        is none, stays queued and is counted (``push_awaiting_vector``, with what to do in
        ``push_vector_missing``). Archived, invalidated and deleted rows, which the plane's
        recall never returns, go as they are."""
        missing = [i for i, (entry, row) in enumerate(rows) if isinstance(row, NodeRow)
                   and _rankable(row) and not any(row.embedding or ())]
        if not missing:
            return rows, set()
        embedder, why = await self._plane_model_embedder(model)
        if embedder is not None:
            texts = [rows[i][1].content or "" for i in missing]  # type: ignore[union-attr]
            try:
                vectors = await asyncio.to_thread(embedder.embed, texts)
            except Exception as exc:  # the model's files went missing, or it broke
                why = f"{model} failed: {exc}"
            else:
                out = list(rows)
                for i, vector in zip(missing, vectors, strict=True):
                    entry, row = rows[i]
                    out[i] = (entry, msgspec.structs.replace(
                        row, embedding=[float(x) for x in vector]))
                return out, set()
        report.push_vector_missing = why
        return rows, {_label(rows[i][0]) for i in missing}

    async def _plane_model_embedder(self, model: str) -> tuple[Embedder | None, str]:
        """An embedder of ``model`` (built once, off the loop: it looks for files), or None
        and why not, with what to do."""
        if self._plane_embedder is not None and self._plane_embedder.model_id == model:
            return self._plane_embedder, ""
        fix = (f"the plane ranks by {model}: give this laptop that model (embedding.model = "
               f"\"{model}\", or its files under embedding.cache_dir; docs/plane-vectors.md)")
        if self._plane_embedder_factory is None:
            return None, fix
        try:
            embedder = await asyncio.to_thread(self._plane_embedder_factory)
        except Exception as exc:  # EmbedderUnavailable names the package or files it lacks
            return None, f"{fix}: {exc}"
        if embedder.model_id != model:
            return None, f"{fix}: this laptop has {embedder.model_id}"
        self._plane_embedder = embedder
        return embedder, ""

    async def _send(self, batch: list[tuple[tuple[str, str, int], bytes]],
                    report: PassReport) -> None:
        nodes = [raw for (kind, _, _), raw in batch if kind == "node"]
        edges = [raw for (kind, _, _), raw in batch if kind == "edge"]
        body = b'{"memory_nodes":[' + b",".join(nodes) + b'],"memory_edges":[' + \
            b",".join(edges) + b"]}"
        self._admit()
        before = await self.store.replication.mark_sent([e for e, _ in batch])
        try:
            result = await self.client.import_rows(body)
        except (TooLarge, Transient) as exc:
            if isinstance(exc, TooLarge) or exc.unsent:  # the plane holds none of it
                await self.store.replication.unmark_sent(before)
            if isinstance(exc, Transient):
                raise
            if len(batch) == 1:  # too large even alone: it stays queued, the rest still go
                report.push_too_large.append(_label(batch[0][0]))
                return
            report.push_splits += 1
            half = len(batch) // 2
            await self._send(batch[:half], report)
            await self._send(batch[half:], report)
            return
        report.push_requests += 1
        if result.error:
            raise PlaneError(f"import: {result.error}")
        node_entries = [e for e, _ in batch if e[0] == "node"]
        edge_entries = [e for e, _ in batch if e[0] == "edge"]
        refused: set[tuple[str, int]] = set()
        if result.errors or result.row_errors:
            if not result.row_errors:  # the plane's all-or-nothing, naming no row
                await self._bisect(batch, result.errors, report)
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
        await self.store.replication.ack_push(accepted)
        report.pushed_nodes += sum(1 for e in accepted if e[0] == "node")
        report.pushed_edges += sum(1 for e in accepted if e[0] == "edge")
        if refused:  # they stay queued; the rest of the outbox still goes (a refused row
            # first in the outbox must not hold back every row after it, pass after pass)
            said = result.errors or [r.message for r in result.row_errors or ()]
            report.push_refused += [_label(e) for i, e in enumerate(node_entries)
                                    if ("node", i) in refused]
            report.push_refused += [_label(e) for i, e in enumerate(edge_entries)
                                    if ("edge", i) in refused]
            report.push_refusal = report.push_refusal or said[0][:200]

    async def _bisect(self, batch: list[tuple[tuple[str, str, int], bytes]], errors: list[str],
                      report: PassReport) -> None:
        """The plane refused ``batch`` naming no row (its import is all-or-nothing per table):
        nothing of it is acknowledged, and its halves are sent apart until the refused rows
        are alone. Only they stay queued (tried again next pass, named in the report and in
        status); the rest goes in this pass. Import is idempotent, so a half the plane had
        partly written (its other table) is safely sent again. At most ``BISECT_SPLITS`` splits
        a pass (one bad row in 500 takes 9): a plane that refuses everything fails the pass
        with what it said, the rest still queued."""
        said = "; ".join(errors)[:300]
        if len(batch) == 1:
            report.push_refused.append(_label(batch[0][0]))
            report.push_refusal = report.push_refusal or said[:200]
            return
        if report.push_bisections >= BISECT_SPLITS:
            raise PlaneError(f"import reported errors naming no row, and {BISECT_SPLITS} smaller "
                             f"batches did not single out the refused rows: {said}")
        report.push_bisections += 1
        half = len(batch) // 2
        await self._send(batch[:half], report)
        await self._send(batch[half:], report)

    # ------------------------------------------------------------------ anti-entropy

    def _anti_entropy_due(self, state: dict[str, str]) -> bool:
        last = int(state.get("anti_entropy_ns", "0") or 0)
        return self._wall() - last >= self.options.anti_entropy_secs * 1e9

    async def _learn_plane_model(self) -> dict[str, str]:
        """A hub names its embedding model in its settings; the plane does not (then the
        configured ``control_plane.embedding_model`` is assumed)."""
        self._admit()
        settings = await self.client.settings()
        model = settings.embedding_model or self.options.plane_model
        await self.store.replication.set_sync_state({"plane_model": model,
                                         NAMES_MODEL: "1" if settings.embedding_model else ""})
        return await self.store.replication.sync_state()

    async def _anti_entropy(self, report: PassReport) -> None:
        """Apply the plane's export page by page (only id → version maps are kept, not the
        rows), then queue whatever the plane lacks or holds older."""
        learnt = await self._learn_plane_model()
        model = learnt["plane_model"]
        remote_nodes: dict[str, str] = {}
        remote_edges: dict[str, str] = {}
        cursor: str | None = None
        walked: set[str] = set()  # the cursors of this walk: one met again is a loop
        while True:
            self._admit()
            unreadable: list[UnreadableRow] = []
            page, spool = await self.client.export_spooled(self.options.realm, PAGE_ROWS,
                                                           cursor, unreadable=unreadable)
            try:
                parts = (spooled_rows(spool, unreadable) if spool is not None
                         else _one(page.memory_nodes, page.memory_edges))
                async for nodes, edges in parts:  # a spooled page a batch at a time
                    applied = await self.store.replication.apply(nodes, edges, model=model,
                                                     kept=_kept(learnt))
                    report.pulled_nodes += applied.applied_nodes
                    report.pulled_edges += applied.applied_edges
                    remote_versions(nodes, edges, (remote_nodes, remote_edges))
            finally:
                if spool is not None:
                    spool.close()
            for row in unreadable:  # the plane holds a version of it: never pushed over blind
                if row.id is not None:
                    (remote_nodes if row.kind == "node" else remote_edges)[row.id] = UNREAD
                self._note_skipped(f"export {row.kind} {row.id}: {row.field}: {row.message}")
            if not page.has_more or page.next_cursor is None:
                break
            if page.next_cursor in walked:
                raise PlaneError(f"export: the plane's next_cursor {page.next_cursor!r} was "
                                 f"already walked: anti-entropy stopped")
            cursor = page.next_cursor
            walked.add(cursor)
        requeued = await self.store.replication.requeue_unseen(
            remote_nodes, remote_edges, realm=self.options.realm,
            state={"anti_entropy_ns": str(self._wall()), RESYNC: None, RESTORED_OUTBOX: None})
        report.anti_entropy = True
        report.requeued += sum(requeued)
        if report.requeued:
            await self._push(report)


    def _note_skipped(self, line: str) -> None:
        """A row left out, named once in status and the log."""
        if line not in self.status.skipped_rows:
            self.status.skipped_rows.append(line)
            log.error("skipping a row the plane serves that cannot be read: %s", line)


def _after_reset(state: dict[str, str]) -> dict[str, str]:
    """The state a reset leaves: cursor and plane identity gone, what was learnt kept."""
    return {k: v for k, v in state.items() if k not in RESET_STATE} | {RESYNC: "1"}


def _is_stamp(text: str) -> bool:
    try:
        parse_ns(text)
    except ValueError:
        return False
    return True


def _plausible(plane_ns: int) -> bool:
    return PLAUSIBLE_NS[0] <= plane_ns < PLAUSIBLE_NS[1]


def _advances(since: str | None, until: str) -> bool:
    """Whether ``until`` is after ``since``: compared as instants (the plane's AutoSi strings
    do not sort with canonical ones), or, when either is not a timestamp, by being new."""
    if not since:
        return True
    try:
        return parse_ns(until) > parse_ns(since)
    except ValueError:
        return until != since


def _held_back(report: PassReport) -> str | None:
    """Why a pass that reached its end is still not ok, or None."""
    reasons = []
    if report.push_held:
        reasons.append(f"{report.push_held} old queued rows wait for a complete pull (it stopped "
                       f"at rows that cannot be applied, skipped after {BAD_ROW_PASSES} passes)")
    if report.push_too_large:
        reasons.append(f"{len(report.push_too_large)} queued rows are too large for the plane "
                       f"even alone and stay queued: {', '.join(report.push_too_large[:5])}")
    if report.push_refused:
        reasons.append(f"the plane refused {len(report.push_refused)} queued rows, which stay "
                       f"queued: {', '.join(report.push_refused[:5])} ({report.push_refusal})")
    if report.push_awaiting_vector:
        reasons.append(f"{report.push_awaiting_vector} memories stay queued until they have a "
                       f"vector of the plane's model: {report.push_vector_missing}")
    return "; ".join(reasons) or None


async def _one(nodes: list[NodeRow], edges: list[EdgeRow],
               ) -> AsyncIterator[tuple[list[NodeRow], list[EdgeRow]]]:
    yield nodes, edges


def _kept(state: dict[str, str]) -> tuple[str, ...]:
    """The node columns a plane never returns: all of Kyma's late ones (its ``changes`` and
    ``export`` select a fixed list without them); none for a syncd hub (it names its model)."""
    return () if state.get(NAMES_MODEL) else NODE_LATE_COLUMNS


def _keeps_private(policy: str, state: dict[str, str]) -> bool:
    """``control_plane.private_memories``: "push" always, "local" never, "auto" to a plane
    that returns a memory's space (a syncd hub, which names its model)."""
    return policy == "push" or (policy == "auto" and bool(state.get(NAMES_MODEL)))


def _rankable(row: NodeRow) -> bool:
    """Whether the plane's recall can return the row (its filters: not archived, not
    invalidated; a deleted row goes to Kyma as archived and invalidated)."""
    return not row.deleted and row.status != "archived" and row.invalid_at is None


def _rows(entries: list[Entry], nodes: list[NodeRow],
          edges: list[EdgeRow]) -> list[tuple[Entry, NodeRow | EdgeRow]]:
    """Staged entries with their wire rows (``stage_push`` returns nodes, then edges)."""
    return [*zip([e for e in entries if e[0] == "node"], nodes, strict=True),
            *zip([e for e in entries if e[0] == "edge"], edges, strict=True)]


def _label(entry: Entry) -> str:
    return f"{entry[0]} {entry[1]}"


def _pack(items: list[tuple[tuple[str, str, int], bytes]],
          budget: int) -> list[list[tuple[tuple[str, str, int], bytes]]]:
    """Greedy batches whose encoded body stays under ``budget`` bytes (a lone row that is
    bigger goes alone: the plane answers 413 and the row stays queued, reported)."""
    batches: list[list[tuple[tuple[str, str, int], bytes]]] = []
    current: list[tuple[tuple[str, str, int], bytes]] = []
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


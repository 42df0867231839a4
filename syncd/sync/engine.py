"""The sync engine: one pass at a time — pull, push, pull again if anything was pushed, and a
full anti-entropy diff when it is due or a reset is suspected (ARCHITECTURE §5.3) — and the
long-poll watch between passes.

The steps of a pass live by concern: the pull path (``pull.py``: changes pages, spooled bodies,
the cursor, resets), the push path (``push.py``: staging, import answers, per-row failures,
held-back rows; ``staged.py``: private memories and plane-model vectors), anti-entropy
(``reconcile.py``), the plane's clock (``clock.py``), and what a pass reports and the backoff
it leaves (``status.py``); ``context.py`` holds what they share.

Rules:
  * A pass that reached its end but left queued rows behind (held by a short pull, too large,
    refused, waiting for a vector) is not ok: it reports ``held_back`` and why, without
    backing off (the plane answered).
  * A store restored from a backup with a non-empty outbox (``restored_outbox``, set by
    ``restore``) runs anti-entropy before its first push: the outbox may hold versions this
    install superseded after the backup, and a hub leaves its own later versions out of
    ``changes``; applying the export replaces them (and drops their entries) first.
  * A suspected reset (``pull.py``) stores ``resync_pending``: anti-entropy runs in every pass
    while it is set, and once (not twice) for a reset the pass detected itself.
  * The entitlement gate is asked at the start of a pass and before each of its requests: a
    closed gate pauses sync (no request, no backoff; writes queue up).
  * Long-poll (docs/long-poll.md): against a plane whose ``changes`` answers advertise it
    (``PlaneClient.long_poll_secs``) and whose feed follows ingest order, ``watch`` holds
    ``changes?wait=`` requests from the stored cursor, each at most ``LONG_POLL_SECS``, and
    returns once the plane has a row after it: the caller then runs a pass, which pulls it.
    An empty answer moves only the watch's own ``since`` (never the stored cursor). A watch
    runs only while a scheduled pass would (not blocked on auth, not backing off, not
    gated); a failed poll raises, and the caller waits for its next pass. A pass cancels the
    poll it finds held and the watch polls again after it: never two requests at once (R22),
    and never a pass waiting on a poll.
  * A pass ends on a plane's error, never loops; how the error holds back the next pass
    (backoff, the auth block) is ``status.py``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

from local_store import Store
from local_store.embed import Embedder
from local_store.replica import RESTORED_OUTBOX
from protocol.rows import ChangesResponse
from protocol.timestamp import format_ns
from syncd.sync.clock import PlaneClock
from syncd.sync.context import NAMES_MODEL, RESYNC, GateClosed, Link, SyncOptions
from syncd.sync.plane import PlaneClient, PlaneError
from syncd.sync.pull import BAD_ROW_PASSES, Pull, advances, is_stamp
from syncd.sync.push import Push
from syncd.sync.reconcile import AntiEntropy
from syncd.sync.staged import Prepare
from syncd.sync.status import HELD_BACK, Health, PassReport, SyncStatus

__all__ = ["HELD_BACK", "RESYNC", "PassReport", "SyncEngine", "SyncOptions", "SyncStatus"]
LONG_POLL_SECS = 25.0  # the longest wait asked for (under a hub's 30 and most proxies' 60)


class SyncEngine:
    """Runs passes one at a time (``run_pass``, ``scheduled``) and the watch between them."""

    def __init__(self, store: Store, client: PlaneClient, options: SyncOptions, *,
                 wall: Callable[[], int] = time.time_ns,
                 gate: Callable[[], str | None] | None = None,
                 plane_embedder: Callable[[], Embedder] | None = None) -> None:
        """``gate`` answers None while sync may run, else why not (the entitlement gate).
        ``plane_embedder`` builds an embedder of the plane's model (it raises, saying what is
        missing, when it cannot): a memory the plane could rank and that has no vector of that
        model is embedded with it before it is pushed, or held (``staged.Prepare``)."""
        self.store, self.client, self.options = store, client, options
        self.status = SyncStatus(url=client.url, realm=options.realm)
        self._health = Health(self.status, wall)
        self._link = Link(store, client, options, self._health, wall, gate)
        self._clock = PlaneClock(self._link)
        self._pull = Pull(self._link, self._clock)
        self._push = Push(self._link, Prepare(self._link, plane_embedder))
        self._anti_entropy = AntiEntropy(self._link, self._push)
        self._flight = asyncio.Lock()
        self._held: asyncio.Future[ChangesResponse | None] | None = None  # a long-poll
        self._wall = wall

    @property
    def gate(self) -> Callable[[], str | None] | None:
        """The entitlement gate (the keeper sets it after the engine is built)."""
        return self._link.gate

    @gate.setter
    def gate(self, gate: Callable[[], str | None] | None) -> None:
        self._link.gate = gate

    async def start(self) -> None:
        """Restore the clock offset learnt by an earlier run (before the first pass)."""
        await self._clock.restore()

    async def close(self) -> None:
        await self.client.close()

    # ------------------------------------------------------------------ scheduling

    async def scheduled(self, trigger: str = "schedule") -> PassReport | None:
        """The scheduler's pass (a tick, a local write, a long-poll that saw rows): skipped
        while backing off or blocked on auth."""
        if self._health.held_off():
            return None
        return await self.run_pass(trigger)

    def long_poll_wait(self) -> float | None:
        """Seconds a long-poll may be held for now, or None: not offered by the plane (or
        turned off), or no scheduled pass would run now (auth, backoff, the gate)."""
        offered = self.client.long_poll_secs
        if not self.options.long_poll or offered is None or self._health.held_off() or (
                self._link.gated() is not None):
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
                if not (is_stamp(page.until) and advances(since, page.until)):
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
        self._link.passes += 1
        report = PassReport(trigger=trigger, started_at=format_ns(self._wall()))
        gated = self._link.gated()
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
                state = await self._anti_entropy.learn_plane_model()
            reset = await self._pull.run(report, state)
            if RESTORED_OUTBOX in await self.store.replication.sync_state():
                await self._anti_entropy.run(report)  # before the restored outbox is pushed
            if await self._push.run(report):
                await self._pull.run(report, await self.store.replication.sync_state())
            state = await self.store.replication.sync_state()
            due = RESYNC in state or self._anti_entropy.due(state)
            if due or (reset and not report.anti_entropy):  # not twice for one reset
                await self._anti_entropy.run(report)
            report.error = held_back(report)
            report.ok = report.error is None
            report.error_kind = None if report.ok else HELD_BACK
        except GateClosed as exc:  # the gate closed mid-pass: paused, as at the start
            report.error, report.error_kind = f"sync is paused: {exc}", "gated"
            self.status.gated = str(exc)
        except PlaneError as exc:
            report.error, report.error_kind = str(exc), exc.kind
            self._health.failed(exc)
        finally:
            report.requests = self.client.requests - before[0]
            report.bytes_in = self.client.bytes_in - before[1]
            report.bytes_out = self.client.bytes_out - before[2]
            report.took_ms = round((time.perf_counter() - started) * 1000, 3)
            self._record(report)
        return report

    def _record(self, report: PassReport) -> None:
        self._health.record(report, drift_rejections=self.store.clock.drift_rejections,
                            egress_refusals=self.client.egress_refusals)


def held_back(report: PassReport) -> str | None:
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

"""``SyncRunner``: the daemon's sync schedule — one asyncio task that runs a pass, then waits
``interval`` seconds (± ``jitter`` × interval, drawn afresh each time) before the next, or less
when there is something to send or to fetch.

Rules of this module:
  * One loop, one pass at a time: the next wait starts when a pass ends, so passes never overlap
    and ticks missed while a pass ran (or the laptop slept) merge into one. The engine is itself
    single-flight too: a manual ``POST /v1/agent/sync/run`` queues behind a scheduled pass
    instead of overlapping it.
  * The first pass runs at start; a pass that raises is logged and the schedule goes on.
  * A wait ends early (docs/long-poll.md):
      - "local": a write committed on this store (``Store.commit_listeners``) and the outbox
        is not empty — a save is pushed at once, not at the next tick. A pass's own writes
        leave the outbox empty: they cost one count, no pass;
      - "live": the long-poll saw rows on the plane. It runs as a task of its own beside the
        loop (a held poll never delays a push), started after each pass when the plane
        advertises one (``SyncEngine.long_poll_wait``), ended when it sees rows or fails;
        against a plane without it (Kyma) there is only the interval.
    Such a pass is skipped while the engine backs off or is blocked on auth, as a tick is. A
    poll is not restarted after a "live" pass that left the cursor where the poll found rows
    (a row that cannot be applied holds it, R5): the next tick's pass restarts it, so a stuck
    cursor costs a poll per interval, never a loop.
  * The entitlement refresh (``after_success``) follows interval and manual passes only, not
    the pushes and pulls in between.
  * ``stop`` starts no new pass, cancels a held poll at once (never waits for it) and gives
    the pass in flight ``grace`` seconds.

This replaced APScheduler 3.x, which ran this one job through an interval trigger, a thread pool
it never used, a time-zone probe (worked around with ``timezone=UTC``) and two INFO log lines per
run (silenced by hand): docs/dependencies.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from local_store import Store
from local_store.embed import Embedder
from syncd.sync.engine import HELD_BACK, RESYNC, PassReport, SyncEngine, SyncOptions
from syncd.sync.plane import PlaneClient, PlaneError

log = logging.getLogger("syncd.sync")
STOP_GRACE_SECS = 5.0


class SyncSetupError(ValueError):
    pass


def read_plane_token(path: Path | None) -> str | None:
    """The bearer token from ``control_plane.token_file`` (first line, trimmed)."""
    if path is None:
        return None
    try:
        lines = path.expanduser().read_text().strip().splitlines()
        token = lines[0].strip() if lines else ""
    except OSError as exc:
        raise SyncSetupError(f"control_plane.token_file = {str(path)!r}: {exc.strerror}") \
            from None
    if not token:
        raise SyncSetupError(f"control_plane.token_file = {str(path)!r}: the file is empty")
    return token


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("re-embedding pulled memories failed: %s", task.exception())


class SyncRunner:
    def __init__(self, engine: SyncEngine, *, interval: float, jitter: float,
                 token_file: Path | None = None) -> None:
        self.engine = engine
        self.after_success: Callable[[], Coroutine[Any, Any, object]] | None = None  # entitlement refresh
        self._refresh: asyncio.Task[object] | None = None
        self.interval, self.jitter, self.token_file = interval, jitter, token_file
        self._schedule: asyncio.Task[None] | None = None
        self._stopping = False
        self._reembed: asyncio.Task[int] | None = None
        self._poll: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._local = False  # a write committed since the loop last looked
        self._found_at: str | None = None  # the cursor after which the poll last saw rows
        self._live = False  # ... and the loop has not run a pass for it yet

    @classmethod
    def create(cls, store: Store, *, url: str, token: str | None, options: SyncOptions,
               interval: float, jitter: float, timeout: float = 30.0,
               token_file: Path | None = None, proxy: str | None = None,
               plane_embedder: Callable[[], Embedder] | None = None) -> SyncRunner:
        """``proxy``: ``control_plane.proxy`` (None: the environment's proxy variables);
        ``plane_embedder``: builds an embedder of the plane's model (``SyncEngine``)."""
        plane = PlaneClient(url, token, timeout=timeout, proxy=proxy)
        return cls(SyncEngine(store, plane, options, plane_embedder=plane_embedder),
                   interval=interval, jitter=jitter, token_file=token_file)

    async def start(self) -> None:
        await self.engine.start()
        self.engine.store.commit_listeners.append(self._committed)
        self._schedule = asyncio.create_task(self._every_interval(), name="sync-schedule")

    def next_wait(self) -> float:
        """Seconds until the next scheduled pass: ``interval`` ± ``jitter`` × ``interval``."""
        spread = self.interval * self.jitter
        return max(0.0, self.interval + random.uniform(-spread, spread))

    def _committed(self) -> None:
        self._local = True
        self._wake.set()

    async def _every_interval(self) -> None:
        trigger = "schedule"
        while not self._stopping:
            try:
                self._after(await self.engine.scheduled(trigger), trigger)
                await self._watch(trigger)
            except Exception:  # a bug in one pass must not end the schedule
                log.exception("scheduled sync pass failed")
            trigger = await self._next(self.next_wait())

    async def _next(self, wait: float) -> str:
        """Wait ``wait`` seconds or until there is something to push or pull; which it was."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while True:
            self._wake.clear()  # before the flags: a wake after this is not missed
            if self._live:
                self._live = False
                return "live"
            if self._local:
                self._local = False
                if await self.engine.store.replication.outbox_depth():
                    return "local"
                continue
            left = deadline - loop.time()
            if left <= 0:
                return "schedule"
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._wake.wait()

    async def _watch(self, trigger: str) -> None:
        """Start the long-poll after a pass, when the plane offers one and none is held."""
        if self._stopping or (self._poll is not None and not self._poll.done()) or \
                self.engine.long_poll_wait() is None:
            return
        if trigger == "live" and self._found_at is not None and \
                (await self.engine.store.replication.sync_state()).get("cursor") == self._found_at:
            return  # the pass did not get past what the poll saw: the next tick tries again
        self._poll = asyncio.create_task(self._held_poll(), name="sync-long-poll")

    async def _held_poll(self) -> None:
        try:
            found = await self.engine.watch()
        except PlaneError as exc:  # the next pass meets it too, and reports it
            log.debug("long-poll failed, interval polling until the next pass: %s", exc)
            return
        except Exception:  # a bug in the poll must not go unseen; the schedule goes on
            log.exception("long-poll failed, interval polling until the next pass")
            return
        if found is not None:
            self._found_at, self._live = found, True
            self._wake.set()

    def _after(self, report: PassReport | None, trigger: str = "manual") -> None:
        """Pulled rows carry the plane's model's vectors: embed them with the local model in the
        background (one task at a time), so semantic recall covers them without a restart.
        An interval or manual pass the plane answered refreshes the entitlement."""
        answered = report is not None and (report.ok or report.error_kind == HELD_BACK)
        if answered and trigger in ("schedule", "manual") and self.after_success is not None and (
                self._refresh is None or self._refresh.done()):
            self._refresh = asyncio.create_task(self.after_success(), name="entitlement")
        store = self.engine.store
        if report is None or not report.pulled_nodes or (
                self._reembed is not None and not self._reembed.done()):
            return
        self._reembed = asyncio.create_task(store.embedding.reembed_missing(), name="reembed")
        self._reembed.add_done_callback(_log_failure)

    async def stop(self, grace: float = STOP_GRACE_SECS) -> None:
        """No new pass; a pass in flight gets ``grace`` seconds to finish before it is cancelled
        (safe either way: every store write is one transaction)."""
        schedule, self._schedule = self._schedule, None
        self._stopping = True
        if self._committed in self.engine.store.commit_listeners:
            self.engine.store.commit_listeners.remove(self._committed)
        if self._poll is not None:  # a held poll is dropped, not waited for
            self._poll.cancel()
            await asyncio.gather(self._poll, return_exceptions=True)
        if schedule is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace), self.engine.idle():
                    pass
        for task in (schedule, self._reembed, self._refresh):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await self.engine.close()

    async def run_now(self) -> PassReport:
        """A pass now. After the plane refused the token, the token file is read again first,
        so fixing the file and running ``syncd sync`` is enough (no restart)."""
        if self.engine.status.auth_blocked and self.token_file is not None:
            try:
                token = await asyncio.to_thread(read_plane_token, self.token_file)
            except SyncSetupError as exc:
                log.error("%s", exc)
            else:
                await self.engine.client.set_token(token)
        report = await self.engine.run_pass("manual")
        self._after(report)
        return report

    async def status(self) -> dict[str, Any]:
        status = self.engine.status
        state = await self.engine.store.replication.sync_state()
        stats = await self.engine.store.maintenance.stats()
        return {"configured": True, "url": status.url, "realm": status.realm,
                "token_file": None if self.token_file is None else str(self.token_file),
                "interval_secs": self.interval, "cursor": state.get("cursor"),
                "long_poll_secs": self.engine.long_poll_wait(),
                "long_poll_held": self._poll is not None and not self._poll.done(),
                "plane_store_id": state.get("plane_store_id"),
                "plane_model": state.get("plane_model"), "outbox": stats["outbox"],
                "resync_pending": RESYNC in state,
                "passes": status.passes, "failures": status.failures,
                "consecutive_failures": status.consecutive_failures,
                "last_success": status.last_success, "last_error": status.last_error,
                "last_error_at": status.last_error_at, "auth_blocked": status.auth_blocked,
                "gated": status.gated,
                "next_attempt_in_secs": status.next_attempt_in_secs,
                "clock_offset_ms": status.clock_offset_ms,
                "clock_offset_refused": status.clock_offset_refused,
                "future_rows": status.future_rows,
                "drift_rejections": status.drift_rejections,
                "egress_refusals": status.egress_refusals, "skipped_rows": status.skipped_rows,
                "too_large_rows": status.too_large_rows,
                "awaiting_vector": status.awaiting_vector,
                "totals": status.totals, "last_pass": status.last_pass}

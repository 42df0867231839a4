"""What a sync pass reports (``PassReport``), what the engine shows between passes
(``SyncStatus``), and how a failed pass holds back the next (``Health``).

Rules:
  * 401/403 stop and block scheduled passes until a manual run; other failures back off
    exponentially (capped, jittered, at least ``Retry-After`` up to the cap — a value too
    large for a float is the cap). A pass the plane answered never backs off: an ok one, and
    one that reached its end but left rows behind (``HELD_BACK``).
  * Warnings about failing passes are rate-limited: one line a minute at most.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from protocol.timestamp import format_ns
from syncd.sync.plane import AuthFailed, PlaneError

log = logging.getLogger("syncd.sync")
BACKOFF_BASE_SECS = 1.0
BACKOFF_CAP_SECS = 600.0
LOG_EVERY_SECS = 60.0
HELD_BACK = "held_back"  # error_kind of a pass that reached its end but left rows behind


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
    push_bisections: int = 0  # halvings of batches refused naming no row (``Push.bisect``)
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


class Health:
    """The status between passes, when the next scheduled pass may run, and the warnings."""

    def __init__(self, status: SyncStatus, wall: Callable[[], int]) -> None:
        self.status = status
        self._wall = wall
        self._not_before = 0.0  # monotonic seconds
        self._last_log = 0.0

    def held_off(self) -> bool:
        """Whether a scheduled pass must wait: blocked on auth, or backing off."""
        return self.status.auth_blocked or time.monotonic() < self._not_before

    def failed(self, exc: PlaneError) -> None:
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
        self.warn("sync pass failed (%s), retrying in %.1f s: %s", exc.kind, delay, exc)

    def warn(self, message: str, *args: object) -> None:
        """Rate-limited: one line a minute at most."""
        now = time.monotonic()
        if now - self._last_log >= LOG_EVERY_SECS:
            self._last_log = now
            log.warning(message, *args)

    def record(self, report: PassReport, *, drift_rejections: int, egress_refusals: int) -> None:
        """A pass ended: its counts join the totals; one the plane answered ends any backoff."""
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
            self.warn("sync pass left rows behind: %s", report.error)
        if report.push_too_large:
            status.too_large_rows = list(report.push_too_large)
        status.future_rows += report.future_rows
        status.drift_rejections = drift_rejections
        status.egress_refusals = egress_refusals
        for key in ("pulled_nodes", "pulled_edges", "pushed_nodes", "pushed_edges",
                    "requeued", "requests", "bytes_in", "bytes_out", "push_splits",
                    "push_bisections"):
            status.totals[key] = status.totals.get(key, 0) + int(getattr(report, key))
        status.last_pass = report.as_dict()

    def note_skipped(self, line: str) -> None:
        """A row the plane serves that cannot be read, left out: named once in status and log."""
        if line not in self.status.skipped_rows:
            self.status.skipped_rows.append(line)
            log.error("skipping a row the plane serves that cannot be read: %s", line)

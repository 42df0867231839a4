"""The plane's clock: this machine's offset to it, estimated from each response's ``Date`` (and
a plane's ``until``), applied to every later stamp of the store, or refused when absurd.

Rules:
  * An offset over ``OFFSET_MIN_NS`` is applied to every later stamp (``Date`` has 1 s
    resolution: smaller offsets are noise).
  * One that puts the plane's clock outside ``PLAUSIBLE_NS`` is refused (a broken ``Date``, not
    a clock: applied, a Date in year 9999 stamped past what a timestamp holds and every write
    failed), reported until a sane one comes, and never stored — nor restored at start.
  * This machine's own clock may be any distance off (an RTC reset to 1970): the plane's sane
    clock corrects it. Queued edits stamped while the clock ran beyond the drift bound are
    stamped again when staged, after the version each replaced (``local_store/replica.py``).
"""

from __future__ import annotations

from protocol.timestamp import format_ns, parse_ns
from syncd.sync.context import Link
from syncd.sync.status import PassReport

OFFSET_MIN_NS = 2_000_000_000  # Date has 1 s resolution: smaller offsets are noise
# The instants a plane's clock is believed to read (its Date, its until): outside them it is a
# broken header, not a clock. The bound is on the plane's clock, not on the offset: a laptop
# whose clock reset years back must still be corrected (R9, R10), over http:// too.
PLAUSIBLE_NS = (parse_ns("2024-01-01T00:00:00Z"), parse_ns("2100-01-01T00:00:00Z"))


class PlaneClock:
    """Keeps the store's clock offset to the plane's (``Store.correct_clock``)."""

    def __init__(self, link: Link) -> None:
        self.link = link

    async def restore(self) -> None:
        """Restore the clock offset learnt by an earlier run (before the first pass). An
        absurd one (stored by a version without the bound) is dropped: applied, every stamp
        would fail; dropping it also pulls back an HLC it had dragged ahead."""
        store, wall = self.link.store, self.link.wall
        state = await store.replication.sync_state()
        offset = int(state.get("clock_offset_ns", "0") or 0)
        if offset and not plausible(wall() + offset):
            self.refuse(wall() + offset, "the stored clock offset")
            await store.replication.correct_clock(0)
        elif offset:
            await store.replication.correct_clock(offset)
            self.link.health.status.clock_offset_ms = offset / 1e6

    async def estimate(self, report: PassReport, until: str | None) -> None:
        """Learn the offset from the last response (and ``until``, the plane's clock to the
        nanosecond, when its feed is not in ingest order)."""
        store, status = self.link.store, self.link.health.status
        timing = self.link.client.last_timing
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
        if not plausible(server):
            report.clock_refused = self.refuse(server, "the plane's Date header")
            return
        status.clock_offset_refused = None
        offset = offset if abs(offset) >= OFFSET_MIN_NS else 0
        if offset == 0 and store.clock.offset_ns == 0:
            return
        if abs(offset - store.clock.offset_ns) < OFFSET_MIN_NS // 2 and offset != 0:
            return
        if await store.replication.correct_clock(offset):  # marks what it stamped ahead (replica.py)
            report.clock_rewound = True
        status.clock_offset_ms = offset / 1e6

    def refuse(self, plane_ns: int, source: str) -> str:
        """Report an absurd reading of the plane's clock (status, a rate-limited warning)
        without applying it: the clock keeps the offset it had, and local writes keep working."""
        try:
            reads = format_ns(plane_ns)
        except ValueError:  # beyond what a timestamp holds
            reads = f"{plane_ns} ns after 1970"
        low, high = (format_ns(bound)[:10] for bound in PLAUSIBLE_NS)
        why = (f"{source} says the plane's clock reads {reads}, outside {low}..{high}: "
               "offset not applied")
        self.link.health.status.clock_offset_refused = why
        self.link.health.warn("%s", why)
        return why


def plausible(plane_ns: int) -> bool:
    return PLAUSIBLE_NS[0] <= plane_ns < PLAUSIBLE_NS[1]

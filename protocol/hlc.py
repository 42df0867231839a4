"""A hybrid logical clock (Kulkarni et al. 2014) whose stamps are canonical timestamps.

Encoding ("packed HLC"): a stamp is an integer nanosecond count ``tick * 1000 + node``.
``tick`` counts microseconds. ``node`` (0..999) is this replica's discriminator and fills
the last three digits of the 9-digit fraction. The HLC's logical counter is folded into the
tick: when the wall clock does not advance, the tick moves forward by one microsecond.

Rules:
1. Send/local event (``now_ns``): ``tick = max(last_tick + 1, physical_ns // 1000)``, and the
   stamp becomes ``last_ns``. Stamps are strictly increasing, even if the wall clock stalls
   or steps backwards.
2. Receive (``receive``): a remote stamp more than ``max_drift_ns`` ahead of
   ``physical_ns()`` is ignored and counted in ``drift_rejections``, so one bad clock cannot
   drag every replica into the future. Otherwise ``last_ns = max(last_ns, remote)``, so the
   next stamp is strictly greater than the received one (causality).
3. Replicas with different ``node`` values can never mint the same stamp (the low three
   digits differ), so a stamp names one write by one replica.
4. ``last_ns`` is the state to persist. A clock restored with ``last_ns=x`` issues stamps
   strictly greater than ``x``, whatever the wall clock says (R11).
5. ``physical_ns() = wall() + offset_ns``. ``offset_ns`` is the estimated offset to the
   plane's clock, so locally minted stamps sort sensibly against the plane's own.
"""

import time
from collections.abc import Callable

from protocol.timestamp import format_ns, parse_ns

DEFAULT_MAX_DRIFT_NS = 5 * 60 * 1_000_000_000  # 5 minutes
NODE_LIMIT = 1000  # node discriminators are 0..NODE_LIMIT-1
TICK_NS = 1000


class HybridClock:
    """A packed hybrid logical clock for one replica; not thread-safe."""

    __slots__ = ("_last_ns", "_max_drift_ns", "_node", "_wall", "drift_rejections", "offset_ns")

    def __init__(
        self,
        node: int,
        *,
        wall: Callable[[], int] = time.time_ns,
        last_ns: int = 0,
        max_drift_ns: int = DEFAULT_MAX_DRIFT_NS,
        offset_ns: int = 0,
    ) -> None:
        if not 0 <= node < NODE_LIMIT:
            raise ValueError(f"node must be in 0..{NODE_LIMIT - 1}, got {node}")
        if max_drift_ns < 0:
            raise ValueError(f"max_drift_ns must be >= 0, got {max_drift_ns}")
        self._node = node
        self._wall = wall
        self._last_ns = last_ns
        self._max_drift_ns = max_drift_ns
        self.offset_ns = offset_ns
        self.drift_rejections = 0

    @property
    def node(self) -> int:
        return self._node

    @property
    def last_ns(self) -> int:
        """The last stamp issued or received, in nanoseconds: persist this."""
        return self._last_ns

    @property
    def max_drift_ns(self) -> int:
        return self._max_drift_ns

    def physical_ns(self) -> int:
        return self._wall() + self.offset_ns

    def now_ns(self) -> int:
        """Issue a stamp for a local or send event (rule 1)."""
        tick = max(self._last_ns // TICK_NS + 1, self.physical_ns() // TICK_NS)
        self._last_ns = tick * TICK_NS + self._node
        return self._last_ns

    def now(self) -> str:
        return format_ns(self.now_ns())

    def rewind(self, to_ns: int) -> None:
        """Pull ``last_ns`` back to ``to_ns`` after the wall clock was found running ahead of
        the plane's (rule 5). Callers keep per-item order themselves: a new version of an item
        is stamped after the version it replaces (``local_store.replica.after``)."""
        self._last_ns = min(self._last_ns, to_ns)

    def receive(self, stamp: str | int) -> bool:
        """Merge a remote stamp (rule 2); False if the drift guard ignored it.

        A string stamp that is not a timestamp raises ``TimestampError`` (a ``ValueError``).
        """
        remote = parse_ns(stamp) if isinstance(stamp, str) else stamp
        if remote > self.physical_ns() + self._max_drift_ns:
            self.drift_rejections += 1
            return False
        self._last_ns = max(self._last_ns, remote)
        return True

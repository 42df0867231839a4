"""The hub's long-poll on ``changes`` (docs/long-poll.md): ``wait=SECONDS`` holds an answer
that has no rows until a write commits, or until the wait runs out.

Rules:
  * ``Commits`` is the commit path's signal: a generation counter bumped, on the event loop, by
    every committed write of this process's store (SQLite: ``Store.commit_listeners``) and, on
    PostgreSQL, by every other process's commit too (``LISTEN``/``NOTIFY``,
    ``syncd/hub/pg/follow.py``). A held poll notes the generation *before* it reads the feed,
    so a commit between its read and its wait wakes it at once: no commit is slept through.
  * A wake is a hint, never a row: the poll reads the feed again and goes back to waiting
    when the commit brought it nothing (another realm, the caller's own push). No timer runs
    while it waits: an idle laptop costs one request per wait period.
  * A held poll also looks every ``GONE_CHECK_SECS`` whether its client is still connected
    (aiohttp does not cancel a handler whose client went away): a poll a laptop cancelled —
    its pass pre-empts it — stops counting within that time, not at its wait's end. The look
    is a timer and a flag, no query.
  * ``HeldPolls`` bounds the answers held at once in this process (``[hub] max_held_polls``);
    past it a poll is answered ``503`` with ``Retry-After`` (the laptop then keeps its interval
    schedule until its next pass). A cap of 0 turns the long-poll off: no advertisement, and
    ``wait`` is ignored.
  * ``wait`` is 0..``MAX_WAIT_SECS`` seconds; more is served as ``MAX_WAIT_SECS`` (the hub
    says so in the ``Syncd-Long-Poll`` header of every ingest-mode ``changes`` answer), and
    anything that is not a number is a 422 naming ``wait``.
  * On shutdown ``HeldPolls.release`` answers every held poll at once (and any later one
    without holding it), so a stopping hub never waits out a poll; ``Commits.close``, when
    the store closes, does the same for every app on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Iterator

from local_store import ValidationError
from local_store.redact import quoted
from protocol.errors import SyncdError

MAX_WAIT_SECS = 30.0
RETRY_AFTER_SECS = 5
GONE_CHECK_SECS = 1.0
HEADER = "Syncd-Long-Poll"  # the advertisement: the longest wait this hub holds, in seconds


class Commits:
    """How a held poll learns that a write committed (rules above)."""

    def __init__(self) -> None:
        self.generation = 0
        self.closed = False
        self._event = asyncio.Event()

    def notify(self) -> None:
        """A write committed (call on the event loop)."""
        self.generation += 1
        event, self._event = self._event, asyncio.Event()
        event.set()

    def close(self) -> None:
        """Release every held poll, now and later."""
        self.closed = True
        self.notify()

    async def wait(self, seen: int, within: float) -> bool:
        """True once the generation is past ``seen`` (at once if it already is), False when
        ``within`` seconds pass first or the hub is closing."""
        if self.closed:
            return False
        if self.generation != seen:
            return True
        event = self._event
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                await event.wait()
        return self.generation != seen and not self.closed


class PollsFull(SyncdError):
    """This process holds ``cap`` polls already: 503, poll again after ``RETRY_AFTER_SECS``
    (the answer still advertises the long-poll)."""

    status, code = 503, "too_many_polls"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"Retry-After": str(RETRY_AFTER_SECS),
                                           HEADER: f"{MAX_WAIT_SECS:g}"})


class HeldPolls:
    """A count of the polls held now, bounded by ``cap``."""

    def __init__(self, cap: int) -> None:
        """``cap``: ``[hub] max_held_polls`` (``syncd/config.py`` has its default)."""
        if cap < 0:
            raise ValueError(f"hub.max_held_polls must be >= 0, got {cap}")
        self.cap, self.held, self.refused = cap, 0, 0
        self.released = False

    def release(self, commits: Commits) -> None:
        """Answer every held poll now (the app stops); ``commits`` wakes them."""
        self.released = True
        commits.notify()

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        if self.held >= self.cap:
            self.refused += 1
            raise PollsFull(f"this hub process holds {self.held} long-polls already (its "
                            f"hub.max_held_polls); poll again later")
        self.held += 1
        try:
            yield
        finally:
            self.held -= 1


def parse_wait(raw: str | None) -> float:
    """``wait`` in seconds: absent or empty is 0 (answer at once), more than ``MAX_WAIT_SECS``
    is ``MAX_WAIT_SECS``; a negative or non-finite number or a non-number names ``wait``."""
    if raw is None or not raw.strip():
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        raise ValidationError("wait", f"must be a number of seconds, got {quoted(raw)}") from None
    if not math.isfinite(value) or value < 0:
        raise ValidationError("wait", f"must be 0..{MAX_WAIT_SECS:g} seconds, got {quoted(raw)}")
    return min(value, MAX_WAIT_SECS)

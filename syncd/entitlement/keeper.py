"""``Keeper``: keeps the gate's decision fresh in the daemon.

  * Every ``LOCAL_CHECK_SECS`` the gate re-reads its files and the clock (a licence installed,
    ``exp`` passed, the clock stepped back) — off the event loop.
  * Every ``entitlement.refresh_secs`` (every ``LOCAL_CHECK_SECS`` while not entitled), and
    after each successful sync pass, a fresh token is fetched from the control plane, if one is
    set. The fetch is not sync, so it runs while sync is gated; failures are logged
    (rate-limited) and leave the current token in place: the offline grace runs until its
    ``exp``.
  * ``last_online_error`` says why the last fetch failed, or why the gate refused the token it
    brought; None after a fetch whose token was stored.
  * After ``stop`` nothing is fetched: the plane client is closing with the daemon, and a
    request waiting for a check (``syncd sync``) gets ``KeeperStopped``, not a closed session.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from local_store import Store
from protocol.errors import SyncdError
from syncd.config import EntitlementConfig
from syncd.entitlement.gate import Decision, Gate
from syncd.sync.plane import PlaneClient, PlaneError
from syncd.sync.runner import SyncRunner

log = logging.getLogger("syncd.entitlement")
LOCAL_CHECK_SECS = 60.0
LOG_EVERY_SECS = 600.0


class KeeperStopped(SyncdError):
    """An online check asked for while the daemon stops: 503 ``stopping``."""

    status, code = 503, "stopping"

    def __init__(self) -> None:
        super().__init__("the daemon is stopping, so it did not ask the control plane; try "
                         "again once it runs again")


class Keeper:
    def __init__(self, gate: Gate, client: PlaneClient | None,
                 config: EntitlementConfig) -> None:
        self.gate, self.client, self.refresh_secs = gate, client, config.refresh_secs
        self.last_online_error: str | None = None
        self._last_fetch = 0.0
        self._last_log = 0.0
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._stopped = False

    async def start(self) -> None:
        """Evaluate the files now; the first online fetch runs in the background (start-up
        never waits for the network)."""
        await self.check(online=False)
        self._task = asyncio.create_task(self._loop(), name="entitlement")

    async def stop(self) -> None:
        self._stopped = True  # before the loop's fetch lets go of the lock to a waiting check
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def check(self, *, online: bool = True) -> Decision:
        """Fetch a token if a plane is set (and ``online``), then evaluate."""
        async with self._lock:
            if online and self.client is not None:
                if self._stopped:
                    raise KeeperStopped
                await self._fetch(self.client)
            return await asyncio.to_thread(self.gate.evaluate)

    async def _fetch(self, client: PlaneClient) -> None:
        self._last_fetch = time.monotonic()
        try:
            token, server_now = await client.entitlement(self.gate.device_id)
        except PlaneError as exc:
            self.last_online_error = str(exc)
            if time.monotonic() - self._last_log >= LOG_EVERY_SECS:
                self._last_log = time.monotonic()
                log.warning("could not fetch an entitlement from the control plane: %s", exc)
            return
        await asyncio.to_thread(self.gate.accept_online, token, server_now)
        refusal = self.gate.online_refusal  # fetched, but not stored: also an online error
        self.last_online_error = None if refusal is None else (
            f"the control plane's entitlement was refused: {refusal}")

    async def _loop(self) -> None:
        if self.client is not None:
            await self._guarded(online=True)
        while True:
            await asyncio.sleep(LOCAL_CHECK_SECS)
            entitled = self.gate.allows("sync") is None or self.gate.allows("graph") is None
            due = time.monotonic() - self._last_fetch >= (
                self.refresh_secs if entitled else LOCAL_CHECK_SECS)
            await self._guarded(online=due)

    async def _guarded(self, *, online: bool) -> None:
        try:
            await self.check(online=online)
        except Exception:  # the keeper must never die; the gate stays as it was
            log.exception("entitlement check failed")

    def status(self) -> dict[str, Any]:
        return {**self.gate.status(), "last_online_error": self.last_online_error}


def attach_gate(store: Store, sync: SyncRunner | None, data_dir: Path,
                pinned: dict[str, Ed25519PublicKey], config: EntitlementConfig) -> Keeper:
    """The daemon's gate, wired in: graph expansion in every recall and every sync pass ask
    it first; a successful pass refreshes the token. It always exists (fail closed): no pinned
    key or no token means the paid features are paused, with the reason in status.
    ``pinned``: ``config.public_keys``, parsed (``syncd.entitlement.token.pin``)."""
    gate = Gate(data_dir, pinned, store.replica_id, license_file=config.license_file)
    keeper = Keeper(gate, sync.engine.client if sync is not None else None, config)
    store.graph_gate = lambda: gate.allows("graph")
    if sync is not None:
        sync.engine.gate = lambda: gate.allows("sync")
        sync.after_success = keeper.check
    return keeper

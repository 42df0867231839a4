"""What the steps of a sync pass share (``Link``): the options, the store, the plane client, the
gate asked before each request, the status with its backoff, and what the plane is known to be.

Rules:
  * Before each request of a pass the gate is asked again (``Link.admit``), so a licence that
    ends mid-pass (``exp`` is exact, E3) stops the pass before its next request, not after.
  * The plane's model is the one its settings named (``plane_model`` in sync state), else the
    configured ``control_plane.embedding_model``.
  * A plane that names its model in its settings (a syncd hub: ``NAMES_MODEL`` is "1") returns
    every node column; one that does not (Kyma) never returns the late ones (``kept``), which a
    pulled row then must not erase.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from local_store import Store
from protocol.rows import NODE_LATE_COLUMNS
from syncd.config import ControlPlaneConfig, SyncConfig
from syncd.sync.plane import PlaneClient
from syncd.sync.status import Health

NAMES_MODEL = "plane_names_model"  # sync state: "1" when the plane's settings name its model
RESYNC = "resync_pending"  # sync state: a reset was detected, anti-entropy has not finished


_PLANE, _SYNC = ControlPlaneConfig(), SyncConfig()  # the defaults: syncd/config.py's sections


@dataclass(slots=True)
class SyncOptions:
    """The ``[control_plane]`` and ``[sync]`` values the engine uses (``from_config``). Each
    default is its config section's, never written again here; a test may set one outside
    what a config file accepts (``anti_entropy_secs = 0``: a diff every pass)."""

    realm: str | None = _PLANE.realm
    plane_model: str = _PLANE.embedding_model  # until the plane's settings name its model
    private_memories: str = _PLANE.private_memories  # "auto", "push" or "local"
    overlap_secs: float = _SYNC.overlap_secs
    push_batch_bytes: int = _SYNC.push_batch_bytes
    anti_entropy_secs: float = _SYNC.anti_entropy_secs
    long_poll: bool = _SYNC.long_poll  # use a plane's long-poll when it offers one

    @classmethod
    def from_config(cls, plane: ControlPlaneConfig, sync: SyncConfig) -> SyncOptions:
        return cls(realm=plane.realm, plane_model=plane.embedding_model,
                   private_memories=plane.private_memories, overlap_secs=sync.overlap_secs,
                   push_batch_bytes=sync.push_batch_bytes,
                   anti_entropy_secs=sync.anti_entropy_secs, long_poll=sync.long_poll)


class GateClosed(Exception):
    """The entitlement gate closed during a pass (the message is its reason)."""


@dataclass(slots=True)
class Link:
    """One engine's link to its plane, shared by the pull, the push and anti-entropy."""

    store: Store
    client: PlaneClient
    options: SyncOptions
    health: Health
    wall: Callable[[], int]
    gate: Callable[[], str | None] | None = None
    passes: int = 0  # passes started: a row's failures count per pass, not per pull

    def gated(self) -> str | None:
        """None while sync may run, else why not."""
        return self.gate() if self.gate is not None else None

    def admit(self) -> None:
        """Before each request of a pass: raises ``GateClosed`` when the gate has closed."""
        gated = self.gated()
        if gated is not None:
            raise GateClosed(gated)

    def plane_model(self, state: dict[str, str]) -> str:
        return state.get("plane_model") or self.options.plane_model


def kept(state: dict[str, str]) -> tuple[str, ...]:
    """The node columns a plane never returns: all of Kyma's late ones (its ``changes`` and
    ``export`` select a fixed list without them); none for a syncd hub (it names its model)."""
    return () if state.get(NAMES_MODEL) else NODE_LATE_COLUMNS

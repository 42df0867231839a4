"""The gate: which paid features (``sync``, ``graph``) this install may use right now.

Rules (ARCHITECTURE §6, RELIABILITY E1–E7):
  * Entitled only while a token verifies under a pinned key (``token.verify``), names this
    install's ``device_id``, has ``seq`` at or above the persisted high-water mark, and
    ``nbf <= now < exp`` — and the wall clock has not gone back past the persisted high-water
    mark (then ``clock_untrusted`` until an online check succeeds).
  * Tokens come from two files in the data directory: ``entitlement.token`` (fetched from the
    control plane, ``refresh``) and ``license`` (installed by ``syncd license install``; or
    ``entitlement.license_file``). Either one entitles; the reason shown is the best one's.
  * Any exception while evaluating → not entitled, reason ``error`` (logged). Nothing raises
    out of ``evaluate``; a tampered or truncated file never grants anything.
  * State (``gate.json``: seq and clock high-water marks, ``clock_untrusted``) is written
    atomically and fsynced before the answer is used, so a kill -9 cannot forget it.
  * ``evaluate`` does file I/O: call it off the event loop. ``allows`` is the hot path (recall,
    each sync pass): the last decision, with ``exp`` checked against the clock on every call.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from syncd.entitlement.token import MAX_TOKEN_BYTES, Claims, TokenError, verify

log = logging.getLogger("syncd.entitlement")
TOKEN_FILENAME = "entitlement.token"
LICENSE_FILENAME = "license"
STATE_FILENAME = "gate.json"
CLOCK_TOLERANCE_SECS = 120  # NTP steps smaller than this are not "the clock went back"
CLOCK_WRITE_SECS = 60  # the clock high-water mark is persisted when it moves this much
ONLINE_SKEW_SECS = 300  # an online check trusts the clock again if it agrees within this


@dataclass(slots=True)
class Decision:
    entitled: bool
    reason: str | None  # None when entitled
    features: tuple[str, ...] = ()
    plan: str | None = None
    exp: int | None = None
    source: str | None = None  # "online" or "license"
    checked_at: int = 0
    # feature → until when some entitled source grants it (both sources count: a pro licence
    # still grants graph beside a longer-lived sync-only online token)
    grants: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class GateState:
    # Highest accepted seq per source ("online", "license"): an older token of the same source
    # (a replay, a restored file) is refused; a licence issued before the last online token
    # still counts once that one expires.
    seq_hwm: dict[str, int] = field(default_factory=dict)
    clock_hwm: int = 0
    clock_untrusted: bool = False
    online_ok_at: int | None = None


class Gate:
    def __init__(self, data_dir: Path, pinned: dict[str, Ed25519PublicKey], device_id: str, *,
                 license_file: Path | None = None,
                 wall: Callable[[], float] = time.time) -> None:
        self.data_dir, self.pinned, self.device_id = data_dir, pinned, device_id
        self.license_file = license_file or data_dir / LICENSE_FILENAME
        self.wall = wall
        self.decision = Decision(False, "not_evaluated")
        # Why the last token fetched from the control plane was not stored, until one is: the
        # reason to show while no file entitles (an unpinned hub key reads as such, not as
        # "no_token").
        self._online_refusal: str | None = None

    # ------------------------------------------------------------------ hot path

    def allows(self, feature: str) -> str | None:
        """None when ``feature`` may run now; else the reason it may not."""
        decision = self.decision
        if not decision.entitled:
            return decision.reason or "not_entitled"
        until = decision.grants.get(feature)
        if until is None:
            return "feature_not_in_plan"
        if self.wall() >= until:
            return "expired"  # the offline grace ends exactly at exp
        return None

    def status(self) -> dict[str, Any]:
        return {**self.decision.as_dict(), "device_id": self.device_id,
                "sync": self.allows("sync") or "on", "graph": self.allows("graph") or "on"}

    # ------------------------------------------------------------------ evaluation

    def evaluate(self) -> Decision:
        """Re-read the token files and the state; never raises (rule 3)."""
        try:
            decision = self._evaluate()
        except Exception as exc:  # fail closed, whatever went wrong
            log.exception("entitlement check failed")
            decision = Decision(False, f"error: {type(exc).__name__}")
        if decision.reason == "no_token" and self._online_refusal is not None:
            decision = Decision(False, self._online_refusal, source="online")
        decision.checked_at = int(self.wall())
        self.decision = decision
        return decision

    def _evaluate(self) -> Decision:
        now = int(self.wall())
        state = self._load_state()
        if now < state.clock_hwm - CLOCK_TOLERANCE_SECS and not state.clock_untrusted:
            state.clock_untrusted = True
            log.warning("the wall clock is behind the last time seen (%d < %d): entitlement "
                        "paused until the control plane confirms the time", now, state.clock_hwm)
            self._save_state(state)
        if state.clock_untrusted:
            return Decision(False, "clock_untrusted")
        if now >= state.clock_hwm + CLOCK_WRITE_SECS:
            state.clock_hwm = now
            self._save_state(state)
        best = Decision(False, "no_token")
        grants: dict[str, int] = {}
        for source, path in (("online", self.data_dir / TOKEN_FILENAME),
                             ("license", self.license_file)):
            decision = self._check_file(path, source, state, now)
            if decision.entitled:  # shown: the entitled one that lasts longest
                for feature in decision.features:
                    grants[feature] = max(grants.get(feature, 0), decision.exp or 0)
                if not best.entitled or (decision.exp or 0) > (best.exp or 0):
                    best = decision
            elif not best.entitled and best.reason == "no_token":
                best = decision  # otherwise the first real reason stays
        best.grants = grants
        return best

    def _check_file(self, path: Path, source: str, state: GateState, now: int) -> Decision:
        try:
            raw = read_small(path)
            claims = verify(raw, self.pinned)
        except FileNotFoundError:
            return Decision(False, "no_token")
        except TokenError as exc:
            return Decision(False, exc.reason, source=source)
        except OSError:  # unreadable (a permission, a symlink loop…): that source only
            return Decision(False, "unreadable", source=source)
        reason = self.check_claims(claims, state, now, source)
        if reason is not None:
            return Decision(False, reason, source=source, exp=claims.exp, plan=claims.plan)
        if claims.seq > state.seq_hwm.get(source, 0):
            state.seq_hwm[source] = claims.seq
            self._save_state(state)
        return Decision(True, None, tuple(claims.features), claims.plan, claims.exp, source)

    def check_claims(self, claims: Claims, state: GateState, now: int,
                     source: str) -> str | None:
        if claims.device_id != self.device_id:
            return "wrong_device"
        if claims.seq < state.seq_hwm.get(source, 0):
            return "seq_rollback"
        if now < claims.nbf:
            return "not_yet_valid"
        if now >= claims.exp:
            return "expired"
        return None

    # ------------------------------------------------------------------ online refresh

    def accept_online(self, token: str, server_now: int | None) -> Decision:
        """Store a token fetched from the control plane (after checking it as ``evaluate``
        would). A fetch whose signed ``iat`` (or the server's clock) agrees with ours within
        ``ONLINE_SKEW_SECS`` is an online check: the clock is trusted again from now."""
        try:
            claims = verify(token, self.pinned)
            now = int(self.wall())
            state = self._load_state()
            refusal = self.check_claims(claims, state, now, "online")
            if refusal is not None:
                self._online_refusal = refusal
                return self.evaluate()  # refused: not an online check, the clock stays as it was
            reference = server_now if server_now is not None else claims.iat
            fresh = claims.seq > state.seq_hwm.get("online", 0)  # a replay proves nothing
            if fresh and abs(reference - now) <= ONLINE_SKEW_SECS:
                state.clock_untrusted, state.clock_hwm, state.online_ok_at = False, now, now
                self._save_state(state)
            self._write_atomic(self.data_dir / TOKEN_FILENAME, token.encode() + b"\n")
            self._online_refusal = None
        except TokenError as exc:
            log.warning("the control plane sent an entitlement that does not verify: %s",
                        exc.reason)
            self._online_refusal = exc.reason
        except Exception:
            log.exception("storing the entitlement failed")
        return self.evaluate()

    def install_license(self, raw: bytes) -> Claims:
        """Verify a licence and install it (``syncd license install``); raises TokenError or
        ValueError with the reason when it would not entitle this install."""
        claims = verify(raw, self.pinned)
        reason = self.check_claims(claims, self._load_state(), int(self.wall()), "license")
        if reason is not None:
            raise TokenError(reason, f"this licence would not entitle this install: {reason}")
        self._write_atomic(self.license_file, raw.strip() + b"\n")
        return claims

    # ------------------------------------------------------------------ state file


    def _load_state(self) -> GateState:
        path = self.data_dir / STATE_FILENAME
        try:
            data = json.loads(path.read_bytes())
        except FileNotFoundError:
            return GateState()
        if not isinstance(data, dict):
            raise ValueError(f"{path}: not a JSON object")
        hwm = data.get("seq_hwm", {})
        if not isinstance(hwm, dict):
            raise ValueError(f"{path}: seq_hwm is not an object")
        return GateState(seq_hwm={str(k): int(v) for k, v in hwm.items()},
                         clock_hwm=int(data.get("clock_hwm", 0)),
                         clock_untrusted=bool(data.get("clock_untrusted", False)),
                         online_ok_at=data.get("online_ok_at"))

    def _save_state(self, state: GateState) -> None:
        body = json.dumps({"seq_hwm": state.seq_hwm, "clock_hwm": state.clock_hwm,
                           "clock_untrusted": state.clock_untrusted,
                           "online_ok_at": state.online_ok_at}).encode()
        self._write_atomic(self.data_dir / STATE_FILENAME, body)

    def _write_atomic(self, path: Path, body: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(prefix="." + path.name, dir=path.parent)  # 0600
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(body)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def read_small(path: Path) -> bytes:
    """A token file's bytes: a regular file, read without blocking and at most one byte past
    the token limit (a FIFO or ``/dev/zero`` put there cannot hang or exhaust the daemon)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise TokenError("unreadable", f"{path} is not a regular file")
        return os.read(fd, MAX_TOKEN_BYTES + 1)
    finally:
        os.close(fd)

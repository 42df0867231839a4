"""The gate: which paid features (``sync``, ``graph``) this install may use right now.

Rules (ARCHITECTURE §6, RELIABILITY E1–E7):
  * Entitled only while a token verifies under a pinned key (``token.verify``), names this
    install's ``device_id``, has ``seq`` at or above the persisted high-water mark of its source
    and signing key, and ``nbf <= now < exp`` — and the wall clock has not gone back past the
    persisted high-water mark (then ``clock_untrusted`` until an online check succeeds).
  * ``now`` is the gate's time: the wall clock plus ``clock_offset``, how far the control
    plane's signed ``iat`` was ahead of the wall clock at the last fresh online check (never
    negative). A laptop whose clock is slow still takes the plane's tokens (their ``nbf`` is the
    plane's now − 300 s); the offset only moves the gate's time forward, so ``exp`` comes
    sooner, never later (fail closed).
  * Tokens come from two files in the data directory: ``entitlement.token`` (fetched from the
    control plane, ``refresh``) and ``license`` (installed by ``syncd license install``; or
    ``entitlement.license_file``). Either one entitles; the reason shown is the best one's —
    or, when none entitles, why the last token fetched from the plane was refused.
  * Seq marks are per (source, kid): a new signing key (a rotated key, a new hub) starts its
    own counter.
  * Any exception while evaluating → not entitled, reason ``error…`` (logged). Nothing raises
    out of ``evaluate``; a tampered or truncated file never grants anything.
  * State (``gate.json``: seq and clock high-water marks, ``clock_untrusted``, the clock
    offset) is written atomically and fsynced before the answer is used, so a kill -9 cannot
    forget it. It is read like a token file (regular file, non-blocking, size-limited). An
    unreadable one is ``STATE_UNREADABLE`` — never "no history" — until a verified online
    check rewrites it, starting from an untrusted clock as after a clock step back.
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

from syncd.entitlement.token import MAX_TOKEN_BYTES, Claims, TokenError, kid_of, verify

log = logging.getLogger("syncd.entitlement")
TOKEN_FILENAME = "entitlement.token"
LICENSE_FILENAME = "license"
STATE_FILENAME = "gate.json"
CLOCK_TOLERANCE_SECS = 120  # NTP steps smaller than this are not "the clock went back"
CLOCK_WRITE_SECS = 60  # the clock high-water mark is persisted when it moves this much
ONLINE_SKEW_SECS = 300  # an online check trusts the clock again if it agrees within this
MAX_STATE_BYTES = 64 * 1024
STATE_UNREADABLE = "error: state_unreadable"  # gate.json exists but cannot be read or parsed


class StateError(ValueError):
    """``gate.json`` exists but cannot be trusted (not a regular file, too big, corrupt)."""


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
    clock_offset: int = 0  # added to the wall clock: the gate's time (GateState.clock_offset)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class GateState:
    # Highest accepted seq per source ("online", "license") and signing key (kid): an older
    # token of the same source and key (a replay, a restored file) is refused; a licence issued
    # before the last online token still counts once that one expires; a new key's counter
    # (key rotation, a new hub) starts from nothing.
    seq_marks: dict[str, dict[str, int]] = field(default_factory=dict)
    clock_hwm: int = 0
    clock_untrusted: bool = False
    online_ok_at: int | None = None
    clock_offset: int = 0  # seconds the plane's signed time was ahead of ours (never < 0)

    def mark(self, source: str, kid: str) -> int:
        return self.seq_marks.get(source, {}).get(kid, 0)

    def raise_mark(self, source: str, kid: str, seq: int) -> bool:
        """Record ``seq`` as accepted; True when the mark moved (the state must be saved)."""
        if seq <= self.mark(source, kid):
            return False
        self.seq_marks.setdefault(source, {})[kid] = seq
        return True


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
        # "no_token" or an old file's "expired").
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
        if self.wall() + decision.clock_offset >= until:
            return "expired"  # the offline grace ends exactly at exp
        return None

    def status(self) -> dict[str, Any]:
        return {**self.decision.as_dict(), "device_id": self.device_id,
                "sync": self.allows("sync") or "on", "graph": self.allows("graph") or "on"}

    # ------------------------------------------------------------------ evaluation

    @property
    def online_refusal(self) -> str | None:
        """Why the last token fetched from the control plane was not stored, until one is."""
        return self._online_refusal

    def evaluate(self) -> Decision:
        """Re-read the token files and the state; never raises (rule 3)."""
        try:
            decision = self._evaluate()
        except StateError as exc:  # fail closed; never read as "no history"
            if self.decision.reason != STATE_UNREADABLE:  # logged once, not every minute
                log.error("%s: entitlement paused until an online check rewrites it", exc)
            decision = Decision(False, STATE_UNREADABLE)
        except Exception as exc:  # fail closed, whatever went wrong
            log.exception("entitlement check failed")
            decision = Decision(False, f"error: {type(exc).__name__}")
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
            decision = self._check_file(path, source, state, now + state.clock_offset)
            if decision.entitled:  # shown: the entitled one that lasts longest
                for feature in decision.features:
                    grants[feature] = max(grants.get(feature, 0), decision.exp or 0)
                if not best.entitled or (decision.exp or 0) > (best.exp or 0):
                    best = decision
            elif not best.entitled and best.reason == "no_token":
                best = decision  # otherwise the first real reason stays
        if not best.entitled and self._online_refusal is not None:
            # the plane's current answer says more than a stale file's reason
            best = Decision(False, self._online_refusal, source="online")
        best.grants, best.clock_offset = grants, state.clock_offset
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
        kid = kid_of(raw) or ""  # verified: the framing names a pinned key
        reason = self.check_claims(claims, state, now, source, kid)
        if reason is not None:
            return Decision(False, reason, source=source, exp=claims.exp, plan=claims.plan)
        if state.raise_mark(source, kid, claims.seq):
            self._save_state(state)
        return Decision(True, None, tuple(claims.features), claims.plan, claims.exp, source)

    def check_claims(self, claims: Claims, state: GateState, now: int, source: str,
                     kid: str) -> str | None:
        """Why verified ``claims`` (signed by ``kid``) do not entitle at the gate's time
        ``now``; None when they do."""
        if claims.device_id != self.device_id:
            return "wrong_device"
        if claims.seq < state.mark(source, kid):
            return "seq_rollback"
        if now < claims.nbf:
            return "not_yet_valid"
        if now >= claims.exp:
            return "expired"
        return None

    # ------------------------------------------------------------------ online refresh

    def accept_online(self, token: str, server_now: int | None) -> Decision:
        """Store a token fetched from the control plane (after checking it as ``evaluate``
        would, at the plane's time when ours is behind). A fresh fetch (a ``seq`` above the
        key's mark) measures ``clock_offset`` from its signed ``iat``; when its ``iat`` (or the
        server's clock) agrees with ours within ``ONLINE_SKEW_SECS`` it is an online check:
        the clock is trusted again from now. An unreadable state file is replaced, starting
        from an untrusted clock, so only such a check entitles again."""
        try:
            claims = verify(token, self.pinned)
            kid = kid_of(token) or ""
            now = int(self.wall())
            try:
                state, rewrite = self._load_state(), False
            except StateError as exc:
                log.warning("%s: replacing it from this online check", exc)
                state, rewrite = GateState(clock_untrusted=True), True
            fresh = claims.seq > state.mark("online", kid)  # a replay proves nothing
            offset = max(0, claims.iat - now) if fresh else state.clock_offset
            refusal = self.check_claims(claims, state, now + offset, "online", kid)
            if refusal is not None:
                self._online_refusal = refusal
                return self.evaluate()  # refused: not an online check, the clock stays as it was
            reference = server_now if server_now is not None else claims.iat
            if fresh:
                state.clock_offset = offset
                if abs(reference - now) <= ONLINE_SKEW_SECS:
                    state.clock_untrusted, state.clock_hwm, state.online_ok_at = False, now, now
            if fresh or rewrite:
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
        state = self._load_state()
        reason = self.check_claims(claims, state, int(self.wall()) + state.clock_offset,
                                   "license", kid_of(raw) or "")
        if reason is not None:
            raise TokenError(reason, f"this licence would not entitle this install: {reason}")
        self._write_atomic(self.license_file, raw.strip() + b"\n")
        return claims

    # ------------------------------------------------------------------ state file

    def _load_state(self) -> GateState:
        """The state; a missing file is no history, anything unreadable a ``StateError``."""
        path = self.data_dir / STATE_FILENAME
        try:
            raw = read_small(path, MAX_STATE_BYTES)
        except FileNotFoundError:
            return GateState()
        except (OSError, TokenError) as exc:
            raise StateError(f"{path} cannot be read: {exc}") from None
        if len(raw) > MAX_STATE_BYTES:
            raise StateError(f"{path} is larger than {MAX_STATE_BYTES} bytes")
        try:
            return self._parse_state(json.loads(raw))
        except (ValueError, TypeError) as exc:
            raise StateError(f"{path} is not a valid gate state: {exc}") from None

    def _parse_state(self, data: object) -> GateState:
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        ok_at = data.get("online_ok_at")
        if ok_at is not None and not isinstance(ok_at, int):
            raise ValueError("online_ok_at is not an integer")
        marks = data.get("seq_marks")
        if marks is None:
            marks = self._legacy_marks(data.get("seq_hwm", {}))
        if not isinstance(marks, dict) or not all(isinstance(m, dict) for m in marks.values()):
            raise ValueError("seq_marks is not an object of objects")
        return GateState(
            seq_marks={str(s): {str(k): int(v) for k, v in m.items()} for s, m in marks.items()},
            clock_hwm=int(data.get("clock_hwm", 0)),
            clock_untrusted=bool(data.get("clock_untrusted", False)), online_ok_at=ok_at,
            clock_offset=max(0, int(data.get("clock_offset", 0))))

    def _legacy_marks(self, hwm: object) -> dict[str, dict[str, int]]:
        """Per-source marks of a ``gate.json`` written before marks were per key: each goes to
        the key that signed the token in that source's file now (the one it was last raised
        for), or, when the file names no key, to every pinned key (nothing replays for free)."""
        if not isinstance(hwm, dict):
            raise ValueError("seq_hwm is not an object")
        marks: dict[str, dict[str, int]] = {}
        for source, seq in hwm.items():
            path = self.data_dir / TOKEN_FILENAME if source == "online" else self.license_file
            try:
                kid = kid_of(read_small(path))
            except (OSError, TokenError):
                kid = None
            marks[str(source)] = {k: int(seq) for k in ([kid] if kid else self.pinned)}
        return marks

    def _save_state(self, state: GateState) -> None:
        # seq_hwm (the highest mark per source) is for older syncd versions, which read only
        # that; this one reads seq_marks whenever it is there.
        legacy = {s: max(m.values()) for s, m in state.seq_marks.items() if m}
        body = json.dumps({"seq_marks": state.seq_marks, "seq_hwm": legacy,
                           "clock_hwm": state.clock_hwm,
                           "clock_untrusted": state.clock_untrusted,
                           "online_ok_at": state.online_ok_at,
                           "clock_offset": state.clock_offset}).encode()
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


def read_small(path: Path, limit: int = MAX_TOKEN_BYTES) -> bytes:
    """A small file's bytes (a token, the gate state): a regular file, read without blocking
    and at most one byte past ``limit`` (a FIFO or ``/dev/zero`` put there cannot hang or
    exhaust the daemon)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise TokenError("unreadable", f"{path} is not a regular file")
        return os.read(fd, limit + 1)
    finally:
        os.close(fd)

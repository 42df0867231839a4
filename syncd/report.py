"""How command results read to a person: ``syncd status`` and ``syncd sync`` (``--json``
prints the raw answers instead)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

GATE_HINTS = {
    "no_token": "no entitlement yet: sync with a control plane whose key is pinned in "
                "[entitlement] public_keys, or `syncd license install FILE`",
    "unknown_key": "the control plane's entitlement is signed by a key that is not pinned: add "
                   "the key `syncd hub key` prints to [entitlement] public_keys",
    "wrong_device": "the entitlement was issued for another install (device_id)",
    "clock_untrusted": "this computer's clock went back; the next successful online check "
                       "clears it",
    "seq_rollback": "the entitlement is older than one already accepted from the same key (a "
                    "restored or copied file): fetch a new one (`syncd sync`) or install a "
                    "newer licence",
    "not_yet_valid": "the entitlement is not valid yet by this computer's clock: check the "
                     "clock (and time zone), or wait for the next online check",
    "expired": "the entitlement expired: the control plane could not be reached to renew it "
               "(see the last online check, if shown), or install a newer licence",
    "unreadable": "a token file (entitlement.token or the licence) is not a readable regular "
                  "file: check its type and permissions",
    "malformed": "a token file is damaged: the next online check replaces entitlement.token; "
                 "install the licence again",
    "invalid_signature": "a token does not verify under its pinned key (damaged or forged): "
                         "the next online check replaces entitlement.token",
    "error: state_unreadable": "{data_dir}/gate.json cannot be read (see the daemon log): the "
                               "next successful online check rewrites it",
}
ERROR_HINT = "the entitlement check failed unexpectedly: see the daemon log"
FAR_FUTURE = 253402300800  # 10000-01-01 00:00 UTC: beyond what a date can print


def when(epoch: object) -> str:
    """An entitlement's ``exp`` (seconds since the epoch) as a UTC time."""
    if not isinstance(epoch, int | float):
        return str(epoch)
    if epoch >= FAR_FUTURE:
        return f"after 9999-12-31 (at {epoch:.0f} s since the epoch)"
    try:
        return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")
    except (ValueError, OverflowError, OSError):  # before year 1, or the platform refuses
        return f"{epoch:.0f} s since the epoch"


def _shown(value: object) -> str:
    """A status value as text: "-" for none (rather than Python's ``None``)."""
    return "-" if value is None else str(value)


def status_lines(status: dict[str, Any]) -> list[str]:
    """``GET /v1/agent/status`` below its first line: the store, the gate and sync."""
    lines = [f"  {key:16} {status.get(key)}" for key in (
        "data_dir", "store_id", "replica_id", "embedder", "memories", "tombstones", "edges",
        "outbox", "indexed_vectors")]
    if status.get("embedder_error"):
        lines[3] += (f" — failing ({status['embedder_error']}): memories are saved without a "
                     "vector and recall is keyword-only until it works")
    if status.get("outbox") and not (status.get("sync") or {}).get("configured"):
        lines[7] += (" — memories and edges not yet pushed, one entry each however often "
                     "edited; kept for when sync is set up, pushed on its first pass")
    if status.get("conflicts"):
        ids = ", ".join(status.get("conflict_memories") or [])
        lines.append(f"  {'conflicts':16} {status['conflicts']} — versions that lost to a "
                     "concurrent edit, kept for review (restore or dismiss): `syncd history "
                     f"ID` for {ids}, or the web page's Sync view (`syncd open`)")
    return lines + _gate_lines(status.get("entitlement") or {}, status.get("data_dir")) + \
        _sync_lines(status.get("sync") or {})


def _gate_lines(gate: dict[str, Any], data_dir: object) -> list[str]:
    online = gate.get("last_online_error")
    tail = [f"  {'':16} last online check: {online}"] if online else []
    if gate.get("entitled"):
        head = (f"plan {gate.get('plan')} ({gate.get('source')}), sync {gate.get('sync')}, "
                f"graph {gate.get('graph')}, expires {when(gate.get('exp'))}")
        return [f"  {'entitlement':16} {head}", *tail]
    reason = str(gate.get("reason"))
    hint = GATE_HINTS.get(reason) or (ERROR_HINT if reason.startswith("error") else None)
    head = f"paid features paused ({reason}); saving, recall and export work as always"
    return [f"  {'entitlement':16} {head}", *tail,
            *([f"  {'':16} {hint.format(data_dir=data_dir)}"] if hint else [])]


def _sync_lines(sync: dict[str, Any]) -> list[str]:
    if not sync.get("configured"):
        return ["  sync             off (no control_plane.url)"]
    return [f"  sync             {sync['url']} (every {sync['interval_secs']:.0f} s)"] + [
        f"    {key:20} {_shown(sync.get(key))}" for key in (
            "last_success", "last_error", "cursor", "outbox", "clock_offset_ms",
            "consecutive_failures", "auth_blocked")] + [
        f"    {'awaiting_vector':20} {waiting} memories wait for a vector of the plane's model "
        f"(see last_error)" for waiting in [sync.get("awaiting_vector")] if waiting] + [
        f"    {key:20} {', '.join(rows)}" for key in ("skipped_rows", "too_large_rows")
        if (rows := sync.get(key))] + [
        f"    {'clock_refused':20} {refused}"
        for refused in [sync.get("clock_offset_refused")] if refused] + _auth_hint(sync)


def _auth_hint(sync: dict[str, Any]) -> list[str]:
    """What to do when the plane refuses this install's credentials (401/403)."""
    if not sync.get("auth_blocked"):
        return []
    token_file = sync.get("token_file")
    if token_file is None:
        return ["    hint: no control_plane.token_file is set: the plane needs its bearer "
                "token there (first line); then `syncd sync`"]
    return [f"    hint: the plane refused the token in {token_file}: put a valid one there "
            "(first line); then `syncd sync`"]


def _n(count: object, one: str, many: str | None = None) -> str:
    return f"{count} {one if count == 1 else many or one + 's'}"


def pass_summary(r: dict[str, Any]) -> list[str]:
    """A sync pass's report for a person (``--json`` gives all of it)."""
    outcome = "ok" if r.get("ok") else (
        "incomplete" if r.get("error_kind") == "held_back" else "failed")
    head = f"sync {outcome} in {r.get('took_ms', 0):.0f} ms"
    lines = [f"{head}: pulled {_n(r.get('pulled_nodes'), 'memory', 'memories')} and "
             f"{_n(r.get('pulled_edges'), 'edge')} in {_n(r.get('pull_pages'), 'page')}, pushed "
             f"{_n(r.get('pushed_nodes'), 'memory', 'memories')} and "
             f"{_n(r.get('pushed_edges'), 'edge')} in {_n(r.get('push_requests'), 'request')}"]
    notes = [(r.get("reset"), f"the control plane looks reset ({r.get('reset')}): "
                              "resynced from the start"),
             (r.get("anti_entropy"), "anti-entropy: compared the whole store with the plane"),
             (r.get("requeued"), f"{r.get('requeued')} rows queued again for push"),
             (r.get("pull_problems"), f"{r.get('pull_problems')} pulled rows refused (see "
                                      "`syncd status`)"),
             (r.get("push_row_errors"), f"{r.get('push_row_errors')} pushed rows refused by "
                                        "the plane"),
             (r.get("future_rows"), f"{r.get('future_rows')} rows stamped ahead of this clock"),
             (r.get("error") and r.get("error_kind") == "held_back",
              f"rows held back: {r.get('error')}"),
             (r.get("error") and r.get("error_kind") != "held_back",
              f"error ({r.get('error_kind')}): {r.get('error')}")]
    lines += [f"  {text}" for present, text in notes if present]
    lines += [f"  {hint}" for kind, hint in PASS_HINTS if r.get("error_kind") == kind]
    return lines


PASS_HINTS = (
    ("gated", "`syncd status` says why paid features are paused and what to do"),
    ("auth", "the control plane refused this install's token: fix control_plane.token_file "
             "and run `syncd sync` (it reads the file again); scheduled passes wait for that"),
)



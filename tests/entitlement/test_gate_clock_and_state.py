"""Review fixes of the gate (RELIABILITY E3–E6, R10): a slow laptop clock, key rotation, the
reason shown for a refused fetch, an unreadable ``gate.json``, what ``syncd status`` prints, and
a hub tokens file with an unknown plan. Real keys, a real signing hub, real processes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from syncd.config import EntitlementConfig
from syncd.entitlement.gate import STATE_FILENAME, STATE_UNREADABLE
from syncd.entitlement.keeper import Keeper
from syncd.entitlement.token import key_id, public_key_text, sign
from syncd.hub.tokens import TOKENS_FILENAME
from syncd.report import status_lines
from syncd.sync.plane import PlaneClient
from tests.entitlement.support import (
    DAY,
    DEVICE,
    Clock,
    SigningHub,
    claims,
    license_path,
    make_gate,
    now,
    pinned,
    start_signing_hub,
    token_path,
)
from tests.entitlement.test_daemon_gate import Local, run_daemon, stop, write
from tests.syncd.processes import cli, spawn, wait_ready

T = 1_780_000_000
KEY_A = Ed25519PrivateKey.generate()
KEY_B = Ed25519PrivateKey.generate()


@pytest.fixture
async def hub2(tmp_path: Path) -> AsyncIterator[SigningHub]:
    """A second hub: its own signing key and its own entitlement_seq counter (from 1)."""
    h = await start_signing_hub(tmp_path / "hub2")
    try:
        yield h
    finally:
        await h.close()


def state(data: Path) -> dict[str, object]:
    loaded = json.loads((data / STATE_FILENAME).read_bytes())
    assert isinstance(loaded, dict)
    return loaded


# ---------------------------------------------------------------------- a slow clock (R10)


async def test_a_laptop_an_hour_slow_is_entitled_online_and_stays_so(tmp_path: Path,
                                                                     hub: SigningHub) -> None:
    """The hub signs nbf = its now - 300 s. A laptop an hour slow stores the token it fetches,
    is entitled at once (the gate's time moves to the plane's signed iat), stays entitled over
    hourly refreshes, and still once its own clock has caught up."""
    real = now()
    clock = Clock(real - 3600)
    data = tmp_path / "data"
    gate = make_gate(data, pinned(hub.key), clock)
    keeper = Keeper(gate, PlaneClient(hub.url, hub.token), EntitlementConfig(refresh_secs=3600))
    try:
        decision = await keeper.check()
        assert keeper.last_online_error is None
        assert await asyncio.to_thread(token_path(data).exists)
        assert decision.entitled, decision.reason
        assert 3500 <= decision.clock_offset <= 3700
        for _ in range(3):  # every refresh replaces the file: never a gap
            clock.now += 3600
            assert (await keeper.check()).entitled
        clock.now = real + 4 * 3600 + 60  # the clock is set right: still entitled
        assert (await keeper.check(online=False)).entitled
        assert (await keeper.check()).entitled
        assert gate.decision.clock_offset <= 60
    finally:
        assert keeper.client is not None
        await keeper.client.close()


def test_the_clock_offset_only_moves_the_gates_time_forward(tmp_path: Path) -> None:
    """Fail closed: a token whose nbf is ahead of the plane's own signed time is refused and not
    stored; with a laptop an hour slow the offline grace ends at exp by the plane's time (an
    hour early by the laptop's), and a laptop ahead of the plane gets no offset at all."""
    clock = Clock(T - 3600)
    gate = make_gate(tmp_path, pinned(KEY_A), clock)
    early = sign(KEY_A, claims(T, nbf=T + 60))  # not valid yet even by the plane's clock
    decision = gate.accept_online(early, None)
    assert (decision.entitled, decision.reason) == (False, "not_yet_valid")
    assert not token_path(tmp_path).exists()
    decision = gate.accept_online(sign(KEY_A, claims(T, seq=2, exp=T + DAY)), None)
    assert decision.entitled and decision.clock_offset == 3600
    assert state(tmp_path)["clock_offset"] == 3600
    clock.now = T + DAY - 3600 - 1
    assert gate.allows("sync") is None
    clock.now = T + DAY - 3600
    assert gate.allows("sync") == "expired" and gate.evaluate().reason == "expired"

    ahead = make_gate(tmp_path / "ahead", pinned(KEY_A), Clock(T + 3600))
    decision = ahead.accept_online(sign(KEY_A, claims(T, exp=T + DAY)), None)
    assert decision.entitled and decision.clock_offset == 0


# ---------------------------------------------------------------------- seq marks per key (E5)


async def test_a_new_signing_key_starts_its_own_seq_mark(tmp_path: Path, hub: SigningHub,
                                                         hub2: SigningHub) -> None:
    """Key rotation / a new hub: its counter restarts at 1 and its tokens are taken; the old
    key's mark still refuses the old key's older tokens."""
    clock = Clock(now())
    data = tmp_path / "data"
    old = make_gate(data, pinned(hub.key), clock)
    issued = [await hub.issue(DEVICE) for _ in range(3)]
    for token, _ in issued:
        assert (await asyncio.to_thread(old.accept_online, token, None)).entitled
    gate = make_gate(data, pinned(hub.key, hub2.key), clock)  # both pinned while rotating
    token, fetched = await hub2.issue(DEVICE)
    assert fetched["seq"] == 1
    decision = await asyncio.to_thread(gate.accept_online, token, None)
    assert decision.entitled, decision.reason
    assert (await asyncio.to_thread(token_path(data).read_text)).strip() == token
    assert (await asyncio.to_thread(state, data))["seq_marks"] == {"online": {key_id(hub.key.public_key()): 3,
                                                   key_id(hub2.key.public_key()): 1}}
    await asyncio.to_thread(token_path(data).write_text, issued[0][0])  # put back
    assert (await asyncio.to_thread(gate.evaluate)).reason == "seq_rollback"


@pytest.mark.parametrize("in_file", ["the old key's token", "no token file"])
def test_an_old_per_source_state_file_still_loads(tmp_path: Path, in_file: str) -> None:
    """gate.json written before marks were per key ({"seq_hwm": {"online": 5}}) still loads:
    the mark goes to the key whose token is in the file (a new key starts afresh); with no
    token file to tell, to every pinned key (fail closed)."""
    clock = Clock(T)
    gate = make_gate(tmp_path, pinned(KEY_A, KEY_B), clock)
    (tmp_path / STATE_FILENAME).write_text(json.dumps(
        {"seq_hwm": {"online": 5}, "clock_hwm": T, "clock_untrusted": False,
         "online_ok_at": T}))
    if in_file == "the old key's token":
        token_path(tmp_path).write_text(sign(KEY_A, claims(T, seq=5)))
    replayed = sign(KEY_A, claims(T, seq=4))
    gate.accept_online(replayed, None)  # the file's seq-5 token may still entitle
    assert gate.online_refusal == "seq_rollback"
    assert not token_path(tmp_path).exists() or token_path(tmp_path).read_text() != replayed
    fresh_key = gate.accept_online(sign(KEY_B, claims(T, seq=1)), None)
    if in_file == "the old key's token":
        assert fresh_key.entitled, fresh_key.reason
        assert state(tmp_path)["seq_marks"] == {"online": {key_id(KEY_A.public_key()): 5,
                                                           key_id(KEY_B.public_key()): 1}}
    else:
        assert fresh_key.reason == "seq_rollback"
        assert gate.accept_online(sign(KEY_B, claims(T, seq=6)), None).entitled


# ---------------------------------------------------------------------- the reason shown


async def test_a_refused_fetch_is_shown_over_a_stale_files_reason(
        tmp_path: Path, hub: SigningHub, hub2: SigningHub) -> None:
    """The plane now signs with a key that is not pinned and the stored token has expired: the
    reason is unknown_key (not the old file's "expired") and last_online_error says so; a
    stored token clears both."""
    clock = Clock(now())
    data = tmp_path / "data"
    gate = make_gate(data, pinned(hub.key), clock)
    keeper = Keeper(gate, PlaneClient(hub.url, hub.token), EntitlementConfig(refresh_secs=3600))
    rotated = Keeper(gate, PlaneClient(hub2.url, hub2.token), EntitlementConfig(refresh_secs=3600))
    try:
        decision = await keeper.check()
        assert decision.entitled and decision.exp is not None
        clock.now = decision.exp + 10
        assert (await keeper.check(online=False)).reason == "expired"
        decision = await rotated.check()
        assert (decision.entitled, decision.reason, decision.source) == (
            False, "unknown_key", "online")
        assert "refused: unknown_key" in (rotated.last_online_error or "")
        assert rotated.status()["last_online_error"] == rotated.last_online_error
        assert (await keeper.check(online=False)).reason == "unknown_key"
        clock.now = now()
        assert (await keeper.check()).entitled and keeper.last_online_error is None
    finally:
        for k in (keeper, rotated):
            assert k.client is not None
            await k.client.close()


# ---------------------------------------------------------------------- an unreadable state (E6)


async def test_a_corrupt_state_file_names_itself_and_an_online_check_rewrites_it(
        tmp_path: Path, hub: SigningHub) -> None:
    """A truncated gate.json: not entitled with reason error: state_unreadable (fail closed,
    never "no history"); a fresh online check whose time agrees rewrites the state and entitles."""
    clock = Clock(now())
    data = tmp_path / "data"
    gate = make_gate(data, pinned(hub.key), clock)
    token, _ = await hub.issue(DEVICE)
    assert (await asyncio.to_thread(gate.accept_online, token, None)).entitled
    path = data / STATE_FILENAME
    await asyncio.to_thread(path.write_bytes, (await asyncio.to_thread(path.read_bytes))[:7])
    decision = await asyncio.to_thread(gate.evaluate)
    assert (decision.entitled, decision.reason) == (False, STATE_UNREADABLE)
    assert gate.allows("sync") == STATE_UNREADABLE
    fresh, _ = await hub.issue(DEVICE)
    decision = await asyncio.to_thread(gate.accept_online, fresh, None)
    assert decision.entitled, decision.reason
    saved = await asyncio.to_thread(state, data)
    assert saved["clock_untrusted"] is False and saved["online_ok_at"] == int(clock.now)


async def test_a_rewritten_state_starts_from_an_untrusted_clock(tmp_path: Path,
                                                                hub: SigningHub) -> None:
    """Fail closed: the state is gone, so is the clock's high-water mark. An online check whose
    time disagrees with ours by a day rewrites the file as clock_untrusted; only one that
    agrees entitles."""
    data = tmp_path / "data"
    clock = Clock(now() - DAY)
    gate = make_gate(data, pinned(hub.key), clock)
    await asyncio.to_thread((data / STATE_FILENAME).write_bytes, b"{not json")
    token, _ = await hub.issue(DEVICE)
    assert (await asyncio.to_thread(gate.accept_online, token, None)).reason == "clock_untrusted"
    assert (await asyncio.to_thread(state, data))["clock_untrusted"] is True
    clock.now = now()
    token, _ = await hub.issue(DEVICE)
    assert (await asyncio.to_thread(gate.accept_online, token, None)).entitled


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "huge"])
def test_a_state_file_that_is_not_a_small_regular_file_cannot_hang(tmp_path: Path,
                                                                   kind: str) -> None:
    """gate.json as a FIFO (no writer), a symlink to /dev/zero or 1 MiB: read like a token file
    (non-blocking, regular files only, size-limited) → state_unreadable at once; a verified
    online check replaces it."""
    clock = Clock(T)
    gate = make_gate(tmp_path, pinned(KEY_A), clock)
    path = tmp_path / STATE_FILENAME
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "/dev/zero":
        path.symlink_to("/dev/zero")
    else:
        path.write_bytes(b" " * (1 << 20))
    token_path(tmp_path).write_text(sign(KEY_A, claims(T)))
    assert gate.evaluate().reason == STATE_UNREADABLE
    decision = gate.accept_online(sign(KEY_A, claims(T, seq=2)), None)
    assert decision.entitled, decision.reason
    assert path.is_file() and not path.is_symlink() and state(tmp_path)["seq_marks"]


async def test_a_fifo_state_file_neither_hangs_start_nor_sigterm(tmp_path: Path) -> None:
    """`syncd run` with a FIFO at gate.json reports ready, says why in `syncd status`, and
    exits cleanly on SIGTERM."""
    data = tmp_path / "data"
    await asyncio.to_thread(data.mkdir, mode=0o700)
    await asyncio.to_thread(os.mkfifo, data / STATE_FILENAME)
    proc = await spawn(tmp_path, "--data-dir", str(data), "run", "--listen", "127.0.0.1:0")
    try:
        await wait_ready(proc, deadline=30)
        code, out, err = await cli(tmp_path, "--data-dir", str(data), "status")
        assert code == 0, err
        assert f"paid features paused ({STATE_UNREADABLE})" in out, out
        assert f"{data}/gate.json cannot be read" in out, out
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


# ---------------------------------------------------------------------- syncd status


async def test_status_prints_a_licence_that_outlives_year_9999(tmp_path: Path) -> None:
    """A validly signed licence with exp past 9999-12-31: the daemon is entitled and `syncd
    status` prints it (it used to die formatting the date)."""
    key = Ed25519PrivateKey.generate()
    data = tmp_path / "data"
    config = tmp_path / "syncd.toml"
    await write(config, f'[entitlement]\npublic_keys = ["{public_key_text(key.public_key())}"]\n')
    base = ("--config", str(config), "--data-dir", str(data))
    proc, url = await run_daemon(tmp_path, *base)
    try:
        async with aiohttp.ClientSession() as session:
            local = Local(proc, url, data, session)
            _, body = await local.call("GET", "/v1/agent/status")
            device = body["entitlement"]["device_id"]
            exp = 253402300800 + DAY
            await write(license_path(data), sign(key, claims(now(), device=device, exp=exp)))
            status, gate = await local.call("POST", "/v1/agent/entitlement/check", {})
            assert status == 200 and gate["entitled"] is True, gate
        code, out, err = await cli(tmp_path, *base, "status")
        assert code == 0, err[-600:]
        assert f"expires after 9999-12-31 (at {exp} s since the epoch)" in out, out
    finally:
        await stop(proc)


async def test_status_prints_why_the_online_check_fails(tmp_path: Path,
                                                        hub: SigningHub) -> None:
    """The plane refuses this install's token (401) on every entitlement fetch: `syncd status`
    prints the error, not only 'paused (no_token)'."""
    data = tmp_path / "data"
    config = tmp_path / "syncd.toml"
    token_file = tmp_path / "plane-token"
    await write(token_file, "not-the-right-token\n")
    await write(config, f'[entitlement]\npublic_keys = ["{public_key_text(hub.key.public_key())}"]'
                        f'\n[control_plane]\nurl = "{hub.url}"\ntoken_file = "{token_file}"\n')
    base = ("--config", str(config), "--data-dir", str(data))
    proc, url = await run_daemon(tmp_path, *base)
    try:
        async with aiohttp.ClientSession() as session:
            status, gate = await Local(proc, url, data, session).call(
                "POST", "/v1/agent/entitlement/check", {})
            assert status == 200 and gate["entitled"] is False
            error = gate["last_online_error"]
            assert "401" in (error or ""), gate
        code, out, err = await cli(tmp_path, *base, "status")
        assert code == 0, err
        assert f"last online check: {error}" in out, out
    finally:
        await stop(proc)


@pytest.mark.parametrize(("reason", "words"), [
    ("seq_rollback", "older than one already accepted"),
    ("not_yet_valid", "not valid yet by this computer's clock"),
    ("expired", "expired"),
    ("unreadable", "not a readable regular file"),
    (STATE_UNREADABLE, "/srv/syncd/gate.json cannot be read"),
    ("error: KeyError", "see the daemon log"),
])
def test_status_hints_say_what_to_do(reason: str, words: str) -> None:
    """Each refusal a person can act on has a hint; the online error shows while entitled too."""
    lines = status_lines({"data_dir": "/srv/syncd", "entitlement": {
        "entitled": False, "reason": reason, "last_online_error": "HTTP 503 from the plane"}})
    text = "\n".join(lines)
    assert f"paused ({reason})" in text and words in text, text
    assert "last online check: HTTP 503 from the plane" in text
    entitled = "\n".join(status_lines({"entitlement": {
        "entitled": True, "exp": T, "last_online_error": "timed out"}}))
    assert "last online check: timed out" in entitled


# ---------------------------------------------------------------------- the hub's plans


async def test_a_tokens_file_with_an_unknown_plan_is_a_clear_error(tmp_path: Path,
                                                                   hub: SigningHub) -> None:
    """hub-tokens.json edited by hand to a plan the hub does not know: the entitlement route
    answers 500 token_file naming the plan (it was an unexplained internal error)."""
    path = hub.data_dir / TOKENS_FILENAME
    book = json.loads(await asyncio.to_thread(path.read_bytes))
    book["tokens"][0]["plan"] = "enterprise"
    await asyncio.to_thread(path.write_text, json.dumps(book))
    async with aiohttp.ClientSession() as session, session.get(
            hub.url + "/v1/agent/entitlement", params={"device_id": DEVICE},
            headers={"Authorization": f"Bearer {hub.token}"}) as resp:
        body = await resp.json()
    assert resp.status == 500, body
    assert body["error"]["code"] == "token_file"
    assert "tokens[0].plan: 'enterprise' is not one of free, sync, pro" in body["error"]["message"]

"""The gate (``syncd.entitlement.gate``) with real keys, real files, an injected wall clock, a
real hub that signs entitlements and the real fault-injecting proxy: RELIABILITY E1–E7."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from local_store import HashingEmbedder, Store
from syncd.config import EntitlementConfig
from syncd.entitlement.gate import STATE_FILENAME, Gate
from syncd.entitlement.keeper import Keeper, attach_gate
from syncd.entitlement.token import key_id, public_key_text, sign
from syncd.sync.engine import SyncEngine, SyncOptions
from syncd.sync.plane import PlaneClient
from syncd.sync.runner import SyncRunner
from tests.entitlement.support import (
    DAY,
    DEVICE,
    Clock,
    SigningHub,
    claims,
    flip_in_part,
    license_path,
    make_gate,
    now,
    parts,
    pinned,
    sign_raw,
    start_signing_hub,
    token_path,
)
from tests.syncd.faultproxy import FaultProxy
from tests.syncd.processes import ROOT, env_for

HUB_KEY = Ed25519PrivateKey.generate()
OTHER_KEY = Ed25519PrivateKey.generate()
T = 1_780_000_000
ENTITLEMENT = "/v1/agent/entitlement"
IMPORT = "/v1/agent/memory/import"
MODEL = HashingEmbedder().model_id


def write(path: Path, data: str | bytes) -> None:
    path.write_bytes(data.encode() if isinstance(data, str) else data)


def state(data: Path) -> dict[str, object]:
    loaded = json.loads((data / STATE_FILENAME).read_bytes())
    assert isinstance(loaded, dict)
    return loaded


@pytest.fixture
async def proxied(hub: SigningHub) -> AsyncIterator[FaultProxy]:
    proxy = FaultProxy(hub.url)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()


# ---------------------------------------------------------------------- E1


def test_a_valid_token_turns_the_gated_features_on(tmp_path: Path) -> None:
    """E1: a valid token signed by the pinned key → entitled; sync and graph allowed."""
    gate = make_gate(tmp_path, pinned(HUB_KEY), Clock(T))
    write(token_path(tmp_path), sign(HUB_KEY, claims(T)) + "\n")
    decision = gate.evaluate()
    assert decision.entitled and decision.reason is None and decision.source == "online"
    assert gate.allows("sync") is None and gate.allows("graph") is None
    assert gate.status()["sync"] == "on" and gate.status()["graph"] == "on"


@pytest.mark.parametrize("part", ["payload", "signature"])
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_one_flipped_bit_in_the_token_file_pauses(tmp_path: Path, part: str,
                                                  where: str) -> None:
    """E1: one bit flipped in the stored token's payload or signature → invalid_signature,
    sync and graph paused (after having been on)."""
    gate = make_gate(tmp_path, pinned(HUB_KEY), Clock(T))
    token = sign(HUB_KEY, claims(T))
    write(token_path(tmp_path), token)
    assert gate.evaluate().entitled
    size = len(parts(token)[1 if part == "payload" else 2]) * 8
    bit = {"first": 0, "middle": size // 2 + 3, "last": size - 1}[where]
    write(token_path(tmp_path), flip_in_part(token, part, bit) + "\n")
    decision = gate.evaluate()
    assert not decision.entitled and decision.reason == "invalid_signature"
    assert gate.allows("sync") == "invalid_signature" == gate.allows("graph")


async def test_ungated_features_keep_working_while_graph_is_paused(tmp_path: Path) -> None:
    """E1: with a tampered token, save/get/recall (keyword, semantic, hybrid) still answer,
    and recall says the graph is gated and why."""
    data = tmp_path / "data"
    store = await Store.open(data, embedder=HashingEmbedder())
    try:
        clock = Clock(time.time())
        gate = Gate(data, pinned(HUB_KEY), store.replica_id, wall=clock)
        store.graph_gate = lambda: gate.allows("graph")
        token = sign(HUB_KEY, claims(clock.now, device=store.replica_id))
        await asyncio.to_thread(write, token_path(data), token)
        assert (await asyncio.to_thread(gate.evaluate)).entitled
        first = await store.memories.save({"content": "rotate the staging keys every month"})
        second = await store.memories.save({"content": "the staging vault holds the deploy keys"})
        entitled = await store.recall.query({"query": "staging keys"})
        assert entitled.gated is None and entitled.gate_reason is None

        tampered = flip_in_part(token, "signature", 77)
        await asyncio.to_thread(write, token_path(data), tampered)
        assert (await asyncio.to_thread(gate.evaluate)).reason == "invalid_signature"

        third = await store.memories.save({"content": "staging keys rotate on the first Monday"})
        assert (await store.memories.get(third["node_id"]))["content"].startswith("staging keys")
        assert (await store.memories.get(first["node_id"]))["id"] == first["node_id"]
        saved = {first["node_id"], second["node_id"], third["node_id"]}
        for mode in ("keyword", "vector", "syncd"):
            response = await store.recall.query({"query": "staging keys"}, mode=mode)
            found = {m.id for m in response.memories}
            assert found and found <= saved, mode
            assert response.gated == ["graph"] and response.gate_reason == "invalid_signature"
    finally:
        await store.close()


# ---------------------------------------------------------------------- E2


def test_an_unpinned_key_is_refused_whatever_its_kid(tmp_path: Path) -> None:
    """E2: another hub's token → unknown_key; the same key forging the pinned kid →
    invalid_signature; nothing pinned → nothing entitles."""
    clock = Clock(T)
    gate = make_gate(tmp_path, pinned(HUB_KEY), clock)
    write(token_path(tmp_path), sign(OTHER_KEY, claims(T)))
    assert gate.evaluate().reason == "unknown_key" and gate.allows("sync") == "unknown_key"
    forged = sign_raw(OTHER_KEY, parts(sign(HUB_KEY, claims(T)))[1],
                      kid=key_id(HUB_KEY.public_key()))
    write(token_path(tmp_path), forged)
    assert gate.evaluate().reason == "invalid_signature"
    write(token_path(tmp_path), sign(HUB_KEY, claims(T)))
    assert make_gate(tmp_path, {}, clock).evaluate().reason == "unknown_key"


async def test_keys_are_never_fetched(tmp_path: Path, hub: SigningHub,
                                      proxied: FaultProxy) -> None:
    """E2: evaluating never touches the network (zero requests at the plane); an online check
    asks only for an entitlement, and one signed by an unpinned hub is not stored."""
    data = tmp_path / "laptop"
    other = await start_signing_hub(tmp_path / "other-hub")
    other_proxy = FaultProxy(other.url)
    await other_proxy.start()
    clock = Clock(time.time())
    gate = make_gate(data, pinned(hub.key), clock)
    keeper = Keeper(gate, PlaneClient(proxied.url, hub.token, timeout=5),
                    EntitlementConfig(refresh_secs=3600))
    stranger = Keeper(gate, PlaneClient(other_proxy.url, other.token, timeout=5),
                      EntitlementConfig(refresh_secs=3600))
    try:
        foreign, _ = await other.issue(DEVICE)
        await asyncio.to_thread(write, token_path(data), foreign)
        assert (await keeper.check(online=False)).reason == "unknown_key"
        forged = sign_raw(other.key, parts(foreign)[1], kid=key_id(hub.key.public_key()))
        await asyncio.to_thread(write, token_path(data), forged)
        assert (await keeper.check(online=False)).reason == "invalid_signature"
        assert proxied.count() == 0 and other_proxy.count() == 0

        await asyncio.to_thread(token_path(data).unlink)
        decision = await stranger.check(online=True)  # refused, and shown as such
        assert (decision.entitled, decision.reason, decision.source) == (
            False, "unknown_key", "online")
        assert not await asyncio.to_thread(token_path(data).exists)
        assert other_proxy.count() == other_proxy.count("GET", ENTITLEMENT) == 1

        decision = await keeper.check(online=True)
        assert decision.entitled and decision.source == "online"
        assert proxied.count() == proxied.count("GET", ENTITLEMENT) == 1
    finally:
        for k in (keeper, stranger):
            assert k.client is not None
            await k.client.close()
        await other_proxy.close()
        await other.close()


# ---------------------------------------------------------------------- E3


async def test_offline_grace_ends_exactly_at_exp(tmp_path: Path, hub: SigningHub,
                                                 proxied: FaultProxy) -> None:
    """E3: a token fetched online keeps sync and graph on while the plane is unreachable, up
    to exp - 1; at exp, allows() says expired at once and evaluate agrees."""
    clock = Clock(time.time())
    gate = make_gate(tmp_path / "laptop", pinned(hub.key), clock)
    keeper = Keeper(gate, PlaneClient(proxied.url, hub.token, timeout=5),
                    EntitlementConfig(refresh_secs=3600))
    try:
        decision = await keeper.check(online=True)
        assert decision.entitled and decision.exp is not None
        exp = decision.exp
        proxied.offline = True
        clock.now = exp - 1
        decision = await keeper.check(online=True)
        assert keeper.last_online_error is not None
        assert proxied.requests[-1].fault == "offline"
        assert decision.entitled and decision.exp == exp
        assert gate.allows("sync") is None and gate.allows("graph") is None
        clock.now = exp - 0.001
        assert gate.allows("sync") is None
        clock.now = exp
        assert gate.allows("sync") == "expired" == gate.allows("graph")  # no re-evaluation
        assert gate.status()["sync"] == "expired"
        decision = await keeper.check(online=True)
        assert not decision.entitled and decision.reason == "expired"
        assert gate.allows("sync") == "expired"
    finally:
        assert keeper.client is not None
        await keeper.client.close()


def test_the_validity_window_is_nbf_inclusive_exp_exclusive(tmp_path: Path) -> None:
    """E3: entitled exactly on nbf ≤ now < exp (not_yet_valid before, expired from exp on)."""
    clock = Clock(T - 1)
    gate = make_gate(tmp_path, pinned(HUB_KEY), clock)
    write(token_path(tmp_path), sign(HUB_KEY, claims(T, nbf=T, exp=T + 10)))
    assert gate.evaluate().reason == "not_yet_valid"
    clock.now = T
    assert gate.evaluate().entitled
    clock.now = T + 9
    assert gate.evaluate().entitled
    clock.now = T + 10
    assert gate.allows("sync") == "expired" and gate.evaluate().reason == "expired"


# ---------------------------------------------------------------------- E4


def test_the_clock_going_back_past_the_high_water_mark_pauses(tmp_path: Path) -> None:
    """E4: a step back within the NTP tolerance is fine; one second more → clock_untrusted,
    which sticks (also for a new Gate) even when the clock moves forward again."""
    clock = Clock(T)
    keys = pinned(HUB_KEY)
    write(license_path(tmp_path), sign(HUB_KEY, claims(T, nbf=T - 30 * DAY, exp=T + 30 * DAY)))
    gate = make_gate(tmp_path, keys, clock)
    assert gate.evaluate().entitled
    assert state(tmp_path)["clock_hwm"] == T
    clock.now = T - 120
    assert gate.evaluate().entitled
    clock.now = T - 121
    assert gate.evaluate().reason == "clock_untrusted"
    assert gate.allows("sync") == "clock_untrusted" == gate.allows("graph")
    clock.now = T + 3600
    assert gate.evaluate().reason == "clock_untrusted"
    assert make_gate(tmp_path, keys, clock).evaluate().reason == "clock_untrusted"


async def test_clock_rollback_across_a_kill_9_restart(tmp_path: Path, hub: SigningHub) -> None:
    """E4: a process evaluates at T and is SIGKILLed; a new gate at T - 1 day → clock_untrusted,
    still so a little later and after a restart, not cleared by an online check whose time
    disagrees, and cleared by a fresh hub token whose time agrees."""
    data = tmp_path / "laptop"
    await asyncio.to_thread(data.mkdir, mode=0o700)
    start = now()
    licence = sign(hub.key, claims(start, nbf=start - 30 * DAY, exp=start + 30 * DAY))
    await asyncio.to_thread(write, license_path(data), licence)
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.entitlement.gate_child", str(data), DEVICE, str(start),
        public_key_text(hub.key.public_key()), cwd=ROOT, env=env_for(tmp_path),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    async with asyncio.timeout(30):
        out, err = await child.communicate()
    assert child.returncode == -9, err.decode()
    assert json.loads(out)["entitled"] is True
    assert (await asyncio.to_thread(state, data))["clock_hwm"] == start

    clock = Clock(start - DAY)
    gate = make_gate(data, pinned(hub.key), clock)
    assert (await asyncio.to_thread(gate.evaluate)).reason == "clock_untrusted"
    clock.now = start - DAY + 3600
    assert (await asyncio.to_thread(gate.evaluate)).reason == "clock_untrusted"
    gate = make_gate(data, pinned(hub.key), clock)  # a restart
    assert (await asyncio.to_thread(gate.evaluate)).reason == "clock_untrusted"
    assert gate.allows("sync") == "clock_untrusted"

    client = PlaneClient(hub.url, hub.token, timeout=5)
    try:
        token, server_now = await client.entitlement(DEVICE)
        decision = await asyncio.to_thread(gate.accept_online, token, server_now)
        assert decision.reason == "clock_untrusted"  # the plane's time is a day ahead of ours
        clock.now = time.time()
        token, server_now = await client.entitlement(DEVICE)
        decision = await asyncio.to_thread(gate.accept_online, token, server_now)
    finally:
        await client.close()
    assert decision.entitled and gate.allows("sync") is None
    saved = await asyncio.to_thread(state, data)
    assert saved["clock_untrusted"] is False and saved["online_ok_at"] is not None


@pytest.mark.parametrize("offered", ["older token replayed", "token for another device",
                                     "token from an unpinned key"])
def test_a_refused_online_token_does_not_restore_clock_trust(tmp_path: Path,
                                                             offered: str) -> None:
    """E4: only a successful online check clears clock_untrusted — a token the gate refuses
    (replayed older seq, another device, unpinned key) must not, even when its iat agrees
    with the rolled-back clock (else an expired licence works again)."""
    clock = Clock(T - 10 * DAY)
    gate = make_gate(tmp_path, pinned(HUB_KEY), clock)
    old = sign(HUB_KEY, claims(T - 10 * DAY, seq=1))
    write(license_path(tmp_path),  # valid then, expired by T
          sign(HUB_KEY, claims(T, seq=1, nbf=T - 20 * DAY, exp=T - DAY)))
    assert gate.accept_online(old, None).entitled
    clock.now = T
    assert gate.accept_online(sign(HUB_KEY, claims(T, seq=2)), None).entitled
    clock.now = T - 10 * DAY  # rolled back to when the old token was issued
    assert gate.evaluate().reason == "clock_untrusted"
    token = {
        "older token replayed": old,
        "token for another device": sign(HUB_KEY, claims(clock.now, seq=3, device="another")),
        "token from an unpinned key": sign(OTHER_KEY, claims(clock.now, seq=3)),
    }[offered]
    decision = gate.accept_online(token, None)
    assert not decision.entitled and decision.reason == "clock_untrusted", decision
    assert gate.allows("sync") == "clock_untrusted"
    assert state(tmp_path)["clock_untrusted"] is True


@pytest.mark.parametrize(("offered", "reason"), [
    ("token for another device", "wrong_device"),
    ("token from an unpinned key", "unknown_key"),
    ("token not yet valid", "not_yet_valid"),
])
def test_a_refused_online_token_is_the_reason_shown_until_one_is_stored(
        tmp_path: Path, offered: str, reason: str) -> None:
    """Nothing entitles and the plane's token was refused: the status says why (an unpinned
    hub key, say), not "no_token"; a token that is stored ends it."""
    clock = Clock(T)
    gate = make_gate(tmp_path, pinned(HUB_KEY), clock)
    assert gate.evaluate().reason == "no_token"
    token = {
        "token for another device": sign(HUB_KEY, claims(T, device="another")),
        "token from an unpinned key": sign(OTHER_KEY, claims(T)),
        "token not yet valid": sign(HUB_KEY, claims(T, nbf=T + DAY)),
    }[offered]
    decision = gate.accept_online(token, None)
    assert (decision.entitled, decision.reason, decision.source) == (False, reason, "online")
    assert gate.evaluate().reason == reason and gate.allows("sync") == reason
    assert not token_path(tmp_path).exists()
    assert gate.accept_online(sign(HUB_KEY, claims(T, seq=2)), None).entitled
    token_path(tmp_path).unlink()
    assert gate.evaluate().reason == "no_token"


# ---------------------------------------------------------------------- E5


def test_a_token_for_another_device_is_refused(tmp_path: Path) -> None:
    """E5: a validly signed token naming another device_id → wrong_device."""
    gate = make_gate(tmp_path, pinned(HUB_KEY), Clock(T))
    write(token_path(tmp_path), sign(HUB_KEY, claims(T, device="someone-elses-laptop")))
    assert gate.evaluate().reason == "wrong_device"
    assert gate.allows("sync") == "wrong_device"
    with pytest.raises(Exception, match="wrong_device"):
        gate.install_license(sign(HUB_KEY, claims(T, device="someone-elses-laptop")).encode())
    assert not license_path(tmp_path).exists()


async def test_an_older_seq_than_accepted_is_refused(tmp_path: Path, hub: SigningHub) -> None:
    """E5: two entitlements from the hub route; after the newer was accepted, the older one put
    back in the file → seq_rollback (also after a restart); accept_online will not store it."""
    data = tmp_path / "laptop"
    older, older_claims = await hub.issue(DEVICE)
    newer, newer_claims = await hub.issue(DEVICE)
    assert older_claims["seq"] < newer_claims["seq"]
    clock = Clock(time.time())
    gate = make_gate(data, pinned(hub.key), clock)
    await asyncio.to_thread(write, token_path(data), newer)
    assert (await asyncio.to_thread(gate.evaluate)).entitled
    assert (await asyncio.to_thread(state, data))["seq_hwm"] == {"online": newer_claims["seq"]}
    await asyncio.to_thread(write, token_path(data), older)
    assert (await asyncio.to_thread(gate.evaluate)).reason == "seq_rollback"
    assert gate.allows("sync") == "seq_rollback"
    restarted = make_gate(data, pinned(hub.key), clock)
    assert (await asyncio.to_thread(restarted.evaluate)).reason == "seq_rollback"

    await asyncio.to_thread(write, token_path(data), newer)
    assert (await asyncio.to_thread(restarted.accept_online, older, None)).entitled
    assert (await asyncio.to_thread(token_path(data).read_text)).strip() == newer


def test_licence_and_online_tokens_keep_separate_seq_marks(tmp_path: Path) -> None:
    """E5: a licence with a lower seq than the online token still entitles once the online
    token expires; each source has its own high-water mark."""
    clock = Clock(T)
    gate = make_gate(tmp_path, pinned(HUB_KEY), clock)
    licence = sign(HUB_KEY, claims(T, seq=1, exp=T + 30 * DAY))
    gate.install_license(licence.encode())
    write(token_path(tmp_path), sign(HUB_KEY, claims(T, seq=5, exp=T + DAY)))
    assert gate.evaluate().entitled
    assert state(tmp_path)["seq_hwm"] == {"online": 5, "license": 1}
    clock.now = T + DAY + 1
    decision = gate.evaluate()
    assert decision.entitled and decision.source == "license", decision
    assert gate.allows("sync") is None
    write(license_path(tmp_path), sign(HUB_KEY, claims(T, seq=0, exp=T + 30 * DAY)))
    token_path(tmp_path).unlink()
    assert gate.evaluate().reason == "seq_rollback"  # the licence's own mark still holds


# ---------------------------------------------------------------------- E6


def _write_case(data: Path, case: str) -> None:
    good = sign(HUB_KEY, claims(T))
    path = token_path(data)
    if case == "missing":
        return
    if case == "directory":
        path.mkdir()
        return
    body: bytes = {
        "truncated": good[: len(good) // 2].encode(),
        "truncated by one byte": good[:-1].encode(),
        "garbled": good[:40].encode() + b"~!@#$%^&*()" + good[51:].encode(),
        "empty": b"",
        "binary": bytes(range(256)) * 4,
        "huge": b"A" * (10 * 1024 * 1024),
        "unreadable": good.encode(),
    }[case]
    path.write_bytes(body)
    if case == "unreadable":
        path.chmod(0o000)


E6_REASONS = {"missing": "no_token", "truncated": "malformed",
              "truncated by one byte": "malformed", "garbled": "malformed", "empty": "malformed",
              "binary": "malformed", "huge": "malformed",
              "directory": "unreadable", "unreadable": "error: PermissionError"}


@pytest.mark.parametrize("case", list(E6_REASONS))
def test_a_broken_token_file_is_not_entitled_with_a_reason(tmp_path: Path, case: str) -> None:
    """E6: missing/truncated/garbled/empty/binary/10 MiB/directory/unreadable token file →
    not entitled with a reason, evaluate never raises, and a good token later recovers."""
    if case == "unreadable" and os.geteuid() == 0:
        pytest.skip("root reads a mode-000 file: the unreadable case cannot happen as root")
    gate = make_gate(tmp_path, pinned(HUB_KEY), Clock(T))
    _write_case(tmp_path, case)
    decision = gate.evaluate()
    assert not decision.entitled and decision.reason == E6_REASONS[case]
    assert gate.allows("sync") == E6_REASONS[case]
    assert gate.evaluate().reason == E6_REASONS[case]  # again: still no exception
    path = token_path(tmp_path)
    if path.is_dir():
        path.rmdir()
    elif path.exists():
        path.chmod(0o600)
    write(path, sign(HUB_KEY, claims(T)))
    assert gate.evaluate().entitled


@pytest.mark.parametrize("body", [b"{not json", b"", b"[]", b'{"seq_hwm": []}',
                                  b'{"seq_hwm": {"online": "x"}}', b'{"clock_hwm": null}',
                                  b"\xff\xfe\x00binary"])
def test_a_corrupt_state_file_is_not_entitled_with_a_reason(tmp_path: Path,
                                                            body: bytes) -> None:
    """E6: a corrupt gate.json with a valid token → not entitled, reason "error: …", no raise;
    the broken state file is never mistaken for "no history" (fail closed)."""
    gate = make_gate(tmp_path, pinned(HUB_KEY), Clock(T))
    write(token_path(tmp_path), sign(HUB_KEY, claims(T)))
    write(tmp_path / STATE_FILENAME, body)
    decision = gate.evaluate()
    assert not decision.entitled and decision.reason is not None
    assert decision.reason.startswith("error: ")
    assert gate.allows("graph") == decision.reason


def test_a_garbled_token_file_does_not_hide_a_valid_licence(tmp_path: Path) -> None:
    """E6: either source entitles: a broken online token next to a valid licence → entitled."""
    gate = make_gate(tmp_path, pinned(HUB_KEY), Clock(T))
    write(token_path(tmp_path), b"\x00garbage\xff")
    write(license_path(tmp_path), sign(HUB_KEY, claims(T, exp=T + 30 * DAY)))
    decision = gate.evaluate()
    assert decision.entitled and decision.source == "license"


def test_an_unreadable_token_file_does_not_hide_a_valid_licence(tmp_path: Path) -> None:
    """E6: an online token that cannot be opened (here a symlink loop, ELOOP; for a user
    without the right, EACCES) counts as that source's refusal, not as a failed evaluation."""
    gate = make_gate(tmp_path, pinned(HUB_KEY), Clock(T))
    write(license_path(tmp_path), sign(HUB_KEY, claims(T, exp=T + 30 * DAY)))
    os.symlink(token_path(tmp_path).name, token_path(tmp_path))  # points at itself
    decision = gate.evaluate()
    assert decision.entitled and decision.source == "license"
    license_path(tmp_path).unlink()
    decision = gate.evaluate()
    assert not decision.entitled and decision.reason == "unreadable"


# ---------------------------------------------------------------------- E7


async def test_gated_writes_queue_locally_then_drain_exactly_once(
        tmp_path: Path, hub: SigningHub, proxied: FaultProxy) -> None:
    """E7: without entitlement 100 writes land and survive a restart, zero requests reach the
    plane; after an online entitlement the outbox drains and the hub holds exactly those 100,
    and further passes add nothing."""
    data = tmp_path / "laptop"
    keys = pinned(hub.key)

    async def open_laptop() -> tuple[Store, SyncRunner, Keeper]:
        store = await Store.open(data, embedder=HashingEmbedder())
        engine = SyncEngine(store, PlaneClient(proxied.url, hub.token, timeout=5),
                            SyncOptions(plane_model=MODEL))
        await engine.start()
        runner = SyncRunner(engine, interval=3600, jitter=0)
        keeper = attach_gate(store, runner, data, keys, EntitlementConfig())
        await keeper.check(online=False)
        return store, runner, keeper

    store, runner, keeper = await open_laptop()
    try:
        assert keeper.gate.decision.reason == "no_token"
        ids = []
        for i in range(100):
            saved = await store.memories.save({"content": f"gated write number {i}: keep it local"})
            ids.append(saved["node_id"])
        report = await runner.engine.run_pass("test")
        assert report.error_kind == "gated" and not report.ok
        assert runner.engine.status.gated == "no_token"
    finally:
        await runner.stop()
        await store.close()
    assert proxied.count() == 0

    store, runner, keeper = await open_laptop()
    try:
        stats = await store.maintenance.stats()
        assert stats["memories"] == 100 and stats["outbox"] == 100
        for _ in range(3):
            assert (await runner.engine.run_pass("test")).error_kind == "gated"
        assert proxied.count() == 0 and await hub.count("SELECT count(*) FROM memories") == 0

        decision = await keeper.check(online=True)
        assert decision.entitled and decision.source == "online"
        assert proxied.count() == proxied.count("GET", ENTITLEMENT) == 1
        report = await runner.engine.run_pass("test")
        assert report.ok and report.pushed_nodes == 100, report
        assert (await store.maintenance.stats())["outbox"] == 0
        rows = await hub.store._fetch("SELECT id FROM memories WHERE deleted = 0")
        assert sorted(r[0] for r in rows) == sorted(ids)
        feed = await hub.count("SELECT count(*) FROM feed")
        top = await hub.count("SELECT max(local_seq) FROM memories")
        imports = proxied.count("POST", IMPORT)
        for _ in range(3):
            await keeper.check(online=True)  # refreshing the entitlement writes no rows
            again = await runner.engine.run_pass("test")
            assert again.ok and again.pushed_nodes == 0
        assert await hub.count("SELECT count(*) FROM memories") == 100
        assert await hub.count("SELECT count(*) FROM feed") == feed
        assert await hub.count("SELECT max(local_seq) FROM memories") == top
        assert proxied.count("POST", IMPORT) == imports
    finally:
        await runner.stop()
        await store.close()


def test_each_source_grants_its_own_features_until_its_own_expiry(tmp_path: Path) -> None:
    """A pro licence still grants graph beside a longer-lived sync-only online token."""
    clock = Clock(T)
    gate = make_gate(tmp_path, pinned(HUB_KEY), clock)
    gate.install_license(sign(HUB_KEY, claims(T, seq=1, exp=T + 3 * DAY)).encode())
    write(token_path(tmp_path), sign(HUB_KEY, claims(T, seq=2, plan="sync", features=("sync",),
                                                     exp=T + 7 * DAY)))
    assert gate.evaluate().entitled
    assert gate.allows("sync") is None and gate.allows("graph") is None
    clock.now = T + 3 * DAY  # the licence ends: graph with it, sync goes on
    assert gate.allows("graph") == "expired" and gate.allows("sync") is None
    gate.evaluate()
    assert gate.allows("graph") == "feature_not_in_plan" and gate.allows("sync") is None


def test_a_fifo_or_device_as_token_file_cannot_hang_or_grant(tmp_path: Path) -> None:
    """E6: a FIFO in place of the token file (no writer) → refused at once, not a hang."""
    gate = make_gate(tmp_path, pinned(HUB_KEY), Clock(T))
    os.mkfifo(token_path(tmp_path))
    decision = gate.evaluate()
    assert not decision.entitled and decision.reason == "unreadable"
    token_path(tmp_path).unlink()
    token_path(tmp_path).symlink_to("/dev/zero")
    decision = gate.evaluate()
    assert not decision.entitled and decision.reason == "unreadable"

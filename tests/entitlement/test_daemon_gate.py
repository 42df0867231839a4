"""The gate in the product as processes: ``syncd run``, ``syncd status``, ``syncd save/recall/
export`` and ``syncd license install`` (RELIABILITY E1, E6 and ARCHITECTURE §6: the state and
reason are visible in status, sync status and recall)."""

from __future__ import annotations

import asyncio
import json
import signal
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from syncd.daemon import entitlement_summary
from syncd.entitlement.gate import Decision
from syncd.entitlement.token import public_key_text
from tests.entitlement.support import (
    SigningHub,
    flip_in_part,
    license_path,
    token_path,
)
from tests.syncd.processes import cli, finish, spawn, wait_ready


class Local:
    """A running ``syncd run`` process and an HTTP client with its API token."""

    def __init__(self, proc: asyncio.subprocess.Process, url: str, data: Path,
                 session: aiohttp.ClientSession) -> None:
        self.proc, self.url, self.data, self.session = proc, url, data, session

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        token = (await asyncio.to_thread((self.data / "api-token").read_text)).strip()
        async with self.session.request(method, self.url + path, json=body, headers={
                "Authorization": f"Bearer {token}"}) as resp:
            return resp.status, await resp.json(content_type=None)


async def write(path: Path, data: str | bytes) -> None:
    await asyncio.to_thread(path.parent.mkdir, parents=True, exist_ok=True, mode=0o700)
    await asyncio.to_thread(path.write_bytes, data.encode() if isinstance(data, str) else data)


async def exists(path: Path) -> bool:
    return await asyncio.to_thread(path.exists)


async def run_daemon(home: Path, *args: str) -> tuple[asyncio.subprocess.Process, str]:
    proc = await spawn(home, *args, "run", "--listen", "127.0.0.1:0")
    return proc, await wait_ready(proc)


async def stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
    code, err = await finish(proc)
    assert code == 0, err


async def test_a_garbage_token_file_never_stops_the_daemon(tmp_path: Path) -> None:
    """E6: `syncd run` with a garbage entitlement.token keeps serving: status 200 says not
    entitled and why; save and recall work (ungated)."""
    data = tmp_path / "data"
    await write(token_path(data), b"\x00\xffthis is not a token\n" * 50)
    proc, url = await run_daemon(tmp_path, "--data-dir", str(data))
    try:
        async with aiohttp.ClientSession() as session:
            local = Local(proc, url, data, session)
            status, body = await local.call("GET", "/v1/agent/status")
            assert status == 200
            gate = body["entitlement"]
            assert gate["entitled"] is False and gate["reason"] == "malformed", gate
            assert gate["sync"] == "malformed" and gate["graph"] == "malformed"
            status, saved = await local.call("POST", "/v1/agent/memory/tools/save_memory",
                                             {"content": "the daemon stays up on bad tokens"})
            assert status == 200, saved
            status, found = await local.call("POST", "/v1/agent/memory/query",
                                             {"query": "bad tokens"})
            assert status == 200
            assert [m["id"] for m in found["memories"]] == [saved["node_id"]]
            assert found["gated"] == ["graph"] and found["gate_reason"] == "malformed"
            status, body = await local.call("POST", "/v1/agent/entitlement/check", {})
            assert status == 200 and body["reason"] == "malformed"
        assert proc.returncode is None
    finally:
        await stop(proc)


async def test_licence_install_turns_a_running_daemon_on(tmp_path: Path,
                                                         hub: SigningHub) -> None:
    """Acceptance (E1, E6, §6): a fresh daemon with no plane and no licence says why paid
    features are paused and serves save/recall/export; a tampered licence is refused (exit 1,
    invalid_signature, nothing installed); a hub-issued licence installs (exit 0) and the
    running daemon is entitled right after."""
    data = tmp_path / "data"
    config = tmp_path / "syncd.toml"
    await write(config, f'[entitlement]\npublic_keys = ["{public_key_text(hub.key.public_key())}"]\n')
    base = ("--config", str(config), "--data-dir", str(data))
    proc, url = await run_daemon(tmp_path, *base)
    try:
        code, out, err = await cli(tmp_path, *base, "status")
        assert code == 0, err
        assert "paid features paused (no_token)" in out, out
        assert "or `syncd license install FILE`" in out, out  # what to do about it
        code, out, err = await cli(tmp_path, *base, "save", "the staging keys rotate monthly")
        assert code == 0 and out.startswith("saved "), err
        code, out, err = await cli(tmp_path, *base, "recall", "staging keys")
        assert code == 0 and "the staging keys rotate monthly" in out, err
        code, out, err = await cli(tmp_path, *base, "export")
        assert code == 0, err
        assert [n["content"] for n in json.loads(out)["memory_nodes"]] == [
            "the staging keys rotate monthly"]

        async with aiohttp.ClientSession() as session:
            local = Local(proc, url, data, session)
            status, sync = await local.call("GET", "/v1/agent/sync/status")
            assert status == 200 and sync["configured"] is False
            assert sync["entitlement"]["reason"] == "no_token"
            status, body = await local.call("GET", "/v1/agent/status")
            device = body["entitlement"]["device_id"]
            assert device == body["replica_id"]

            licence, claims = await hub.issue(device)
            assert claims["device_id"] == device
            tampered = tmp_path / "tampered.license"
            await write(tampered, flip_in_part(licence, "payload", 42) + "\n")
            code, out, err = await cli(tmp_path, *base, "license", "install", str(tampered))
            assert code == 1 and "invalid_signature" in err, (code, out, err)
            assert not await exists(license_path(data))
            status, body = await local.call("GET", "/v1/agent/status")
            assert body["entitlement"]["entitled"] is False
            assert body["entitlement"]["reason"] == "no_token"

            good = tmp_path / "good.license"
            await write(good, licence + "\n")
            code, out, err = await cli(tmp_path, *base, "license", "install", str(good))
            assert code == 0, (out, err)
            assert "licence installed" in out and device in out
            code, out, err = await cli(tmp_path, *base, "license", "install", str(good),
                                       "--json")
            assert code == 0, (out, err)
            assert json.loads(out) == {"plan": claims["plan"], "features": claims["features"],
                                       "exp": claims["exp"], "device": device}
            status, body = await local.call("GET", "/v1/agent/status")
            gate = body["entitlement"]
            assert gate["entitled"] is True and gate["source"] == "license", gate
            assert gate["sync"] == "on" and gate["graph"] == "on"
            status, found = await local.call("POST", "/v1/agent/memory/query",
                                             {"query": "staging keys"})
            assert status == 200 and "gated" not in found
        code, out, err = await cli(tmp_path, *base, "status")
        assert code == 0 and "plan pro (license)" in out, out
        expiry = datetime.fromtimestamp(claims["exp"], tz=UTC).strftime("%Y-%m-%d %H:%M UTC")
        assert f"expires {expiry}" in out, out
    finally:
        await stop(proc)


def test_the_start_up_line_shows_the_expiry_as_a_date() -> None:
    assert entitlement_summary(Decision(True, None, exp=1796758907)) == \
        "sync and graph on until 2026-12-08 19:41:47 UTC"
    assert entitlement_summary(Decision(False, "no entitlement")) == \
        "paid features paused (no entitlement)"

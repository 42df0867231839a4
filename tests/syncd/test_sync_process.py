"""The whole product as processes: `syncd hub token create`, `syncd hub`, two `syncd run`
daemons configured with a control plane, and `syncd save/sync/recall/status` between them."""

from __future__ import annotations

import asyncio
import json
import signal
import urllib.request
from pathlib import Path

import pytest

from syncd.report import pass_summary, status_lines
from syncd.sync.engine import PassReport
from tests.syncd.processes import cli, finish, spawn, stop_all, wait_ready


async def write(path: Path, text: str) -> None:
    await asyncio.to_thread(path.parent.mkdir, parents=True, exist_ok=True)
    await asyncio.to_thread(path.write_text, text)


@pytest.mark.parametrize("cursor", ["ingest", "origin"])
async def test_two_daemons_sync_through_a_hub_process(tmp_path: Path, cursor: str) -> None:
    """A save on laptop A is recallable on laptop B after `syncd sync` on both."""
    hub_dir = tmp_path / "hub"
    code, token, err = await cli(tmp_path, "hub", "token", "create", "--data-dir", str(hub_dir),
                                 "--role", "write", "--name", "laptops")
    assert code == 0, err
    assert token.strip().startswith("syncd_") and "once" in err
    code, _, err = await cli(tmp_path, "hub", "token", "create", "--data-dir", str(hub_dir),
                             "--role", "superuser", "--name", "x")
    assert code == 2 and "role" in err
    code, public_key, err = await cli(tmp_path, "hub", "key", "--data-dir", str(hub_dir))
    assert code == 0 and len(public_key.strip()) == 43 and "public_keys" in err, err
    mode = (await asyncio.to_thread((hub_dir / "entitlement-key.pem").stat)).st_mode
    assert mode & 0o777 == 0o600
    hub = await spawn(tmp_path, "hub", "--data-dir", str(hub_dir), "--listen", "127.0.0.1:0",
                      "--cursor", cursor)
    procs = [hub]
    try:
        hub_url = await wait_ready(hub)
        await write(tmp_path / "plane-token", token)
        laptops = {}
        for name in ("a", "b"):
            config = tmp_path / f"{name}.toml"
            # B pulls on the manual pass only (no long-poll), so its report's counts are exact
            poll = "long_poll = false\n" if name == "b" else ""
            await write(config, f'[control_plane]\nurl = "{hub_url}"\n'
                        f'token_file = "{tmp_path / "plane-token"}"\n'
                        'embedding_model = "hashing-384"\n[sync]\ninterval_secs = 3600\n'
                        f'{poll}[entitlement]\npublic_keys = ["{public_key.strip()}"]\n')
            data = tmp_path / name
            proc = await spawn(tmp_path, "--config", str(config), "--data-dir", str(data),
                               "run", "--listen", "127.0.0.1:0")
            procs.append(proc)
            await wait_ready(proc)
            laptops[name] = (config, data)

        def args(name: str, *rest: str) -> list[str]:
            config, data = laptops[name]
            return ["--config", str(config), "--data-dir", str(data), *rest]

        code, out, err = await cli(tmp_path, *args("a", "save", "rotate the staging keys monthly",
                                                   "--type", "procedure"))
        assert code == 0, err
        # A save is pushed at once, with no pass asked for (the runner's "local" wake).
        deadline = asyncio.get_running_loop().time() + 60
        while True:
            code, out, err = await cli(tmp_path, *args("a", "status", "--json"))
            assert code == 0, err + out
            if json.loads(out)["sync"]["outbox"] == 0:
                break
            assert asyncio.get_running_loop().time() < deadline, out
            await asyncio.sleep(0.1)
        code, out, err = await cli(tmp_path, *args("a", "sync", "--json"))
        assert code == 0, err + out
        assert json.loads(out)["pushed_nodes"] == 0  # nothing left to push
        code, out, err = await cli(tmp_path, *args("b", "sync"))
        assert code == 0, err + out
        assert out.startswith("sync ok in ") and ": pulled 1 memory and 0 edges in 1 page, " \
            "pushed 0 memories and 0 edges in 0 requests" in out, out
        code, out, err = await cli(tmp_path, *args("b", "recall", "staging keys"))
        assert code == 0 and "rotate the staging keys monthly" in out, err + out
        code, out, err = await cli(tmp_path, *args("b", "status", "--json"))
        status = json.loads(out)["sync"]
        assert status["configured"] and status["url"] == hub_url
        assert status["last_success"] and status["outbox"] == 0 and status["cursor"]
        entitlement = json.loads(out)["entitlement"]
        assert entitlement["entitled"] and entitlement["sync"] == "on", entitlement
        assert entitlement["plan"] == "pro" and entitlement["source"] == "online"
        code, out, _ = await cli(tmp_path, *args("b", "status"))
        assert "last_success" in out and hub_url in out
    finally:
        await stop_all(procs)


async def test_a_daemon_whose_plane_token_file_is_missing_refuses_to_start(
        tmp_path: Path) -> None:
    """A broken sync setup is a configuration error (exit 2) naming the field."""
    config = tmp_path / "a.toml"
    await write(config, '[control_plane]\nurl = "http://127.0.0.1:9"\n'
                f'token_file = "{tmp_path / "nope"}"\n')
    code, _, err = await cli(tmp_path, "--config", str(config), "--data-dir",
                             str(tmp_path / "a"), "run", "--listen", "127.0.0.1:0")
    assert code == 2
    assert "control_plane.token_file" in err


async def test_sync_without_a_control_plane_says_so(tmp_path: Path) -> None:
    """`syncd sync` on a daemon without a control plane fails with a clear message."""
    proc = await spawn(tmp_path, "--data-dir", str(tmp_path / "a"), "run", "--listen",
                       "127.0.0.1:0")
    try:
        await wait_ready(proc)
        code, out, err = await cli(tmp_path, "--data-dir", str(tmp_path / "a"), "sync")
        assert code == 1 and "control_plane.url" in err, err + out
        code, out, _ = await cli(tmp_path, "--data-dir", str(tmp_path / "a"), "status")
        assert "sync             off" in out
        assert "paused (no_token)" in out
    finally:
        proc.send_signal(signal.SIGTERM)
        code, err = await finish(proc)
        assert code == 0, err


def test_a_failed_pass_reads_as_such_with_what_to_do() -> None:
    report = PassReport(trigger="manual", started_at="t", took_ms=3.4,
                        error="sync is paused: unknown_key", error_kind="gated").as_dict()
    assert pass_summary(report) == [
        "sync failed in 3 ms: pulled 0 memories and 0 edges in 0 pages, pushed 0 memories and 0 "
        "edges in 0 requests",
        "  error (gated): sync is paused: unknown_key",
        "  `syncd status` says why paid features are paused and what to do"]
    report = PassReport(trigger="manual", started_at="t", ok=True, pulled_nodes=2, pull_pages=1,
                        pushed_edges=1, push_requests=1, reset="store_id changed",
                        pull_problems=1).as_dict()
    assert pass_summary(report) == [
        "sync ok in 0 ms: pulled 2 memories and 0 edges in 1 page, pushed 0 memories and 1 edge "
        "in 1 request",
        "  the control plane looks reset (store_id changed): resynced from the start",
        "  1 pulled rows refused (see `syncd status`)"]
    report = PassReport(trigger="manual", started_at="t", error="HTTP 401: unknown token",
                        error_kind="auth").as_dict()
    assert pass_summary(report)[1:] == [
        "  error (auth): HTTP 401: unknown token",
        "  the control plane refused this install's token: fix control_plane.token_file and run "
        "`syncd sync` (it reads the file again); scheduled passes wait for that"]
    report = PassReport(trigger="manual", started_at="t", pushed_nodes=3, push_requests=1,
                        push_too_large=["node memory:big"], error_kind="held_back",
                        error="1 queued rows are too large for the plane even alone and stay "
                              "queued: node memory:big").as_dict()
    assert pass_summary(report) == [
        "sync incomplete in 0 ms: pulled 0 memories and 0 edges in 0 pages, pushed 3 memories "
        "and 0 edges in 1 request",
        "  rows held back: 1 queued rows are too large for the plane even alone and stay "
        "queued: node memory:big"]
    lines = status_lines({"sync": {"configured": True, "url": "http://plane", "interval_secs": 60,
                                   "too_large_rows": ["node memory:big"], "skipped_rows": []}})
    assert "    too_large_rows       node memory:big" in lines
    assert not any("skipped_rows" in line for line in lines)


async def scheduled_passes(url: str, data_dir: Path, at_least: int) -> int:
    """The daemon's count of sync passes, once it reaches ``at_least`` (polled over HTTP)."""
    token = (await asyncio.to_thread((data_dir / "api-token").read_text)).strip()
    request = urllib.request.Request(f"{url}/v1/agent/status",
                                     headers={"Authorization": f"Bearer {token}"})
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    async with asyncio.timeout(120):
        while True:
            answer = await asyncio.to_thread(direct.open, request)
            passes = int(json.loads(answer.read())["sync"]["passes"])
            if passes >= at_least:
                return passes
            await asyncio.sleep(0.2)  # a poll interval: the wait is on the count above


async def test_scheduled_passes_do_not_fill_the_log(tmp_path: Path) -> None:
    """A pass every second against a plane that is down: syncd says so once (rate-limited), and
    the schedule itself writes no line per pass, whichever logger it would use."""
    config = tmp_path / "a.toml"
    await write(tmp_path / "plane-token", "syncd_" + "x" * 43)
    await write(config, '[control_plane]\nurl = "http://127.0.0.1:9"\n'
                f'token_file = "{tmp_path / "plane-token"}"\n[sync]\ninterval_secs = 1\n'
                'jitter = 0\n')
    proc = await spawn(tmp_path, "--config", str(config), "--data-dir", str(tmp_path / "a"),
                       "run", "--listen", "127.0.0.1:0")
    try:
        url = await wait_ready(proc)
        passes = await scheduled_passes(url, tmp_path / "a", at_least=3)
    finally:
        proc.send_signal(signal.SIGTERM)
        code, err = await finish(proc)
    assert code == 0, err
    assert passes >= 3
    after_ready = err.splitlines()
    failed = [line for line in after_ready if "sync pass failed" in line]
    assert len(failed) <= 1, err  # one a minute at most (the first may precede "ready")
    others = [line for line in after_ready if " syncd" not in line]
    assert others == [], err  # no other library's per-run lines (APScheduler wrote two)
    assert "stopping (SIGTERM received): draining requests" in err  # the log after "ready"


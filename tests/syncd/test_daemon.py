"""``syncd run`` as a real process: lifecycle, exit codes, L1, L5, R22's lock, and S5
(SIGTERM under write load loses no acknowledged write)."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from local_store import Store
from syncd.daemon import ProgressLog
from tests.store_probe import integrity_check
from tests.syncd.processes import env_for, finish, wait_ready


async def start(data: Path, *args: str, **extra: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "syncd", "--data-dir", str(data), "run", *args,
        env=env_for(data.parent, **extra), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)


def token(data: Path) -> str:
    return (data / "api-token").read_text().strip()


async def test_lifecycle_token_file_and_clean_exit(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc = await start(data, "--listen", "127.0.0.1:0")
    url = await wait_ready(proc)
    assert stat.S_IMODE((data / "api-token").stat().st_mode) == 0o600
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    assert json.loads((data / "daemon.json").read_text())["url"] == url
    async with aiohttp.ClientSession() as s, s.get(url + "/healthz") as resp:
        assert resp.status == 200
    proc.send_signal(signal.SIGTERM)
    code, err = await finish(proc)
    assert code == 0, err
    assert not (data / "daemon.json").exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
@pytest.mark.parametrize("command", ["run", "hub"])
async def test_a_stop_signal_right_after_ready_is_a_clean_stop(
        tmp_path: Path, command: str, sig: signal.Signals) -> None:
    """The signal is sent as soon as "ready" is read (the handlers once came ~10 ms after it,
    and a SIGTERM in between killed the process); SIGHUP and SIGINT stop it as SIGTERM does."""
    data = tmp_path / "data"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "syncd", "--data-dir", str(data), command, "--listen",
        "127.0.0.1:0", env=env_for(tmp_path), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    await wait_ready(proc)
    proc.send_signal(sig)
    code, err = await finish(proc)
    assert code == 0, err
    assert "Traceback" not in err
    assert not (data / "daemon.json").exists()  # the daemon removes it on a clean stop
    assert f"stopping ({sig.name} received)" in err  # the log says what stopped it


async def test_the_log_says_a_stop_came_over_http(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc = await start(data, "--listen", "127.0.0.1:0")
    await wait_ready(proc)
    code, _, err = await cli(data, "stop")
    assert code == 0, err
    code, err = await finish(proc)
    assert code == 0, err
    assert "stopping (asked over HTTP: `syncd stop` or the page): draining requests" in err


async def test_second_daemon_on_the_same_data_dir_refuses(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = await start(data, "--listen", "127.0.0.1:0")
    await wait_ready(first)
    try:
        second = await start(data, "--listen", "127.0.0.1:0")
        code, err = await finish(second)
        assert code == 75 and "in use by another syncd process" in err
    finally:
        first.send_signal(signal.SIGTERM)
        assert (await finish(first))[0] == 0


@pytest.mark.parametrize("command", ["run", "hub"])
async def test_an_unusable_database_exits_2_with_one_line_and_keeps_the_file(
        tmp_path: Path, command: str) -> None:
    """Not restarted by the units (restarting cannot fix a file), no traceback, file kept."""
    data = tmp_path / "data"
    data.mkdir()
    garbage = b"not a database\n" * 300
    (data / "memory.db").write_bytes(garbage)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "syncd", "--data-dir", str(data), command, "--listen",
        "127.0.0.1:0", env=env_for(tmp_path), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    code, err = await finish(proc)
    assert code == 2, err
    prefix = "syncd hub" if command == "hub" else "syncd"
    assert err.strip().splitlines() == [
        f"{prefix}: {data / 'memory.db'} cannot be used: file is not a database. It was left "
        "as it is: move it aside and restore a backup (`syncd backup` makes them), or start "
        "with an empty data directory and let sync fill it again"]
    assert (data / "memory.db").read_bytes() == garbage


async def test_a_token_file_that_cannot_be_read_exits_2_with_one_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "api-token").mkdir(parents=True)  # a directory where the file should be
    code, err = await finish(await start(data, "--listen", "127.0.0.1:0"))
    assert code == 2, err
    assert err.strip().splitlines()[-1] == (
        f"syncd: cannot use the API token file {data / 'api-token'}: Is a directory")
    assert "Traceback" not in err


@pytest.mark.parametrize("listen", ["0.0.0.0:0", "[::]:0"])
async def test_non_loopback_bind_is_refused(tmp_path: Path, listen: str) -> None:
    proc = await start(tmp_path / "data", "--listen", listen)
    code, err = await finish(proc)
    assert code == 2 and "allow_non_loopback" in err


async def test_config_errors_exit_2_and_name_the_field(tmp_path: Path) -> None:
    proc = await start(tmp_path / "data", SYNCD_SYNC_INTERVAL_SECS="-5")
    code, err = await finish(proc)
    assert code == 2 and "sync.interval_secs" in err and "-5" in err


async def test_cli_says_when_the_daemon_is_not_running(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "syncd", "--data-dir", str(tmp_path / "none"), "status",
        env=env_for(tmp_path), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    code, err = await finish(proc)
    assert code == 75 and "syncd run" in err


async def test_sigterm_under_write_load_loses_no_acked_write(tmp_path: Path) -> None:
    """S5: writers keep saving while SIGTERM arrives; every 2xx answer must survive."""
    data = tmp_path / "data"
    proc = await start(data, "--listen", "127.0.0.1:0")
    url = await wait_ready(proc)
    headers = {"Authorization": f"Bearer {token(data)}"}
    acked: list[str] = []
    enough = asyncio.Event()
    stop_at = time.monotonic() + 30

    async def writer(n: int, session: aiohttp.ClientSession) -> None:
        i = 0
        while time.monotonic() < stop_at:
            i += 1
            try:
                async with session.post(url + "/v1/agent/memory/tools/save_memory",
                                        json={"content": f"writer {n} write {i}"},
                                        headers=headers) as resp:
                    if resp.status == 200:
                        acked.append((await resp.json())["node_id"])
                        if len(acked) >= 100:
                            enough.set()
            except (TimeoutError, aiohttp.ClientError):
                return  # the daemon closed the listener: stop writing

    async with aiohttp.ClientSession() as session:
        writers = [asyncio.create_task(writer(n, session)) for n in range(8)]
        async with asyncio.timeout(20):
            await enough.wait()
        proc.send_signal(signal.SIGTERM)
        code, err = await finish(proc, limit=20)
        await asyncio.gather(*writers)
    assert code == 0, err
    store = await Store.open(data)
    try:
        assert await integrity_check(store) == "ok"
        missing = [mid for mid in acked if not await _exists(store, mid)]
        assert missing == [] and len(acked) >= 100
    finally:
        await store.close()


async def _exists(store: Store, memory_id: str) -> bool:
    try:
        await store.memories.get(memory_id)
    except Exception:
        return False
    return True


async def cli(data: Path, *args: str, stdin: bytes | None = None,
              **env: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "syncd", "--data-dir", str(data), *args,
        env=env_for(data.parent, **env), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE)
    async with asyncio.timeout(60):
        out, err = await proc.communicate(stdin)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_cli_round_trip_against_a_running_daemon(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc = await start(data, "--listen", "127.0.0.1:0")
    await wait_ready(proc)
    try:
        code, out, err = await cli(data, "save", "deploy with make release", "--realm", "p",
                                   "--tag", "ci", "--type", "procedure", "--importance", "0.8")
        assert code == 0 and out.startswith("saved memory:"), err
        code, out, _ = await cli(data, "recall", "deploy release", "--realm", "p")
        assert code == 0 and out.startswith("Relevant memories:\n- [procedure] deploy")
        code, out, _ = await cli(data, "recall", "deploy", "--json", "--limit", "1")
        assert code == 0 and len(json.loads(out)["memories"]) == 1
        code, out, err = await cli(data, "recall", "zzqx wvbn", "--realm", "p")
        assert code == 0 and out.startswith("No memory matched the query. The most important "
                                            "recent memories:\n- [procedure] deploy")
        assert err == ("syncd: nothing matches 'zzqx wvbn'; the most important recent memories "
                       "instead (scores 0):\n")  # a fallback says so
        code, out, err = await cli(data, "recall", "deploy", "--realm", "elsewhere")
        assert (code, out, err) == (0, "", "syncd: no memories found\n")
        code, out, _ = await cli(data, "status", "--json")
        assert code == 0 and json.loads(out)["memories"] == 1
        export = tmp_path / "export.json"
        code, _, err = await cli(data, "export", "-o", str(export))
        assert code == 0 and "exported 1 memories" in err
        assert json.loads(export.read_text())["memory_nodes"][0]["realm"] == "p"
        assert stat.S_IMODE(export.stat().st_mode) == 0o600  # a new export file is private
        export.chmod(0o640)
        assert (await cli(data, "export", "-o", str(export)))[0] == 0
        assert stat.S_IMODE(export.stat().st_mode) == 0o640  # a replaced one keeps its mode
        code, out, _ = await cli(data, "import", str(export))
        assert code == 0 and "applied 0 memories" in out  # the same version: a no-op
        code, out, err = await cli(data, "save", "x", "--importance", "high")
        assert code == 2 and "importance" in err  # argparse rejects it before any request
        bad = tmp_path / "bad.json"
        bad.write_text("[1, 2]")
        code, _, err = await cli(data, "import", str(bad))
        assert code == 1 and "expected an object" in err
        bad.write_text('{"memory_nodes": 5}')
        code, out, err = await cli(data, "import", str(bad))
        assert (code, out, err) == (
            1, "", f"syncd: {bad}: memory_nodes must be a list of rows, got int\n")
        code, out, _ = await cli(data, "backup", str(tmp_path / "copy.db"))
        assert code == 0 and "integrity_check: ok" in out
        code, _, err = await cli(data, "backup", str(tmp_path / "copy.db"))
        assert code == 1 and "exists" in err
        # `-` reads the content from standard input (a command's output, a file)
        code, out, err = await cli(data, "save", "-", "--importance", "7",
                                   stdin=b"pytest -x stops at the first failure\n")
        assert code == 0 and out.startswith("saved memory:"), err
        assert err == "syncd: note: importance 7 is outside 0..1: stored as 1\n"
        code, out, _ = await cli(data, "recall", "pytest first failure", "--json")
        assert json.loads(out)["memories"][0]["content_preview"] == (
            "pytest -x stops at the first failure")
        code, _, err = await cli(data, "save", "-", stdin=b"  \n")
        assert code == 1 and "content" in err and "is empty" in err
        # `import -` reads standard input, through a private spool file it removes
        spool = tmp_path / "spool"
        spool.mkdir()
        piped = {"memory_nodes": [{"id": "memory:piped", "content": "from a pipe",
                                   "updated_at": "2026-03-04T05:06:07Z"}]}
        code, out, err = await cli(data, "import", "-", stdin=json.dumps(piped).encode(),
                                   TMPDIR=str(spool))
        assert code == 0 and out.startswith("applied 1 memories and 0 edges; 0 rows"), err
        code, _, err = await cli(data, "import", "-", stdin=b"[1, 2]", TMPDIR=str(spool))
        assert code == 1 and err.startswith("syncd: standard input: ") and "an object" in err
        assert list(spool.iterdir()) == []
        code, out, _ = await cli(data, "import", "-", stdin=json.dumps(piped).encode())
        assert code == 0 and "applied 0 memories" in out  # the same version again
        code, out, err = await cli(data, "import", "-",  # a byte-order mark is not data
                                   stdin=b"\xef\xbb\xbf" + json.dumps(piped).encode())
        assert code == 0 and "applied 0 memories" in out, err
        code, out, _ = await cli(data, "recall", "from a pipe", "--json")
        assert json.loads(out)["memories"][0]["id"] == "memory:piped"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert (await finish(proc))[0] == 0
    restored = tmp_path / "restored"
    restored.mkdir()
    (tmp_path / "copy.db").rename(restored / "memory.db")
    store = await Store.open(restored)
    try:
        assert (await store.maintenance.stats())["memories"] == 1
    finally:
        await store.close()


async def test_cli_import_numbers_refused_rows_as_in_the_file(tmp_path: Path) -> None:
    """The daemon numbers refused rows within a 500-row batch; the CLI reports file positions,
    counts unchanged rows apart, and shows its progress on stderr."""
    data = tmp_path / "data"
    proc = await start(data, "--listen", "127.0.0.1:0")
    await wait_ready(proc)
    try:
        code, out, err = await cli(data, "save", "already here", "--type", "Decisions")
        assert code == 0 and out.startswith("saved memory:")
        assert err == "syncd: note: unknown memory_type 'Decisions' stored as 'fact'\n"
        export = tmp_path / "export.json"
        assert (await cli(data, "export", "-o", str(export)))[0] == 0
        held = json.loads(export.read_text())["memory_nodes"][0]
        stamp = held["updated_at"]
        nodes = [held] + [{"id": f"memory:n{i}", "content": f"note {i}", "updated_at": stamp}
                          for i in range(1, 502)]
        nodes.insert(100, {"id": 5, "content": "an id that is a number"})  # not sent
        nodes.append({"id": "memory:bad", "content": "late", "updated_at": "garbage"})
        rows = tmp_path / "rows.json"
        rows.write_text(json.dumps({"memory_nodes": nodes, "memory_edges": []}))
        code, out, err = await cli(data, "import", str(rows))
        assert code == 1
        assert out.startswith("applied 501 memories and 0 edges; 1 rows unchanged"), out
        assert out.rstrip().endswith("2 rows refused"), out
        assert "memory_nodes[100]: Expected `str | null`, got `int` - at `$.id`" in err, err
        assert "memory_nodes[503] (memory:bad).updated_at: invalid RFC 3339" in err, err
        assert "processed 501 / 504 rows" in err and "processed 504 / 504 rows" in err, err
        code, out, _ = await cli(data, "status", "--json")
        assert code == 0 and json.loads(out)["memories"] == 502
    finally:
        proc.send_signal(signal.SIGTERM)
        assert (await finish(proc))[0] == 0


async def test_cli_file_errors_are_one_line_and_a_closed_pipe_is_no_traceback(
        tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc = await start(data, "--listen", "127.0.0.1:0")
    await wait_ready(proc)
    try:
        stamp = "2026-01-02T03:04:05.000000000+00:00"
        rows = tmp_path / "rows.json"
        rows.write_text(json.dumps({"memory_nodes": [
            {"id": f"memory:n{i}", "content": f"note {i} " + "x" * 1000, "updated_at": stamp}
            for i in range(300)], "memory_edges": []}))
        assert (await cli(data, "import", str(rows)))[0] == 0
        missing = tmp_path / "missing"
        code, out, err = await cli(data, "export", "-o", str(missing / "x.json"))
        assert (code, out) == (1, "") and err == (
            f"syncd: cannot write {missing / 'x.json'}: No such file or directory\n")
        code, out, err = await cli(data, "backup", str(missing / "x.db"))
        assert (code, out, err) == (1, "", f"syncd: {missing} does not exist\n")
        assert not missing.exists()

        def export_into_a_closed_pipe() -> tuple[int, bytes, bytes]:
            with subprocess.Popen([sys.executable, "-m", "syncd", "--data-dir", str(data),
                                   "export"], env=env_for(tmp_path), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE) as child:
                assert child.stdout is not None and child.stderr is not None
                head = child.stdout.read(100)
                child.stdout.close()  # like `syncd export | head -c 100`
                return child.wait(timeout=60), head, child.stderr.read()

        code, head, err = await asyncio.to_thread(export_into_a_closed_pipe)
        assert head.startswith(b'{"memory_nodes":[')  # the daemon's bytes, as they come
        assert (code, err) == (1, b"")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert (await finish(proc))[0] == 0


async def test_cli_restore_waits_for_a_stopped_daemon_then_brings_the_backup_back(
        tmp_path: Path) -> None:
    data, copy = tmp_path / "data", tmp_path / "copy.db"
    proc = await start(data, "--listen", "127.0.0.1:0")
    await wait_ready(proc)
    try:
        assert (await cli(data, "save", "in the backup"))[0] == 0
        assert (await cli(data, "backup", str(copy)))[0] == 0
        assert (await cli(data, "save", "after the backup"))[0] == 0
        code, out, err = await cli(data, "restore", str(copy))
        assert (code, out) == (75, "") and err.startswith(
            "syncd: stop the daemon before restoring: data directory"), err
    finally:
        proc.send_signal(signal.SIGTERM)
        assert (await finish(proc))[0] == 0
    code, out, err = await cli(data, "restore", str(tmp_path / "nope.db"))
    assert (code, out, err) == (1, "", f"syncd: {tmp_path / 'nope.db'} is not a file; nothing "
                                       "was changed\n")
    code, out, err = await cli(data, "restore", str(copy))
    assert (code, err) == (0, "")  # its own backup: no note about another install
    assert out.startswith(f"restored 1 memories from {copy} into {data}; the store it "
                          f"replaced is kept as {data / 'memory.db.replaced-'}"), out
    proc = await start(data, "--listen", "127.0.0.1:0")
    await wait_ready(proc)
    try:
        code, out, _ = await cli(data, "recall", "backup", "--json")
        assert [m["content_preview"] for m in json.loads(out)["memories"]] == ["in the backup"]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert (await finish(proc))[0] == 0


async def test_backup_of_an_unreadable_store_leaves_no_file(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "memory.db").write_bytes(b"not a database\n" * 300)
    dest = tmp_path / "copies" / "copy.db"
    dest.parent.mkdir()
    code, out, err = await cli(data, "backup", str(dest))
    assert (code, out) == (1, "")
    assert err == f"syncd: backup to {dest} failed: file is not a database\n"
    assert list(dest.parent.iterdir()) == []  # neither the copy nor its partial file


async def test_syncd_open_prints_a_one_time_login_url(tmp_path: Path) -> None:
    data = tmp_path / "data"
    code, _, err = await cli(data, "open", "--no-browser")
    assert code == 75 and "syncd run" in err  # no daemon yet
    proc = await start(data, "--listen", "127.0.0.1:0")
    url = await wait_ready(proc)
    try:
        code, out, err = await cli(data, "open", "--no-browser")
        assert code == 0, err
        login = out.strip()
        assert login.startswith(f"{url}/ui/login?code=") and "works once" in err
        async with aiohttp.ClientSession() as session:
            async with session.get(login, allow_redirects=False) as resp:
                assert resp.status == 303 and "HttpOnly" in resp.headers["Set-Cookie"]
            async with session.get(login, allow_redirects=False) as resp:
                assert resp.status == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        assert (await finish(proc))[0] == 0


async def test_optional_unix_socket(tmp_path: Path) -> None:
    data = tmp_path / "data"
    sock = tmp_path / "syncd.sock"
    proc = await start(data, "--listen", "127.0.0.1:0", SYNCD_DAEMON_UNIX_SOCKET=str(sock))
    await wait_ready(proc)
    try:
        connector = aiohttp.UnixConnector(path=str(sock))
        async with aiohttp.ClientSession(connector=connector) as s:
            async with s.get("http://localhost/v1/agent/status",
                             headers={"Authorization": f"Bearer {token(data)}"}) as resp:
                assert resp.status == 200 and (await resp.json())["memories"] == 0
            async with s.get("http://localhost/v1/agent/status") as resp:
                assert resp.status == 401  # the socket is no way around the token
    finally:
        proc.send_signal(signal.SIGTERM)
        assert (await finish(proc))[0] == 0


def test_background_progress_is_one_line_every_ten_seconds(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="syncd.daemon")
    now = [0.0]
    progress = ProgressLog("re-embedding with m", clock=lambda: now[0])
    for moment, done in ((5.0, 64), (10.0, 128), (15.0, 192), (20.5, 256), (31.0, 300)):
        now[0] = moment
        progress(done, 300)
    assert [r.getMessage() for r in caplog.records] == [
        "re-embedding with m: 128 of 300 memories", "re-embedding with m: 256 of 300 memories"]


def test_the_save_help_lists_the_stores_memory_types() -> None:
    """The CLI spells the types out (importing local_store would slow every hook call)."""
    from local_store.records import MEMORY_TYPES
    from syncd.commands.parser import SAVE_TYPES
    assert SAVE_TYPES == MEMORY_TYPES


async def test_the_configured_log_level_applies(tmp_path: Path) -> None:
    """``daemon.log_level`` was checked but never used: at ``warning`` the daemon's INFO lines
    (here the ones after its ready line: stopping, draining) are gone; its ready line, not a
    log record, still shows (``wait_ready`` reads it)."""
    data = tmp_path / "data"
    proc = await start(data, "--listen", "127.0.0.1:0", SYNCD_DAEMON_LOG_LEVEL="warning")
    await wait_ready(proc)
    proc.send_signal(signal.SIGTERM)
    code, err = await finish(proc)
    assert code == 0 and " INFO " not in err, err[-600:]
    proc = await start(data, "--listen", "127.0.0.1:0")  # the default, info
    await wait_ready(proc)
    proc.send_signal(signal.SIGTERM)
    code, err = await finish(proc)
    assert code == 0 and " INFO syncd.daemon: " in err, err[-600:]

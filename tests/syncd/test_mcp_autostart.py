"""``syncd mcp`` with no daemon running: it lists its tools at once and starts the daemon
(``[mcp] autostart``), as real processes driven by the official MCP client — a detached
``syncd run``, or the service manager (a small fake ``systemctl`` on PATH) when a unit for
the data directory is installed. No test leaves a daemon behind: each is found by its
command line (its data directory is the test's own) and stopped, even when the test failed."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import io
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import aiohttp
import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from local_store import HashingEmbedder, Store
from syncd.autostart import LOCK_FILENAME, LOG_FILENAME, installed_service, unit_data_dir
from syncd.mcp import McpServer
from syncd.mcp_stdio import run_stdio_bridge
from syncd.service import Paths, render_launchd, render_systemd
from syncd.state import read_state
from syncd.tools import TOOLS, Surfacer
from tests.syncd.processes import ROOT, env_for
from tests.syncd.test_mcp_stdio import free_port

pytestmark = pytest.mark.skipif(not Path("/proc/self/cmdline").exists(),
                                reason="finds daemons through /proc")

DEADLINE = 60.0
STARTED = "starting: "  # the line autostart writes to the daemon's log before each start


@dataclass
class Place:
    home: Path
    config: Path
    data: Path
    env: dict[str, str]

    def argv(self, *args: str) -> list[str]:
        return ["-m", "syncd", "--config", str(self.config), "--data-dir", str(self.data), *args]


def daemon_pids(data: Path) -> list[int]:
    """Live processes running ``syncd … --data-dir DATA … run`` (zombies excluded)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            words = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and "run" in words and str(data) in words:
            found.append(int(entry.name))
    return found


def stop_all(data: Path) -> None:
    """SIGTERM every daemon of ``data``, then SIGKILL what is left after the deadline."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in daemon_pids(data):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        limit = time.monotonic() + DEADLINE
        while daemon_pids(data) and time.monotonic() < limit:
            time.sleep(0.1)
        if not daemon_pids(data):
            return


def make_place(tmp_path: Path, mcp: str = "", extra: str = "",
               timeout: float = DEADLINE) -> Place:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    config = tmp_path / "syncd.toml"
    config.write_text('[daemon]\nlisten = "127.0.0.1:0"\n'
                      f"[mcp]\nstart_timeout_secs = {timeout}\n{mcp}\n{extra}")
    return Place(home, config, tmp_path / "data", env_for(home))


@pytest.fixture
def place(tmp_path: Path) -> Iterator[Place]:
    """A config (port 0, a 60 s start wait) and a data dir no daemon runs on; afterwards no
    daemon of it runs, whatever happened."""
    made = make_place(tmp_path)
    try:
        yield made
    finally:
        stop_all(made.data)


@contextlib.asynccontextmanager
async def mcp_session(place: Place, errlog: TextIO) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(command=sys.executable, args=place.argv("mcp"),
                                   env=place.env, cwd=ROOT)
    async with stdio_client(params, errlog=errlog) as (read, write), \
            ClientSession(read, write, read_timeout_seconds=2 * DEADLINE) as session:
        yield session


async def listed_tools(session: ClientSession) -> list[str]:
    init = await session.initialize()
    assert init.server_info.name == "syncd" and init.capabilities.tools is not None
    return [tool.name for tool in (await session.list_tools()).tools]


async def healthy(url: str) -> bool:
    try:
        async with aiohttp.ClientSession(trust_env=False) as http, \
                http.get(url + "/healthz", timeout=aiohttp.ClientTimeout(total=10)) as resp:
            return resp.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


async def syncd(place: Place, *args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *place.argv(*args), env=place.env, cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    async with asyncio.timeout(DEADLINE):
        out, _ = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def wait_for(condition: Any, what: str) -> None:
    """Poll ``condition`` (a sync callable, run off the loop) until true, for DEADLINE."""
    limit = asyncio.get_running_loop().time() + DEADLINE
    while not await asyncio.to_thread(condition):
        assert asyncio.get_running_loop().time() < limit, f"still waiting for {what}"
        await asyncio.sleep(0.1)


def start_lines(data: Path) -> list[str]:
    try:
        text = (data / LOG_FILENAME).read_text()
    except FileNotFoundError:
        return []
    return [line for line in text.splitlines() if STARTED in line]


@contextlib.contextmanager
def start_lock(data: Path) -> Iterator[None]:
    """The autostart lock, held by the test: no ``syncd mcp`` can start a daemon meanwhile."""
    data.mkdir(parents=True, exist_ok=True)
    fd = os.open(data / LOCK_FILENAME, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def structured(result: Any) -> dict[str, Any]:
    body = result.structured_content
    assert isinstance(body, dict), result
    return body


async def stored_contents(data: Path) -> list[str]:
    store = await Store.open(data, embedder=HashingEmbedder())
    try:
        rows = (await store.memories.list_memories({}))["rows"]
    finally:
        await store.close()
    return sorted(row["content_preview"] for row in rows)


# ---------------------------------------------------------------------- autostart on


async def test_with_no_daemon_tools_are_listed_and_a_call_starts_one(place: Place,
                                                                    tmp_path: Path) -> None:
    assert await asyncio.to_thread(daemon_pids, place.data) == []
    with (tmp_path / "mcp.stderr").open("w+") as errlog:
        with anyio.fail_after(4 * DEADLINE), contextlib.ExitStack() as held:
            # While the test holds the start lock no daemon can come up: the handshake and the
            # tool list do not wait for one.
            held.enter_context(start_lock(place.data))
            async with mcp_session(place, errlog) as session:
                assert await listed_tools(session) == list(TOOLS)
                assert await asyncio.to_thread(read_state, place.data) is None
                held.close()
                saved = await session.call_tool("save_memory", {
                    "content": "the release train leaves every second Tuesday",
                    "realm": "proj", "conversationId": "agent-1"})
                assert saved.is_error is False, saved
                node_id = structured(saved)["node_id"]
                found = await session.call_tool("memory_search", {
                    "query": "when does the release train leave", "realms": ["proj"]})
                assert found.is_error is False, found
                assert structured(found)["memories"][0]["id"] == node_id
        errlog.seek(0)
        said = errlog.read()
    assert "starting one" in said and str(place.data / LOG_FILENAME) in said
    assert len(start_lines(place.data)) == 1
    # The MCP server is gone (the client ended its process group); the daemon it started is
    # not: it runs in its own session, on the port it chose.
    state = await asyncio.to_thread(read_state, place.data)
    assert state is not None and await healthy(state["url"])
    assert await asyncio.to_thread(daemon_pids, place.data) == [state["pid"]]
    code, out = await syncd(place, "stop")
    assert code == 0 and "stopped the daemon" in out, out
    await wait_for(lambda: not daemon_pids(place.data), "the daemon to exit")
    assert await asyncio.to_thread(read_state, place.data) is None
    assert await stored_contents(place.data) == ["the release train leaves every second Tuesday"]


async def test_two_mcp_servers_starting_at_once_start_one_daemon(place: Place,
                                                                 tmp_path: Path) -> None:
    async def one(name: str, ready: asyncio.Event, go: asyncio.Event) -> str:
        with (tmp_path / f"{name}.stderr").open("w+") as errlog:
            async with mcp_session(place, errlog) as session:
                assert await listed_tools(session) == list(TOOLS)
                ready.set()
                await go.wait()
                saved = await session.call_tool("save_memory", {"content": f"saved by {name}"})
                assert saved.is_error is False, saved
                found = await session.call_tool("recall_memory", {"query": f"saved by {name}"})
                assert found.is_error is False, found
                return str(structured(saved)["node_id"])

    readies = [asyncio.Event(), asyncio.Event()]
    go = asyncio.Event()
    with anyio.fail_after(4 * DEADLINE):
        with start_lock(place.data):  # both find no daemon and wait for the lock
            tasks = [asyncio.create_task(one(n, r, go)) for n, r in zip("ab", readies,
                                                                         strict=True)]
            both: asyncio.Future[Any] = asyncio.gather(*(r.wait() for r in readies))
            futures: list[asyncio.Future[Any]] = [*tasks, both]
            done, _ = await asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED)
            for task in done - {both}:
                task.result()  # a session that ended before the calls fails the test here
        go.set()
        ids = await asyncio.gather(*tasks)
    assert len(set(ids)) == 2
    assert len(start_lines(place.data)) == 1  # one start, by whichever got the lock first
    state = await asyncio.to_thread(read_state, place.data)
    assert state is not None
    assert await asyncio.to_thread(daemon_pids, place.data) == [state["pid"]]
    code, out = await syncd(place, "stop")
    assert code == 0, out
    await wait_for(lambda: not daemon_pids(place.data), "the daemon to exit")
    assert await stored_contents(place.data) == ["saved by a", "saved by b"]


async def test_a_start_that_finds_the_store_in_use_is_retried_once_it_is_free(
        place: Place, tmp_path: Path) -> None:
    """A daemon still stopping holds the store: the one started beside it exits 75. The wait
    goes on while the store is held, and a new start follows once it is not."""
    log_file = place.data / LOG_FILENAME
    holder = await Store.open(place.data, embedder=HashingEmbedder())
    try:
        with (tmp_path / "mcp.stderr").open("w+") as errlog, anyio.fail_after(4 * DEADLINE):
            async with mcp_session(place, errlog) as session:
                assert await listed_tools(session) == list(TOOLS)
                call = asyncio.create_task(session.call_tool("save_memory",
                                                             {"content": "after the holder"}))
                await wait_for(lambda: log_file.exists() and "is in use by another syncd "
                               "process" in log_file.read_text(), "a start to meet the holder")
                assert not call.done()  # waiting, not failed
                await holder.close()
                saved = await call
                assert saved.is_error is False, saved
    finally:
        await holder.close()
    assert len(start_lines(place.data)) == 2
    code, out = await syncd(place, "stop")
    assert code == 0, out
    await wait_for(lambda: not daemon_pids(place.data), "the daemon to exit")
    assert await stored_contents(place.data) == ["after the holder"]


async def test_a_daemon_that_cannot_start_fails_the_call_at_once_naming_its_error(
        tmp_path: Path) -> None:
    missing = tmp_path / "no-such-token"
    made = make_place(tmp_path, extra=f'[control_plane]\nurl = "http://127.0.0.1:9"\n'
                                      f'token_file = "{missing}"\n')
    try:
        with (tmp_path / "mcp.stderr").open("w+") as errlog, anyio.fail_after(4 * DEADLINE):
            async with mcp_session(made, errlog) as session:
                assert await listed_tools(session) == list(TOOLS)
                failed = await session.call_tool("save_memory", {"content": "never saved"})
        assert failed.is_error is True
        error = structured(failed)["error"]
        assert error["code"] == "daemon_unavailable"
        # exit 2 (configuration) ends the wait at once, and the log's last line says why
        assert "exited as it started (exit 2)" in error["message"], error
        assert f"control_plane.token_file = '{missing}'" in error["message"]
        assert str(made.data / LOG_FILENAME) in error["message"]
        assert "`syncd run`" in error["message"]
    finally:
        stop_all(made.data)


async def test_a_daemon_that_does_not_come_up_in_time_fails_the_call_naming_the_fix(
        tmp_path: Path) -> None:
    made = make_place(tmp_path, timeout=1)
    try:
        with (tmp_path / "mcp.stderr").open("w+") as errlog, anyio.fail_after(4 * DEADLINE), \
                start_lock(made.data):  # held throughout: nothing can be started
            async with mcp_session(made, errlog) as session:
                assert await listed_tools(session) == list(TOOLS)
                failed = await session.call_tool("save_memory", {"content": "never"})
        assert failed.is_error is True
        assert structured(failed)["error"]["message"] == (
            "syncd daemon did not start within 1 s: run `syncd run` to see why, or see "
            f"{made.data / LOG_FILENAME}")
        assert start_lines(made.data) == [] and daemon_pids(made.data) == []
    finally:
        stop_all(made.data)


# ---------------------------------------------------------------------- the service manager


FAKE_SYSTEMCTL = """#!{python}
# systemctl, as far as `syncd mcp` uses it: records its arguments; "start" starts the unit's
# command detached, as the user manager would.
import json, os, subprocess, sys
with open(os.environ["FAKE_SYSTEMCTL_RECORD"], "a") as record:
    record.write(json.dumps(sys.argv[1:]) + "\\n")
if sys.argv[1:] == ["--user", "start", "syncd.service"]:
    with open(os.environ["FAKE_SYSTEMCTL_LOG"], "ab") as log:
        subprocess.Popen(json.loads(os.environ["FAKE_SYSTEMCTL_EXEC"]), stdin=subprocess.DEVNULL,
                         stdout=log, stderr=log, start_new_session=True)
"""


def install_fake_service(place: Place, tmp_path: Path) -> tuple[Path, Path]:
    """A systemd user unit for ``place`` (as ``syncd service install`` renders it) and a fake
    ``systemctl`` first on PATH; the files where it records its calls and its daemon's log."""
    command = [sys.executable, "-m", "syncd"]
    unit = render_systemd(Paths(config=place.config, data_dir=place.data,
                                log_dir=tmp_path / "logs"), command)
    unit_file = Path(place.env["XDG_CONFIG_HOME"], "systemd", "user", "syncd.service")
    unit_file.parent.mkdir(parents=True)
    unit_file.write_text(unit)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "systemctl"
    fake.write_text(FAKE_SYSTEMCTL.format(python=sys.executable))
    fake.chmod(0o755)
    record, service_log = tmp_path / "systemctl.calls", tmp_path / "service.log"
    place.env.update(PATH=f"{bin_dir}{os.pathsep}{place.env['PATH']}",
                     FAKE_SYSTEMCTL_RECORD=str(record), FAKE_SYSTEMCTL_LOG=str(service_log),
                     FAKE_SYSTEMCTL_EXEC=json.dumps([*command, *place.argv("run")[2:]]))
    return record, service_log


async def test_an_installed_service_is_started_through_the_service_manager(
        place: Place, tmp_path: Path) -> None:
    record, service_log = await asyncio.to_thread(install_fake_service, place, tmp_path)
    with (tmp_path / "mcp.stderr").open("w+") as errlog, anyio.fail_after(4 * DEADLINE):
        async with mcp_session(place, errlog) as session:
            assert await listed_tools(session) == list(TOOLS)
            saved = await session.call_tool("save_memory", {"content": "started by the unit"})
            assert saved.is_error is False, saved
    assert [json.loads(line) for line in record.read_text().splitlines()] == [
        ["--user", "start", "syncd.service"]]
    assert "ready on" in service_log.read_text()
    assert start_lines(place.data) == []  # no detached start: the service manager's daemon
    code, out = await syncd(place, "stop")
    assert code == 0, out
    await wait_for(lambda: not daemon_pids(place.data), "the daemon to exit")


@pytest.mark.parametrize("name", ["data", "with space", "100%", "$HOME", 'quote"d'])
def test_the_data_dir_of_an_installed_unit_is_read_back(tmp_path: Path, name: str) -> None:
    data = tmp_path / name
    paths = Paths(config=tmp_path / "c.toml", data_dir=data, log_dir=tmp_path / "logs")
    assert unit_data_dir(render_systemd(paths, ["/opt/syncd"]), "systemd") == data
    assert unit_data_dir(render_launchd(paths, ["/opt/syncd"]), "launchd") == data
    assert unit_data_dir("[Service]\nExecStart=/opt/syncd run\n", "systemd") is None
    assert unit_data_dir("not a plist", "launchd") is None


def test_a_unit_for_another_data_dir_is_not_used(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "systemctl").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    ours, other = tmp_path / "ours", tmp_path / "other"
    assert installed_service(ours, "systemd") is None  # no unit at all
    unit = tmp_path / "config" / "systemd" / "user" / "syncd.service"
    unit.parent.mkdir(parents=True)
    unit.write_text(render_systemd(Paths(config=tmp_path / "c.toml", data_dir=other,
                                         log_dir=tmp_path), ["/opt/syncd"]))
    assert installed_service(ours, "systemd") is None
    assert installed_service(other, "systemd") == [str(bin_dir / "systemctl"), "--user",
                                                   "start", "syncd.service"]
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no systemctl: no service to use
    assert installed_service(other, "systemd") is None


# ---------------------------------------------------------------------- autostart off


async def test_with_autostart_off_tools_are_listed_and_a_call_names_the_fix(
        tmp_path: Path) -> None:
    made = make_place(tmp_path, mcp="autostart = false")
    try:
        with (tmp_path / "mcp.stderr").open("w+") as errlog, anyio.fail_after(4 * DEADLINE):
            async with mcp_session(made, errlog) as session:
                assert await listed_tools(session) == list(TOOLS)
                failed = await session.call_tool("save_memory", {"content": "not saved"})
                await session.send_ping()
        assert failed.is_error is True
        error = structured(failed)["error"]
        assert error["code"] == "daemon_unavailable"
        assert "is not running" in error["message"] and "`syncd run`" in error["message"]
        assert json.loads(failed.content[0].text) == {"error": error}  # type: ignore[union-attr]
        assert not made.data.exists() and daemon_pids(made.data) == []  # nothing started
    finally:
        stop_all(made.data)


async def test_the_bridge_answers_a_mixed_batch_locally_and_the_calls_with_tool_errors(
        tmp_path: Path) -> None:
    """A batch holding calls and other requests: each gets its one answer (no daemon, no
    starter: the calls are tool errors), in the one array."""
    url = f"http://127.0.0.1:{free_port()}"
    batch = [{"jsonrpc": "2.0", "id": 1, "method": "ping"},
             {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
              "params": {"name": "save_memory", "arguments": {"content": "x"}}},
             {"jsonrpc": "2.0", "method": "notifications/initialized"},
             {"jsonrpc": "2.0", "id": 3, "method": "tools/list"},
             {"jsonrpc": "2.0", "method": "tools/call",
              "params": {"name": "save_memory", "arguments": {"content": "y"}}}]
    stdin = io.BytesIO(json.dumps(batch).encode() + b"\n"
                       + b'{"jsonrpc":"2.0","id":4,"method":"no/such"}\n')
    stdout = io.BytesIO()
    code = await asyncio.wait_for(run_stdio_bridge(
        url, "token", stdin=stdin, stdout=stdout, local=McpServer(None, Surfacer())), DEADLINE)
    assert code == 0
    answers, unknown = (json.loads(line) for line in stdout.getvalue().splitlines())
    by_id = {a["id"]: a for a in answers}
    assert sorted(by_id) == [1, 2, 3] and len(answers) == 3
    assert by_id[1]["result"] == {} and len(by_id[3]["result"]["tools"]) == len(TOOLS)
    assert by_id[2]["result"]["isError"] is True
    assert "is not running" in by_id[2]["result"]["structuredContent"]["error"]["message"]
    assert unknown["id"] == 4 and unknown["error"]["code"] == -32601

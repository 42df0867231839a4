"""The command line against real daemons (port 0, temp HOME/XDG), each test a bug a review
found: a data directory that cannot be created, import files the daemon could never take in one
piece (too deep, too large, a number JSON cannot carry) or that are no export at all, another
program on the daemon's port, a daemon listening on all interfaces, a control character in a
configured path, a sync pass that outlasts the client's wait, and a memory.db that cannot be
opened."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from local_store import HashingEmbedder, Store
from local_store.db import DB_FILENAME
from syncd.cli import main as cli_main
from syncd.exits import EXIT_CONFIG, EXIT_FAILED, EXIT_TEMPFAIL
from tests.sync.harness import start_hub
from tests.syncd.faultproxy import Fault, FaultProxy
from tests.syncd.processes import env_for, finish, wait_ready
from tests.syncd.test_daemon import cli, start

STAMP = "2026-01-02T03:04:05Z"


def syncd_cli(home: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "syncd", *args], capture_output=True,
                          text=True, env=env_for(home, **extra), timeout=60, check=False)


def one_line_error(err: str) -> bool:
    return "Traceback" not in err and len(err.strip().splitlines()) == 1 and \
        err.startswith("syncd: ")


@pytest.fixture
async def daemon_dir(tmp_path: Path) -> AsyncIterator[Path]:
    """A running daemon's data directory; the daemon stops cleanly at the end."""
    data = tmp_path / "data"
    proc = await start(data, "--listen", "127.0.0.1:0")
    await wait_ready(proc)
    try:
        yield data
    finally:
        proc.send_signal(signal.SIGTERM)
        assert (await finish(proc))[0] == 0


def node(i: int, content: str) -> dict[str, object]:
    return {"id": f"memory:n{i}", "content": content, "updated_at": STAMP}


async def memories(data: Path) -> int:
    code, out, err = await cli(data, "status", "--json")
    assert code == 0, err
    count: int = json.loads(out)["memories"]
    return count


# --- restore: a data directory that cannot be created -------------------------------------------

@pytest.mark.parametrize("where", ["under a file", "a file"])
def test_restore_into_a_data_dir_that_cannot_be_created_is_one_line(
        tmp_path: Path, where: str) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    data = blocker / "data" if where == "under a file" else blocker
    backup = tmp_path / "copy.db"
    backup.write_bytes(b"")  # never reached: the data directory is the problem
    out = syncd_cli(tmp_path / "home", "--data-dir", str(data), "restore", str(backup))
    assert (out.returncode, out.stdout) == (1, ""), out.stderr
    assert one_line_error(out.stderr), out.stderr
    assert out.stderr.startswith(f"syncd: cannot use the data directory {data}: ")
    assert out.stderr.rstrip().endswith("nothing was changed"), out.stderr
    assert blocker.read_text() == "not a directory\n"


# --- import: what the daemon could never take in one piece ------------------------------------

def test_import_of_deeply_nested_json_is_one_line(tmp_path: Path) -> None:
    """The file is read through before anything is sent: no daemon is needed to refuse it."""
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    (data / "api-token").write_text("t0k3n-0123456789abcdef0123456789\n")
    (data / "api-token").chmod(0o600)
    deep = tmp_path / "deep.json"
    deep.write_text('{"memory_nodes": [' + "[" * 100_000 + "]" * 100_000 + "]}")
    out = syncd_cli(tmp_path, "--data-dir", str(data), "import", str(deep))
    assert (out.returncode, out.stdout) == (1, ""), out.stderr[-2000:]
    assert one_line_error(out.stderr), out.stderr[-2000:]
    assert out.stderr.startswith(f"syncd: {deep}: the value at character 18 is nested too "
                                 "deeply"), out.stderr


async def test_an_export_of_large_memories_imports_back(tmp_path: Path) -> None:
    """Rows of up to 256 Ki characters are valid memories; 500 of them in one batch are far
    over daemon.max_body_bytes (4 MiB, the default on both sides): batches are cut by size."""
    source, target = tmp_path / "a" / "data", tmp_path / "b" / "data"
    source.parent.mkdir()
    target.parent.mkdir()
    export = tmp_path / "export.json"
    proc = await start(source, "--listen", "127.0.0.1:0")
    await wait_ready(proc)
    try:
        for i in range(20):
            body = (f"large memory {i} " + "lorem ipsum dolor sit amet " * 8000).encode()
            code, _, err = await cli(source, "save", "-", stdin=body)
            assert code == 0, err
        code, _, err = await cli(source, "export", "-o", str(export))
        assert code == 0 and "exported 20 memories" in err, err
    finally:
        proc.send_signal(signal.SIGTERM)
        assert (await finish(proc))[0] == 0
    assert export.stat().st_size > 4 * 1024 * 1024
    proc = await start(target, "--listen", "127.0.0.1:0")
    await wait_ready(proc)
    try:
        code, out, err = await cli(target, "import", str(export))
        assert code == 0, err
        assert out.startswith("applied 20 memories and 0 edges; 0 rows unchanged"), out
        assert err.count("processed ") >= 2 and "processed 20 / 20 rows" in err, err
        assert await memories(target) == 20
    finally:
        proc.send_signal(signal.SIGTERM)
        assert (await finish(proc))[0] == 0


async def test_a_row_too_large_for_any_request_is_refused_by_its_place(tmp_path: Path) -> None:
    """daemon.max_body_bytes = 64 KiB on both sides: a 100 KB row can never be sent; it is
    refused by its place in the file (not sent), the rows around it are applied."""
    data = tmp_path / "data"
    limit = {"SYNCD_DAEMON_MAX_BODY_BYTES": str(64 * 1024)}
    proc = await start(data, "--listen", "127.0.0.1:0", **limit)
    await wait_ready(proc)
    try:
        rows = tmp_path / "rows.json"
        nodes = [node(i, f"note {i} " + "x" * 9000) for i in range(12)]
        nodes[5]["content"] = "huge " + "y" * 100_000
        rows.write_text(json.dumps({"memory_nodes": nodes, "memory_edges": []}))
        code, out, err = await cli(data, "import", str(rows), **limit)
        assert code == 1, err
        assert out.startswith("applied 11 memories and 0 edges; 0 rows unchanged"), out
        assert out.rstrip().endswith("1 rows refused"), out
        assert "  memory_nodes[5] (memory:n5): 100" in err and "too large" in err, err
        assert err.count("processed ") >= 2, err  # more than one batch under 60 KiB
        assert await memories(data) == 11
    finally:
        proc.send_signal(signal.SIGTERM)
        assert (await finish(proc))[0] == 0


async def test_a_daemon_with_a_lower_limit_than_the_cli_knows_gets_smaller_batches(
        tmp_path: Path) -> None:
    """The daemon runs with daemon.max_body_bytes = 64 KiB, the CLI believes the default 4 MiB:
    a batch refused as too large (413) goes again in halves; a row alone too large is refused
    by its place, the others applied."""
    data = tmp_path / "data"
    proc = await start(data, "--listen", "127.0.0.1:0",
                       SYNCD_DAEMON_MAX_BODY_BYTES=str(64 * 1024))
    await wait_ready(proc)
    try:
        rows = tmp_path / "rows.json"
        nodes = [node(i, f"note {i} " + "x" * 9000) for i in range(30)]
        nodes[17]["content"] = "huge " + "y" * 100_000
        rows.write_text(json.dumps({"memory_nodes": nodes, "memory_edges": []}))
        code, out, err = await cli(data, "import", str(rows))
        assert code == 1, err
        assert out.startswith("applied 29 memories and 0 edges; 0 rows unchanged"), out
        assert "  memory_nodes[17] (memory:n17): refused by the daemon as too large (413 " \
            "too_large" in err, err
        assert await memories(data) == 29
    finally:
        proc.send_signal(signal.SIGTERM)
        assert (await finish(proc))[0] == 0


async def test_a_number_out_of_range_refuses_only_its_row(daemon_dir: Path,
                                                          tmp_path: Path) -> None:
    """``1e999`` and ``NaN`` are read by Python's json (as inf and nan) and were sent as
    ``Infinity``/``NaN``, which the daemon refuses: the whole batch was lost, not one row."""
    rows = tmp_path / "rows.json"
    rows.write_text('{"memory_nodes": ['
                    f'{{"id": "memory:a1", "content": "alpha", "updated_at": "{STAMP}"}},'
                    f'{{"id": "memory:a2", "content": "beta", "importance": 1e999, '
                    f'"updated_at": "{STAMP}"}},'
                    f'{{"id": "memory:a3", "content": "gamma", "updated_at": "{STAMP}"}},'
                    f'{{"id": "memory:a4", "content": "delta", "importance": NaN, '
                    f'"updated_at": "{STAMP}"}}'
                    '], "memory_edges": []}')
    code, out, err = await cli(daemon_dir, "import", str(rows))
    assert code == 1, err
    assert out.startswith("applied 2 memories and 0 edges; 0 rows unchanged"), (out, err)
    assert out.rstrip().endswith("2 rows refused"), out
    assert "  memory_nodes[1] (memory:a2): holds a number JSON cannot carry" in err, err
    assert "  memory_nodes[3] (memory:a4): holds a number JSON cannot carry" in err, err
    assert await memories(daemon_dir) == 2
    code, _, err = await cli(daemon_dir, "save", "x", "--importance", "inf")
    assert code == 2 and "Traceback" not in err, err  # never sent as `Infinity`: a usage
    assert "argument --importance: must be a finite number, got 'inf'" in err, err  # error


async def test_a_lone_surrogate_refuses_only_its_row(daemon_dir: Path, tmp_path: Path) -> None:
    """JSON can spell a lone surrogate (``\\ud800``); the daemon refuses a body holding one
    whole, so the row is not sent: it alone is refused, by its place, the rest applied."""
    rows = tmp_path / "rows.json"
    rows.write_text('{"memory_nodes": ['
                    f'{{"id": "memory:a1", "content": "alpha \\ud83d\\ude00", '
                    f'"updated_at": "{STAMP}"}},'
                    f'{{"id": "memory:a2", "content": "be\\ud800ta", "updated_at": "{STAMP}"}},'
                    f'{{"id": "memory:a3", "content": "gamma", "updated_at": "{STAMP}"}}]}}')
    code, out, err = await cli(daemon_dir, "import", str(rows))
    assert code == 1, err
    assert out.startswith("applied 2 memories and 0 edges; 0 rows unchanged"), (out, err)
    assert "  memory_nodes[1] (memory:a2): holds a lone surrogate escape" in err, err
    assert await memories(daemon_dir) == 2


class _FailingSecondImport(FaultProxy):
    """The second import request gets a 500 (the first is forwarded to the real daemon)."""

    def _pick(self, method: str, path: str) -> Fault | None:
        if path.endswith("/memory/import") and self.count("POST", "/memory/import") == 2:
            return Fault("status", status=500)
        return super()._pick(method, path)


async def test_an_import_that_stops_part_way_says_what_it_applied(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc = await start(data, "--listen", "127.0.0.1:0")
    url = await wait_ready(proc)
    try:
        async with _FailingSecondImport(url) as proxy:
            client = tmp_path / "client"  # the token, and no state file: the proxy's port
            client.mkdir(mode=0o700)
            shutil.copy(data / "api-token", client / "api-token")
            rows = tmp_path / "rows.json"
            rows.write_text(json.dumps({"memory_nodes": [node(i, f"note {i}")
                                                         for i in range(600)]}))
            code, out, err = await cli(client, "import", str(rows),
                                       SYNCD_DAEMON_LISTEN=proxy.url.removeprefix("http://"))
        assert code == 1, err
        assert out == ("applied 500 memories and 0 edges before the import stopped (500 of "
                       "600 rows done); 0 rows refused; importing the file again is safe (rows "
                       "already applied are left unchanged)\n"), out
        assert err.splitlines()[-1] == "syncd: 500 injected: injected 500", err
        assert await memories(data) == 500
        code, out, err = await cli(data, "import", str(rows))  # again, to the daemon itself
        assert code == 0 and out.startswith("applied 100 memories and 0 edges; 500 rows "
                                            "unchanged"), (out, err)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert (await finish(proc))[0] == 0


@pytest.mark.parametrize("document", [{"memories": [node(1, "keep me")]}, {}])
def test_an_object_that_is_not_an_export_is_refused_before_anything_is_sent(
        tmp_path: Path, document: dict[str, object]) -> None:
    """An object with neither memory_nodes nor memory_edges (the wrong file, a misspelt key)
    was imported as "applied 0 memories", exit 0, its rows dropped without a word. The
    daemon's own route still takes ``{}`` (the plane's contract); the CLI's file check does
    not, and refuses it before sending anything: no daemon is needed."""
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    (data / "api-token").write_text("t0k3n-0123456789abcdef0123456789\n")
    (data / "api-token").chmod(0o600)
    wrong = tmp_path / "memories.json"
    wrong.write_text(json.dumps(document))
    out = syncd_cli(tmp_path, "--data-dir", str(data), "import", str(wrong))
    assert (out.returncode, out.stdout) == (EXIT_FAILED, ""), out.stderr
    assert one_line_error(out.stderr), out.stderr
    assert out.stderr == (f"syncd: {wrong}: expected an object with memory_nodes and "
                          "memory_edges, found an object with neither\n"), out.stderr


# --- the client: another program on the daemon's port ---------------------------------------

@pytest.fixture
def not_http_server() -> Iterator[int]:
    """A TCP server that answers like SSH (not HTTP)."""
    srv = socket.create_server(("127.0.0.1", 0))
    port: int = srv.getsockname()[1]
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    conn.recv(4096)
                    conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield port
    stop.set()
    thread.join()
    srv.close()


@pytest.fixture
def html_server() -> Iterator[int]:
    """An HTTP server answering GET with a 200 HTML page, POST with its 501 HTML error page
    (a dev server, say)."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(b"<html>\n<body>hello</body>\n</html>\n")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("server", ["not_http_server", "html_server"])
@pytest.mark.parametrize("command", [["status"], ["save", "a note"], ["export", "-o", "out.json"]])
def test_another_program_on_the_port_is_a_one_line_error(
        tmp_path: Path, server: str, command: list[str], request: pytest.FixtureRequest) -> None:
    port = request.getfixturevalue(server)
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    (data / "api-token").write_text("t0k3n-0123456789abcdef0123456789\n")
    (data / "api-token").chmod(0o600)
    if command[0] == "export":
        command = [*command[:-1], str(tmp_path / "out.json")]
    out = syncd_cli(tmp_path, "--data-dir", str(data), *command,
                    SYNCD_DAEMON_LISTEN=f"127.0.0.1:{port}")
    assert out.returncode == 75, out.stderr  # as a daemon that is not running
    assert one_line_error(out.stderr), out.stderr
    assert out.stderr.startswith(f"syncd: http://127.0.0.1:{port} does not answer like a "
                                 "syncd daemon"), out.stderr
    assert not (tmp_path / "out.json").exists()  # a web page is never taken for an export


# --- a daemon listening on all interfaces -------------------------------------------------------

@pytest.mark.parametrize("listen", ["0.0.0.0:0", "[::]:0"])
async def test_the_cli_hook_and_mcp_reach_a_daemon_listening_on_all_interfaces(
        tmp_path: Path, listen: str) -> None:
    """``listen = "0.0.0.0:…"`` with allow_non_loopback is accepted; the state file named the
    wildcard address, whose Host the guard refuses (421): every client on the machine failed."""
    data = tmp_path / "data"
    proc = await start(data, "--listen", listen, "--allow-non-loopback")
    await wait_ready(proc)
    try:
        code, out, err = await cli(data, "save", "reachable over loopback")
        assert code == 0 and out.startswith("saved "), err
        assert await memories(data) == 1
        prompt = {"prompt": "is it reachable over loopback?", "cwd": str(tmp_path)}
        code, out, err = await cli(data, "recall", "--hook", stdin=json.dumps(prompt).encode())
        assert code == 0 and "reachable over loopback" in json.loads(out)[
            "hookSpecificOutput"]["additionalContext"], (out, err)
        messages = [{"jsonrpc": "2.0", "id": 1, "method": "initialize",
                     "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                "clientInfo": {"name": "t", "version": "0"}}},
                    {"jsonrpc": "2.0", "method": "notifications/initialized"},
                    {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}]
        code, out, err = await cli(data, "mcp", stdin=b"".join(
            json.dumps(m).encode() + b"\n" for m in messages))
        answers = [json.loads(line) for line in out.splitlines()]
        assert code == 0 and [a["id"] for a in answers] == [1, 2], (out, err)
        assert all("result" in a for a in answers) and answers[1]["result"]["tools"], out
    finally:
        proc.send_signal(signal.SIGTERM)
        assert (await finish(proc))[0] == 0


@pytest.mark.parametrize(("listen", "url"), [("0.0.0.0:7777", "http://127.0.0.1:7777"),
                                             ("[::]:7777", "http://[::1]:7777"),
                                             ("127.0.0.1:7777", "http://127.0.0.1:7777"),
                                             ("[::1]:7777", "http://[::1]:7777")])
def test_the_configured_url_of_a_wildcard_listen_is_loopback(tmp_path: Path, listen: str,
                                                              url: str) -> None:
    """Before the daemon's state file exists (``syncd mcp`` started first waits for it), clients
    use the configured address: a wildcard one is reached over loopback too."""
    from syncd.commands.settings import command_settings
    config = tmp_path / "syncd.toml"
    config.write_text(f'[daemon]\nlisten = "{listen}"\nallow_non_loopback = true\n')
    args = argparse.Namespace(config=config, command="mcp", data_dir=tmp_path)
    assert command_settings(args)["url"] == url


# --- a control character in a configured path ---------------------------------------------------

@pytest.mark.parametrize(("field", "escaped"), [("data_dir", "\\u0000"), ("data_dir", "\\n"),
                                                ("unix_socket", "\\u0000")])
def test_a_control_character_in_a_configured_path_is_a_config_error(
        tmp_path: Path, field: str, escaped: str) -> None:
    """TOML accepts ``\\u0000``; the config took the path, and `syncd run` then failed with exit
    75 (temporary: the unit restarts it, forever) and a traceback, not exit 2."""
    config = tmp_path / "config.toml"
    config.write_text(f'[daemon]\n{field} = "{tmp_path}/a{escaped}b"\nlisten = "127.0.0.1:0"\n')
    out = syncd_cli(tmp_path / "home", "--config", str(config), "run")
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert one_line_error(out.stderr), out.stderr
    assert out.stderr.startswith(f"syncd: config error: daemon.{field} = ")
    assert "must not contain control characters" in out.stderr
    assert not (tmp_path / "a").exists() and list(tmp_path.iterdir()) == [config]



def test_hub_admin_commands_are_found_only_as_the_subcommand(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``hub key``/``hub token`` anywhere in the arguments were taken for the hub's admin
    commands, so recalling "key" in the realm "hub" got their usage error (exit 2) instead of
    reaching the daemon (here: not running, exit 75)."""
    code = cli_main(["--data-dir", str(tmp_path), "recall", "--realm", "hub", "key"])
    err = capsys.readouterr().err
    assert "hub key" not in err and code == EXIT_TEMPFAIL, err
    config, data = str(tmp_path / "none.toml"), str(tmp_path)
    for argv in (["hub", "key", "--help"], ["--data-dir", data, "hub", "token", "--help"],
                 [f"--config={config}", "hub", "key", "--help"],
                 [f"--config={config}", "--data-dir", data, "hub", "token", "--help"],
                 [f"--data-dir={data}", "--config", config, "hub", "token", "--help"],
                 ["--data", data, "hub", "key", "--help"]):
        assert cli_main(argv) == 0, argv  # the hub command's own help
        assert "syncd hub" in capsys.readouterr().out, argv


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "lots"])
def test_an_importance_that_is_not_a_finite_number_is_a_usage_error(
        tmp_path: Path, value: str) -> None:
    """Refused by the CLI, naming the option (it once reached the JSON encoder: "Out of range
    float values are not JSON compliant", exit 1)."""
    done = syncd_cli(tmp_path, "--data-dir", str(tmp_path / "data"), "save", "x",
                     "--importance", value)
    assert done.returncode == 2 and "--importance" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr



@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf", "soon"])
def test_a_sync_timeout_that_is_not_a_positive_finite_number_is_a_usage_error(
        tmp_path: Path, value: str) -> None:
    """Refused before any request, naming the option (no daemon runs here)."""
    done = syncd_cli(tmp_path, "--data-dir", str(tmp_path / "data"), "sync", "--timeout", value)
    assert done.returncode == 2 and "--timeout" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "data" / "memory.db").exists()


# --- sync: a pass that outlasts the client's wait ----------------------------------------------

@contextlib.asynccontextmanager
async def hung_plane(tmp: Path) -> AsyncIterator[tuple[FaultProxy, dict[str, str]]]:
    """A control plane that takes every request and never answers (a real hub behind the fault
    proxy, which holds each request), and the environment that points a daemon at it, with a
    stop that waits 2 s at most."""
    hub = await start_hub(tmp / "hub")
    try:
        async with FaultProxy(hub.url) as plane:
            plane.fail_always(Fault("timeout", delay=60.0))
            token = tmp / "plane-token"
            await asyncio.to_thread(token.write_text, hub.token + "\n")
            yield plane, {"SYNCD_CONTROL_PLANE_URL": plane.url,
                          "SYNCD_CONTROL_PLANE_TOKEN_FILE": str(token),
                          "SYNCD_DAEMON_SHUTDOWN_TIMEOUT_SECS": "2"}
    finally:
        await hub.close()


async def test_a_slow_pass_is_not_reported_as_daemon_down(tmp_path: Path) -> None:
    """`syncd sync` waited its 30 s for a pass held by a hung plane, then said the running
    daemon "is not running … start it with `syncd run`" (exit 75, which a service manager
    reads as temporary). A request sent and not answered in time is a failed request (exit 1)
    that says where to look. The wait is 2 s here (``--timeout``)."""
    data = tmp_path / "data"
    async with hung_plane(tmp_path) as (_, plane):
        proc = await start(data, "--listen", "127.0.0.1:0", **plane)
        url = await wait_ready(proc)
        try:
            code, out, err = await cli(data, "sync", "--timeout", "2")
            assert proc.returncode is None  # the daemon ran all along
            assert (code, out) == (EXIT_FAILED, ""), err
            assert one_line_error(err), err
            assert err.startswith(f"syncd: the daemon at {url} did not answer POST "
                                  "/v1/agent/sync/run within 2 s; it is still running"), err
            assert err.rstrip().endswith("`syncd status` shows how it went"), err
        finally:
            proc.send_signal(signal.SIGTERM)
            code, err = await finish(proc)
    assert code == 0 and "Traceback" not in err, err


# --- a memory.db that cannot be opened -----------------------------------------------------------

def run_daemon(data: Path, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "syncd", "--data-dir", str(data), "run",
                           "--listen", "127.0.0.1:0"], capture_output=True, text=True,
                          env=env_for(home), timeout=60, check=False)


def test_a_memory_db_that_is_a_directory_is_exit_2_in_one_line(tmp_path: Path) -> None:
    """SQLite cannot open it (SQLITE_CANTOPEN): a traceback and exit 75 ("temporary: restart"),
    which a service manager repeats forever."""
    data = tmp_path / "data"
    (data / DB_FILENAME).mkdir(parents=True)
    out = run_daemon(data, tmp_path)
    assert out.returncode == EXIT_CONFIG, out.stderr
    assert one_line_error(out.stderr), out.stderr
    assert out.stderr == (f"syncd: {data / DB_FILENAME} cannot be used: unable to open "
                          "database file: it is a directory, not a database file\n")


async def create_store(data: Path) -> None:
    async with await Store.open(data, embedder=HashingEmbedder()):
        pass


@contextlib.contextmanager
def unwritable(path: Path) -> Iterator[None]:
    """``path`` made a file this process may not write: mode 0444, or for root, whom modes do
    not stop, the immutable attribute (where the file system has it)."""
    if os.geteuid() != 0:
        path.chmod(0o444)
        yield
        return
    if shutil.which("chattr") is None or subprocess.run(
            ["chattr", "+i", str(path)], capture_output=True, check=False).returncode:
        pytest.skip("running as root, and no immutable attribute (chattr +i) here")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_a_memory_db_syncd_may_not_write_is_exit_2_in_one_line(tmp_path: Path) -> None:
    """SQLite opens a file it may not write (another user's, read-only) read-only, without a
    word, and a store already migrated writes nothing while it opens: the daemon failed at its
    first write instead, with a traceback and exit 75."""
    data = tmp_path / "data"
    asyncio.run(create_store(data))
    with unwritable(data / DB_FILENAME):
        out = run_daemon(data, tmp_path)
    assert out.returncode == EXIT_CONFIG, out.stderr
    assert one_line_error(out.stderr), out.stderr
    assert out.stderr.startswith(
        f"syncd: {data / DB_FILENAME} cannot be used: attempt to write a readonly database: "
        f"syncd runs as uid {os.getuid()} and must be able to read and write it"), out.stderr

"""Messages a person reads from the installed ``syncd`` (issue 35), run in a subprocess."""

from __future__ import annotations

import json
import signal
import socket
from pathlib import Path

import pytest

from syncd.state import state_path
from tests.syncd.processes import cli, daemon, finish, spawn, wait_ready


async def test_a_bare_port_is_refused_with_the_address_meant(tmp_path: Path) -> None:
    data = tmp_path / "data"
    code, _, err = await cli(tmp_path, "--data-dir", str(data), "run", "--listen", "17807")
    assert code == 2
    assert "--listen 17807: expected host:port; for this machine only, 127.0.0.1:17807" in err
    assert not data.exists()  # nothing made in a data dir the daemon never ran in


async def test_status_shows_the_data_dir_given_relative_as_an_absolute_path(
        tmp_path: Path) -> None:
    proc = await spawn(tmp_path, "--data-dir", "data", "run", "--listen", "127.0.0.1:0",
                       cwd=tmp_path)
    try:
        await wait_ready(proc)
        code, out, err = await cli(tmp_path, "--data-dir", "data", "status", "--json",
                                   cwd=tmp_path)
        assert code == 0, err
        assert json.loads(out)["data_dir"] == str(tmp_path / "data")
        code, out, err = await cli(tmp_path, "--data-dir", "data", "status", cwd=tmp_path)
        assert code == 0 and "outbox           0\n" in out, (out, err)
        for _ in range(2):  # one entry per memory, however often it is written
            code, _, err = await cli(tmp_path, "--data-dir", "data", "save", "a note",
                                     "--topic-key", "t", cwd=tmp_path)
            assert code == 0, err
        code, out, err = await cli(tmp_path, "--data-dir", "data", "status", cwd=tmp_path)
        assert "outbox           1 — memories and edges not yet pushed, one entry each however " \
            "often edited; kept for when sync is set up" in out, (out, err)
    finally:
        proc.send_signal(signal.SIGTERM)
        code, err = await finish(proc)
    assert code == 0, err


@pytest.mark.parametrize("existed", [False, True])
async def test_a_start_on_a_taken_port_leaves_the_data_dir_as_it_found_it(
        tmp_path: Path, existed: bool) -> None:
    data = tmp_path / "data"
    if existed:
        data.mkdir()
        (data / "notes.txt").write_text("mine")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, _, err = await cli(tmp_path, "--data-dir", str(data), "run", "--listen",
                                 f"127.0.0.1:{port}")
    assert code == 75 and f"cannot listen on 127.0.0.1:{port}" in err, err
    if existed:
        assert sorted(p.name for p in data.iterdir()) == ["notes.txt"]
    else:
        assert not data.exists()


async def test_stop_stops_the_running_daemon_and_says_so(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    proc = await spawn(tmp_path, "--data-dir", data, "run", "--listen", "127.0.0.1:0")
    url = await wait_ready(proc)
    code, out, err = await cli(tmp_path, "--data-dir", data, "stop", "--json")
    assert (code, json.loads(out)) == (0, {"stopped": True, "url": url, "running": False}), err
    code, err = await finish(proc)  # a clean stop: exit 0, its state file removed
    assert code == 0, err
    assert not state_path(tmp_path / "data").exists()
    with socket.socket() as closed:  # bound, never listening: nothing answers there
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        config = tmp_path / "syncd.toml"
        config.write_text(f'[daemon]\nlisten = "127.0.0.1:{port}"\n')
        code, out, err = await cli(tmp_path, "--config", str(config), "--data-dir", data, "stop")
    assert code == 0, err
    assert f"no daemon answers at http://127.0.0.1:{port}; nothing to stop" in err


async def test_list_get_and_delete_from_the_command_line(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    async with daemon(tmp_path, data):

        async def syncd(*args: str) -> tuple[int, str, str]:
            return await cli(tmp_path, "--data-dir", data, *args)

        ids = {}
        for text, realm, tag in (("deploy with make ship", "billing", "ops"),
                                 ("the queue is SQS", "billing", "infra"),
                                 ("standup at ten", "team", "ops")):
            code, out, err = await syncd("save", text, "--realm", realm, "--tag", tag)
            assert code == 0, err
            ids[text] = out.split()[-1]
        code, out, _ = await syncd("list", "--json")
        assert [m["id"] for m in json.loads(out)["memories"]] == list(reversed(ids.values()))
        code, out, _ = await syncd("list", "--realm", "billing", "--realm", "team", "--tag",
                                   "ops", "--json")
        assert {m["id"] for m in json.loads(out)["memories"]} == {
            ids["deploy with make ship"], ids["standup at ten"]}
        code, out, _ = await syncd("list", "--realm", "team")
        assert code == 0 and ids["standup at ten"] in out
        assert "[fact] team: standup at ten" in out and "billing" not in out

        code, out, _ = await syncd("recall", "deploy make ship", "--tag", "infra", "--json")
        assert code == 0 and ids["deploy with make ship"] not in out
        code, out, _ = await syncd("recall", "deploy make ship", "--tag", "ops", "--realm",
                                   "billing", "--json")
        assert [m["id"] for m in json.loads(out)["memories"]][:1] == [ids["deploy with make ship"]]
        code, out, _ = await syncd("get", ids["the queue is SQS"])
        assert code == 0 and "the queue is SQS" in out and "tags:" in out and "infra" in out
        code, out, _ = await syncd("get", ids["the queue is SQS"], "--json")
        assert json.loads(out)["content"] == "the queue is SQS"

        code, out, err = await syncd("delete", ids["the queue is SQS"])
        assert code == 0 and out.startswith(f"deleted {ids['the queue is SQS']}"), err
        code, _, err = await syncd("get", ids["the queue is SQS"])
        assert code == 1 and "not found" in err
        code, out, err = await syncd("delete", ids["standup at ten"], "--hard", "--json")
        assert code == 0 and json.loads(out)["hard"] is True, err
        code, out, _ = await syncd("list", "--json")
        assert [m["id"] for m in json.loads(out)["memories"]] == [ids["deploy with make ship"]]
        code, _, err = await syncd("list", "--limit", "0")
        assert code == 2 and "--limit must be from 1 to 200, got 0" in err


@pytest.mark.parametrize(("command", "says"), [
    (("mcp",), "MCP over stdio"),
    (("hub",), "`syncd hub token list`"),
    (("hub",), "`syncd hub key`"),
    (("license",), "install an offline licence"),
    (("setup", "claude-code"), "Claude Code: the prompt and session-start hooks"),
    (("stop",), "stop the running daemon cleanly"),
])
async def test_each_commands_help_says_what_it_does(tmp_path: Path, command: tuple[str, ...],
                                                    says: str) -> None:
    code, out, err = await cli(tmp_path, *command, "--help")
    assert code == 0, err
    assert says in " ".join(out.split()), out


async def test_global_options_work_before_and_after_the_command(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    config = tmp_path / "syncd.toml"
    config.write_text("[daemon]\nlog_level = \"info\"\n")
    proc = await spawn(tmp_path, "run", "--data-dir", data, "--listen", "127.0.0.1:0",
                       "--config", str(config))
    try:
        await wait_ready(proc)
        assert (tmp_path / "data" / "memory.db").exists()  # the data dir given after `run`
        for argv in (["--data-dir", data, "save", "before", "--realm", "r"],
                     ["save", "after", "--realm", "r", "--data-dir", data],
                     ["save", "--config", str(config), "mixed", "--data-dir", data]):
            code, _, err = await cli(tmp_path, *argv)
            assert code == 0, (argv, err)
        code, out, err = await cli(tmp_path, "list", "--json", "--data-dir", data)
        assert code == 0, err
        assert sorted(m["content_preview"] for m in json.loads(out)["memories"]) == [
            "after", "before", "mixed"]
        # given on both sides, the one after the command counts
        code, out, err = await cli(tmp_path, "--data-dir", str(tmp_path / "elsewhere"),
                                   "status", "--json", "--data-dir", data)
        assert code == 0 and json.loads(out)["data_dir"] == data, err
        code, out, err = await cli(tmp_path, "setup", "mcp", "--print", "--data-dir", data)
        assert code == 0, err
    finally:
        proc.send_signal(signal.SIGTERM)
        code, err = await finish(proc)
    assert code == 0, err


async def test_not_running_names_the_address_what_set_it_and_how_to_start(
        tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc = await spawn(tmp_path, "--data-dir", str(data), "run", "--listen", "127.0.0.1:0")
    await wait_ready(proc)  # a token file exists from now on
    proc.send_signal(signal.SIGTERM)
    code, err = await finish(proc)
    assert code == 0, err
    with socket.socket() as closed:  # bound, never listening: nothing answers there
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        config = tmp_path / "syncd.toml"
        config.write_text(f'[daemon]\nlisten = "127.0.0.1:{port}"\n')
        code, _, err = await cli(tmp_path, "status", "--config", "syncd.toml", "--data-dir",
                                 "data", cwd=tmp_path)
        assert code == 75
        assert (f"syncd daemon is not running at http://127.0.0.1:{port} (connection refused);"
                f" the address is daemon.listen in {config}; start it with `syncd --config "
                f"{config} --data-dir {data} run`") in err, err
        code, _, err = await cli(tmp_path, "recall", "q", "--data-dir", str(data),
                                 env={"SYNCD_DAEMON_LISTEN": f"127.0.0.1:{port}"})
        assert code == 75
        assert f"the address is SYNCD_DAEMON_LISTEN=127.0.0.1:{port}; start it with `syncd " \
            f"--data-dir {data} run`" in err, err


async def test_hub_admin_commands_take_the_store_from_either_side_or_the_config(
        tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    code, out, err = await cli(tmp_path, "--data-dir", str(hub), "hub", "token", "create",
                               "--role", "write", "--name", "laptop-a")
    assert code == 0 and out.strip(), err
    for argv in (["--data-dir", str(hub), "hub", "token", "list"],
                 ["hub", "token", "list", "--data-dir", str(hub)]):
        code, out, err = await cli(tmp_path, *argv)
        assert code == 0 and "laptop-a" in out, (argv, err)
    config = tmp_path / "hub.toml"
    other = tmp_path / "hub-from-config"
    config.write_text(f'[hub]\ndata_dir = "{other}"\n')
    code, _, err = await cli(tmp_path, "--config", str(config), "hub", "token", "create",
                             "--role", "read", "--name", "laptop-b")
    assert code == 0, err
    assert (other / "hub-tokens.json").exists()
    code, out, err = await cli(tmp_path, "hub", "token", "list", "--config", str(config))
    assert code == 0 and "laptop-b" in out and "laptop-a" not in out, err
    code, out, err = await cli(tmp_path, "hub", "key", "--config", str(config))
    assert code == 0 and out.strip() and "key id" in err, err

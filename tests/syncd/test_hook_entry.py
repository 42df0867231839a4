"""The prompt hook's short way in (``syncd.entry`` → ``syncd.hook``): which command lines take
it, that it imports nothing heavy, that it finds the daemon exactly as the full CLI does, and
that it answers exactly as the full CLI's path does, against a real daemon."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
from pathlib import Path

import pytest

from syncd.addresses import local_url, parse_listen
from syncd.commands.parser import build_parser
from syncd.commands.settings import command_settings
from syncd.config import DEFAULT_LISTEN
from syncd.entry import hook_flags
from syncd.hook import _read_response, daemon_address
from syncd.hook_config import DEFAULT_LISTEN as HOOK_DEFAULT_LISTEN
from syncd.hook_config import fast_address
from tests.syncd.processes import env_for
from tests.syncd.test_daemon import cli
from tests.syncd.test_proxies import running_daemon

SCRIPT = Path(sys.executable).with_name("syncd")  # the console script beside the interpreter
HEAVY = ("aiohttp", "msgspec", "numpy", "onnxruntime", "onnx", "tokenizers", "local_store",
         "sqlite3", "asyncio", "argparse", "urllib.request", "http.client", "syncd.cli",
         "syncd.config", "syncd.client")


# --- which command lines are the hook's ---------------------------------------------------------

@pytest.mark.parametrize(("argv", "config", "data_dir"), [
    (["recall", "--hook"], None, None),
    (["--data-dir", "/d", "recall", "--hook"], None, "/d"),
    (["--data-dir=/d", "recall", "--hook"], None, "/d"),
    (["--config", "/c.toml", "--data-dir", "~/d", "recall", "--hook"], "/c.toml", "~/d"),
    (["--data-dir", "/a", "--config=/c", "--data-dir", "/b", "recall", "--hook"], "/c", "/b"),
    (["--config", "recall", "recall", "--hook"], "recall", None),
])
def test_hook_command_lines_are_read_as_argparse_reads_them(
        argv: list[str], config: str | None, data_dir: str | None) -> None:
    expected = (None if config is None else Path(config),
                None if data_dir is None else Path(data_dir))
    assert hook_flags(argv) == expected
    args = build_parser().parse_args(argv)
    assert (args.command, args.hook, args.config, args.data_dir) == ("recall", True, *expected)


@pytest.mark.parametrize("argv", [
    [], ["recall"], ["recall", "query"], ["recall", "--hook", "query"],
    ["recall", "--hook", "--json"], ["recall", "--ho"], ["--data", "/d", "recall", "--hook"],
    ["--data-dir"], ["--data-dir", "recall", "--hook"], ["--data-dir=", "recall", "--hook"],
    ["--config", "-x", "recall", "--hook"], ["--version"], ["-h", "recall", "--hook"],
    ["status"], ["save", "recall", "--hook"], ["hub", "token", "list"],
])
def test_every_other_command_line_is_left_to_argparse(argv: list[str]) -> None:
    assert hook_flags(argv) is None


# --- where the daemon is ------------------------------------------------------------------------

def test_the_default_listen_address_is_the_configs() -> None:
    assert HOOK_DEFAULT_LISTEN == DEFAULT_LISTEN
    assert fast_address(None, {"HOME": "/h"}) == (
        Path("/h/.local/share/syncd"), local_url(*parse_listen(DEFAULT_LISTEN)))


CONFIGS: dict[str, bytes | None] = {
    "no file": None, "empty": b"", "comments": b"# syncd configuration\n\n# more\n",
    "bom and comment": b"\xef\xbb\xbf# hi\n", "a setting": b'[daemon]\nlog_level = "info"\n',
    "a listen address": b'[daemon]\nlisten = "127.0.0.1:7001"\n',
    "a data dir": b'[daemon]\ndata_dir = "~/elsewhere"\n', "an empty section": b"[daemon]\n",
    "a bad value": b"[sync]\ninterval_secs = -5\n", "not TOML": b"[daemon\n",
    "a control character": b"# \x00\n", "not UTF-8": b"\xff\xfe",
    "a form feed": b"\x0c",
}
ENVS: dict[str, dict[str, str]] = {
    "plain": {}, "a SYNCD_ variable": {"SYNCD_DAEMON_LISTEN": "127.0.0.1:7002"},
    "a bad SYNCD_ variable": {"SYNCD_DAEMON_NOPE": "1"},
    "SYNCD_CONFIG (not an option)": {"SYNCD_CONFIG": "x"},
    "a relative XDG_DATA_HOME": {"XDG_DATA_HOME": "relative"},
    "a newline in XDG_DATA_HOME": {"XDG_DATA_HOME": "/tmp/a\nb"},
}


@pytest.mark.parametrize("config_name", list(CONFIGS))
@pytest.mark.parametrize("env_name", list(ENVS))
@pytest.mark.parametrize("flagged", [False, True])
def test_the_hook_finds_the_daemon_exactly_as_the_cli_does(
        tmp_path: Path, config_name: str, env_name: str, flagged: bool) -> None:
    """``daemon_address`` against ``syncd.commands.settings.command_settings`` (what every
    command uses): the same data directory and URL, or both refuse the config; the defaults are only taken for a
    config that sets nothing."""
    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
           "XDG_DATA_HOME": str(tmp_path / "share"), **ENVS[env_name]}
    content = CONFIGS[config_name]
    path = tmp_path / "cfg" / "syncd" / "config.toml"
    if content is not None:
        path.parent.mkdir(parents=True)
        path.write_bytes(content)
    config = path if flagged else None
    for data_dir in (None, Path("~/flag")):
        args = argparse.Namespace(command="recall", config=config, data_dir=data_dir)
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(env)
        try:
            try:
                settings = command_settings(args)
                expected = (settings["data_dir"], settings["url"])
            except ValueError as exc:
                with pytest.raises(Exception) as raised:
                    daemon_address(config, data_dir, env)
                assert str(raised.value) == str(exc)
            else:
                assert daemon_address(config, data_dir, env) == expected
        finally:
            os.environ.clear()
            os.environ.update(saved)
    usual = content is None or config_name in (
        "empty", "comments", "bom and comment", "a setting", "a listen address", "a data dir",
        "an empty section")
    assert (fast_address(config, env) is not None) == (
        usual and env_name in ("plain", "a SYNCD_ variable", "a relative XDG_DATA_HOME")
        and not (flagged and content is None)), (config_name, env_name)


# --- reading the answer -------------------------------------------------------------------------

@pytest.mark.parametrize(("answer", "expected"), [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: application/json\r\n\r\n{}",
     (200, b"{}")),
    (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}trailing", (200, b"{}")),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n4;x=y\r\n\": 1\r\n"
     b"1\r\n}\r\n0\r\n\r\n", (200, b'{"a": 1}')),
    (b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n", (401, b"")),
    (b"HTTP/1.0 200 OK\r\n\r\n[1]", (200, b"[1]")),
])
def test_an_answer_is_read_to_its_length_or_its_end(answer: bytes,
                                                     expected: tuple[int, bytes]) -> None:
    left, right = socket.socketpair()
    with left, right:
        left.sendall(answer)
        left.shutdown(socket.SHUT_WR)
        assert _read_response(right) == expected


@pytest.mark.parametrize("answer", [
    b"", b"SSH-2.0-OpenSSH_9.6\r\n", b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}",
])
def test_no_answer_a_cut_answer_or_another_protocol_is_an_error(answer: bytes) -> None:
    left, right = socket.socketpair()
    with left, right:
        left.sendall(answer)
        left.shutdown(socket.SHUT_WR)
        with pytest.raises(ConnectionError):
            _read_response(right)


# --- against a real daemon ----------------------------------------------------------------------

async def run(argv: list[str], env: dict[str, str], stdin: bytes) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv, env=env, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    async with asyncio.timeout(60):
        out, err = await proc.communicate(stdin)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def imported(importtime: str) -> set[str]:
    """The module names in ``-X importtime``'s report."""
    return {line.rsplit("|", 1)[1].strip() for line in importtime.splitlines()
            if line.startswith("import time:") and "|" in line} - {"package"}


@pytest.mark.skipif(not SCRIPT.exists(), reason="no console script beside the interpreter")
async def test_the_console_script_hook_imports_nothing_heavy_and_answers_as_the_cli(
        tmp_path: Path) -> None:
    data, project = tmp_path / "data", tmp_path / "billing-api"
    async with running_daemon(env_for(tmp_path), "--data-dir", str(data)):
        code, _, err = await cli(data, "save", "a procedure: ship billing with make release",
                                 "--realm", "billing-api", "--type", "procedure")
        assert code == 0, err
        await the_hook_answers_as_the_cli(tmp_path, data, project)


async def the_hook_answers_as_the_cli(tmp_path: Path, data: Path, project: Path) -> None:
    """Each prompt through the console script and through the full CLI (argparse, as main
    ran it), with no config, a config with a setting, one with only comments, a refused one."""
    config = tmp_path / "with-a-setting.toml"
    config.write_text('[daemon]\nlog_level = "info"\n')
    comments = tmp_path / "comments.toml"
    comments.write_text("# syncd configuration: the defaults\n")
    broken = tmp_path / "broken.toml"
    broken.write_text("[sync]\ninterval_secs = -5\n")
    # as an agent runs it: no SYNCD_* variable (env_for sets the hashing embedder's)
    env = {k: v for k, v in env_for(tmp_path).items() if not k.startswith("SYNCD_")}
    hook = ["--data-dir", str(data), "recall", "--hook"]
    full = [sys.executable, "-c", "import sys; from syncd.cli import main; sys.exit(main())"]
    for prompt, answers in (("how do I ship billing?", True), ("zzzz qqqq", False)):
        stdin = json.dumps({"prompt": prompt, "cwd": str(project)}).encode()
        code, out, err = await run([sys.executable, "-X", "importtime", str(SCRIPT), *hook],
                                   env, stdin)
        assert code == 0 and imported(err) & set(HEAVY) == set(), sorted(imported(err))
        assert "syncd.hook" in imported(err)  # the report is read: the hook was imported
        if answers:
            context = json.loads(out)["hookSpecificOutput"]["additionalContext"]
            assert "ship billing with make release" in context
        else:
            assert out == ""
        assert await run([*full, *hook], env, stdin) == (0, out, "")
        for flags in (["--config", str(config)], [f"--config={comments}"]):
            assert await run([str(SCRIPT), *flags, *hook], env, stdin) == (0, out, "")
            assert await run([*full, *flags, *hook], env, stdin) == (0, out, "")
        _, _, err = await run([sys.executable, "-X", "importtime", str(SCRIPT),
                               "--config", str(comments), *hook], env, stdin)
        assert "msgspec" not in imported(err)  # comments only: the defaults, no msgspec
        _, _, err = await run([sys.executable, "-X", "importtime", str(SCRIPT),
                               "--config", str(config), *hook], env, stdin)
        assert imported(err) & set(HEAVY) == set(), sorted(imported(err))  # a usual config
        for argv in ([str(SCRIPT)], full):  # a config that every command refuses
            assert await run([*argv, "--config", str(broken), *hook], env, stdin) == (
                0, "", "")

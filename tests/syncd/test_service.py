"""Issue 7: the systemd/launchd units as `syncd service install --print` renders them, the
packaged templates, and the agent prompt hook `syncd recall --hook` against real processes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import plistlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from syncd.places import default_cache_dir, syncd_command
from syncd.service import Paths, render_systemd
from tests.syncd.processes import ROOT, env_for, finish, wait_ready
from tests.syncd.test_daemon import cli, start

PLACEHOLDERS = ("{{SYNCD}}", "{{CONFIG}}", "{{DATA_DIR}}", "{{LOG_DIR}}")


def syncd_cli(home: Path, *args: str, stdin: str | None = None,
              **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "syncd", *args], input=stdin,
                          capture_output=True, text=True, env=env_for(home, **extra), timeout=60,
                          check=False)


def cache_of(home: Path) -> Path:
    """The cache directory ``syncd_cli(home, …)`` runs with (the embedding process's)."""
    return default_cache_dir(env_for(home))


def test_the_unit_leaves_the_cache_dir_writable_and_install_creates_it(tmp_path: Path) -> None:
    """Read-only under ``ProtectSystem=strict``, the fused graph could not be kept: every load
    of the model rebuilt it (1.2 s against 0.4), past the prompt hook's 1 s."""
    home, data = tmp_path / "home", tmp_path / "data"
    cache = tmp_path / "cache dir"
    unit = render_systemd(Paths(config=tmp_path / "c.toml", data_dir=data, log_dir=tmp_path,
                                cache_dir=cache))
    assert f'ReadWritePaths="-{cache}" {data}' in unit.splitlines(), unit
    inside = render_systemd(Paths(config=tmp_path / "c.toml", data_dir=data, log_dir=tmp_path,
                                  cache_dir=data / "cache"))
    assert f"ReadWritePaths={data}" in inside.splitlines(), inside
    with pytest.raises(ValueError, match="the cache directory"):
        render_systemd(Paths(config=tmp_path / "c.toml", data_dir=data, log_dir=tmp_path,
                             cache_dir=tmp_path / "a\nb"))
    assert not cache_of(home).exists()
    out = syncd_cli(home, "--data-dir", str(data), "service", "install", "--systemd", "--print")
    assert out.returncode == 0 and f"-{cache_of(home)}" in out.stdout, out.stdout
    assert not cache_of(home).exists()  # --print writes nothing
    path, _ = _fake_manager(tmp_path, "systemctl", "-")
    out = syncd_cli(home, "--data-dir", str(data), "service", "install", "--systemd", PATH=path)
    assert out.returncode == 0, out.stderr
    assert cache_of(home).is_dir() and (cache_of(home).stat().st_mode & 0o777) == 0o700


def analyze_verify(unit: Path) -> None:
    """`systemd-analyze verify`; it prints unit-file problems as ``<path>:<line>: …`` (with exit
    0 for some), and fails without a running manager for reasons unrelated to the unit."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed here; the unit is not verified")
    proc = subprocess.run([tool, "verify", str(unit)], capture_output=True, text=True,
                          timeout=60, check=False)
    output = proc.stdout + proc.stderr
    problems = [line for line in output.splitlines() if unit.name in line]
    assert problems == [], output
    if proc.returncode != 0:
        assert "manager" in output.lower() or "/run/" in output, output


def test_systemd_unit_renders_and_verifies(tmp_path: Path) -> None:
    home, data = tmp_path / "home", tmp_path / "my data"  # a space: quoting must hold
    out = syncd_cli(home, "--data-dir", str(data), "service", "install", "--systemd", "--print")
    assert out.returncode == 0, out.stderr
    unit = out.stdout
    assert not any(p in unit for p in PLACEHOLDERS)
    assert not (home / ".config/systemd").exists()  # --print writes nothing
    for line in ("Type=notify", "NotifyAccess=main", "WatchdogSec=30", "Restart=on-failure",
                 "RestartPreventExitStatus=2", "UMask=0077", "NoNewPrivileges=yes",
                 "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
                 f'ReadWritePaths=-{cache_of(home)} "{data}"'):
        assert line in unit.splitlines(), line
    exec_start = next(x for x in unit.splitlines() if x.startswith("ExecStart="))
    assert exec_start.endswith(f' --config {home}/.config/syncd/config.toml --data-dir "{data}" run')
    path = tmp_path / "syncd.service"
    path.write_text(unit)
    analyze_verify(path)


def test_systemd_quoting_of_odd_paths(tmp_path: Path) -> None:
    python = tmp_path / "my python"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    paths = Paths(config=tmp_path / "100%$x.toml", data_dir=tmp_path / "d", log_dir=tmp_path)
    unit = render_systemd(paths, command=[str(python), "-m", "syncd"])
    assert f'ExecStart="{python}" -m syncd --config {tmp_path}/100%%$$x.toml' in unit
    path = tmp_path / "syncd.service"
    path.write_text(unit)
    analyze_verify(path)


def test_a_data_dir_under_tmp_turns_the_private_tmp_off(tmp_path: Path) -> None:
    """``PrivateTmp=yes`` would hide a data directory (or config) under /tmp from the daemon,
    which would then start an empty store in its private /tmp."""
    home = Path.home() / ".local/share/syncd"
    kept = render_systemd(Paths(config=Path.home() / ".config/syncd/config.toml",
                                data_dir=home, log_dir=home))
    assert "PrivateTmp=yes" in kept.splitlines()
    for config, data in ((Path.home() / "c.toml", Path("/tmp/syncd-data")),
                         (Path("/var/tmp/c.toml"), home)):
        unit = render_systemd(Paths(config=config, data_dir=data, log_dir=data))
        assert "PrivateTmp=no" in unit.splitlines() and "PrivateTmp=yes" not in unit
        path = tmp_path / "syncd.service"
        path.write_text(unit)
        analyze_verify(path)
    # a socket there would be bound in the unit's own /tmp, where no client can reach it
    unit = render_systemd(Paths(config=Path.home() / ".config/syncd/config.toml", data_dir=home,
                                log_dir=home, socket_dir=Path("/tmp")))
    assert "PrivateTmp=no" in unit.splitlines() and "PrivateTmp=yes" not in unit


def test_the_units_leave_the_socket_dir_writable_and_outwait_the_drain(tmp_path: Path) -> None:
    """A unix socket outside the data directory needs its directory writable (the unit makes
    every other path read-only), and the service manager must wait out a long drain before it
    kills the daemon (it waited 30 s whatever ``shutdown_timeout_secs`` said)."""
    home, data, run = tmp_path / "home", tmp_path / "data", tmp_path / "run dir"
    config = tmp_path / "syncd.toml"
    config.write_text(f'[daemon]\nunix_socket = "{run}/syncd.sock"\n'
                      "shutdown_timeout_secs = 100\n")
    out = syncd_cli(home, "--config", str(config), "--data-dir", str(data), "service",
                    "install", "--systemd", "--print")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert f'ReadWritePaths=-{cache_of(home)} "-{run}" {data}' in lines, out.stdout
    assert "TimeoutStopSec=120" in lines
    path = tmp_path / "syncd.service"
    path.write_text(out.stdout)
    analyze_verify(path)
    out = syncd_cli(home, "--config", str(config), "--data-dir", str(data), "service",
                    "install", "--launchd", "--print")
    assert out.returncode == 0, out.stderr
    assert plistlib.loads(out.stdout.encode())["ExitTimeOut"] == 120
    config.write_text(f'[daemon]\nunix_socket = "{data}/syncd.sock"\n')  # inside: as it was
    out = syncd_cli(home, "--config", str(config), "--data-dir", str(data), "service",
                    "install", "--systemd", "--print")
    assert f"ReadWritePaths=-{cache_of(home)} {data}" in out.stdout.splitlines(), out.stdout
    assert "TimeoutStopSec=30" in out.stdout.splitlines()


def test_launchd_plist_renders_and_parses(tmp_path: Path) -> None:
    home, data = tmp_path / "home", tmp_path / "data"
    out = syncd_cli(home, "--data-dir", str(data), "service", "install", "--launchd", "--print")
    assert out.returncode == 0, out.stderr
    assert not any(p in out.stdout for p in PLACEHOLDERS)
    plist = plistlib.loads(out.stdout.encode())
    assert plist["Label"] == "dev.syncd.agent"
    args = plist["ProgramArguments"]
    assert Path(args[0]).name in ("syncd", Path(sys.executable).name)
    assert args[-5:] == ["--config", f"{home}/.config/syncd/config.toml", "--data-dir",
                         str(data), "run"]
    assert plist["RunAtLoad"] is True and plist["KeepAlive"] == {"SuccessfulExit": False}
    assert plist["ThrottleInterval"] == 10 and plist["ProcessType"] == "Background"
    assert plist["ExitTimeOut"] == 30  # launchd's own default, 20 s, is under the drain's
    assert plist["StandardOutPath"].startswith(f"{home}/Library/Logs/syncd/")
    assert plist["StandardErrorPath"].startswith(f"{home}/Library/Logs/syncd/")
    assert plist["EnvironmentVariables"] == {}


def console_script(bin_dir: Path) -> Path:
    """A ``syncd`` console script as pip writes one (a shebang naming this interpreter), in a
    directory that is not the interpreter's: a ``pip install --user`` or a system install."""
    bin_dir.mkdir(parents=True)
    script = bin_dir / "syncd"
    script.write_text(f"#!{sys.executable}\nimport sys\nfrom syncd.entry import main\n"
                      "sys.exit(main())\n")
    script.chmod(0o755)
    return script


def test_the_unit_runs_the_syncd_script_that_installed_it(tmp_path: Path) -> None:
    """``syncd service install`` started as a ``syncd`` script names that script (absolute, a
    pipx or uv link kept a link) in ExecStart and ProgramArguments, not ``python -m syncd``
    nor a ``syncd`` on PATH; started as ``python -m syncd`` from a venv, the venv's script."""
    home, data = tmp_path / "home", tmp_path / "data"
    script = console_script(tmp_path / "user" / "bin")
    link = tmp_path / "home" / ".local" / "bin" / "syncd"
    link.parent.mkdir(parents=True)
    link.symlink_to(script)
    for started_as in (script, link):
        env = env_for(home, PATH=f"{tmp_path / 'elsewhere'}:/usr/bin:/bin")
        out = subprocess.run([str(started_as), "--data-dir", str(data), "service", "install",
                              "--systemd", "--print"], capture_output=True, text=True, env=env,
                             timeout=60, check=False)
        assert out.returncode == 0, out.stderr
        assert _exec_argv(out.stdout)[0] == str(started_as)
        out = subprocess.run([str(started_as), "--data-dir", str(data), "service", "install",
                              "--launchd", "--print"], capture_output=True, text=True, env=env,
                             timeout=60, check=False)
        assert out.returncode == 0, out.stderr
        assert plistlib.loads(out.stdout.encode())["ProgramArguments"][0] == str(started_as)
    beside = Path(sys.executable).parent / "syncd"
    out = syncd_cli(home, "--data-dir", str(data), "service", "install", "--systemd", "--print")
    assert out.returncode == 0, out.stderr
    assert _exec_argv(out.stdout)[0] == (
        str(beside) if beside.is_file() else sys.executable)


def test_the_syncd_command_prefers_the_running_script_then_the_interpreters(
        tmp_path: Path) -> None:
    """``places.syncd_command``'s order, on real files: the running ``syncd`` script; else the
    executable ``syncd`` beside the interpreter; else the interpreter with ``-m syncd``. A file
    merely named ``syncd`` that cannot run is no script."""
    running = console_script(tmp_path / "running")
    venv_bin = tmp_path / "venv" / "bin"
    interpreter = venv_bin / "python"
    beside = console_script(venv_bin)
    interpreter.touch()
    module = str(tmp_path / "src" / "syncd" / "__main__.py")
    assert syncd_command(str(running), str(interpreter)) == [str(running)]
    assert syncd_command(module, str(interpreter)) == [str(beside)]
    beside.chmod(0o644)
    assert syncd_command(module, str(interpreter)) == [str(interpreter), "-m", "syncd"]
    assert syncd_command(str(beside), str(interpreter)) == [str(interpreter), "-m", "syncd"]
    relative = running.relative_to(tmp_path)
    with contextlib.chdir(tmp_path):
        assert syncd_command(str(relative), str(interpreter)) == [str(running)]


def test_packaged_templates_equal_the_deploy_files() -> None:
    packaged = ROOT / "syncd" / "deploy_templates"
    assert sorted(p.name for p in packaged.iterdir()) == ["dev.syncd.agent.plist",
                                                           "syncd.service"]
    assert (packaged / "syncd.service").read_bytes() == \
        (ROOT / "deploy/systemd/syncd.service").read_bytes()
    assert (packaged / "dev.syncd.agent.plist").read_bytes() == \
        (ROOT / "deploy/launchd/dev.syncd.agent.plist").read_bytes()
    plistlib.loads((ROOT / "deploy/launchd/dev.syncd.agent.plist").read_bytes())


def test_hub_unit_verifies(tmp_path: Path) -> None:
    unit = (ROOT / "deploy/systemd/syncd-hub.service").read_text()
    assert "User=syncd-hub" in unit and "StateDirectory=syncd-hub" in unit
    path = tmp_path / "syncd-hub.service"  # ExecStart must exist for verify: point it at /bin/true
    path.write_text(unit.replace("/opt/syncd/venv/bin/syncd", "/bin/true"))
    analyze_verify(path)


def test_postgresql_hub_unit_verifies_and_keeps_the_dsn_out_of_the_command_line(
        tmp_path: Path) -> None:
    unit = (ROOT / "deploy/systemd/syncd-hub-pg@.service").read_text()
    lines = unit.splitlines()
    assert "LoadCredential=dsn:/etc/syncd-hub/dsn" in lines
    exec_start = next(x for x in lines if x.startswith("ExecStart="))
    assert exec_start.endswith("hub --store-file %d/dsn --listen 127.0.0.1:%i")
    assert "postgresql://" not in exec_start and "StateDirectory" not in unit
    path = tmp_path / "syncd-hub-pg@8781.service"
    path.write_text(unit.replace("/opt/syncd/venv/bin/syncd", "/bin/true"))
    analyze_verify(path)


@pytest.mark.parametrize("flag", ["--systemd", "--launchd"])
def test_install_without_the_service_manager_says_so(tmp_path: Path, flag: str) -> None:
    home = tmp_path / "home"
    empty = tmp_path / "bin"
    empty.mkdir()
    out = syncd_cli(home, "service", "install", flag, PATH=str(empty))
    assert out.returncode == 75
    assert ("systemctl" if flag == "--systemd" else "launchctl") + " not found" in out.stderr
    assert not (home / ".config/systemd").exists() and not (home / "Library").exists()



def test_install_may_name_a_config_file_it_will_create(tmp_path: Path) -> None:
    """``syncd --config NEW.toml service install``: install creates the missing file, so
    reading it first is not an error (it said "file not found"); any other command still
    refuses a ``--config`` that is not there."""
    home, config = tmp_path / "home", tmp_path / "etc" / "custom.toml"
    out = syncd_cli(home, "--config", str(config), "--data-dir", str(tmp_path / "d"),
                    "service", "install", "--systemd", "--print")
    assert out.returncode == 0, out.stderr
    exec_start = next(x for x in out.stdout.splitlines() if x.startswith("ExecStart="))
    assert f" --config {config} " in exec_start
    out = syncd_cli(home, "--config", str(config), "status")
    assert out.returncode == 2 and "file not found" in out.stderr


# --- paths systemd would read otherwise, and uninstall when the manager fails -------------------

def _unquote_words(text: str) -> list[str]:
    """systemd's extract_first_word(EXTRACT_UNQUOTE|EXTRACT_CUNESCAPE) for the subset the
    renderer emits: "double-quoted" words with \\\\ and \\" escapes, or bare words."""
    words = re.findall(r'"((?:[^"\\]|\\.)*)"|(\S+)', text)
    return [re.sub(r"\\(.)", r"\1", quoted) if quoted or not bare else bare
            for quoted, bare in words]


def _exec_argv(unit: str) -> list[str]:
    """ExecStart's argv as systemd runs it: %% → %, and in arguments (not the path) $$ → $;
    an unescaped $ is an environment variable expansion, reported as <EXPANDED>."""
    line = next(x for x in unit.splitlines() if x.startswith("ExecStart="))
    argv = []
    for i, word in enumerate(_unquote_words(line[len("ExecStart="):])):
        word = word.replace("%%", "\0")
        if i > 0:
            word = word.replace("$$", "\1")
            word = re.sub(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", "<EXPANDED>", word)
        argv.append(word.replace("\0", "%").replace("\1", "$"))
    return argv


def test_a_dollar_in_a_path_reaches_the_daemon_as_written(tmp_path: Path) -> None:
    """``$`` is expanded by systemd in ExecStart's arguments (it needs ``$$`` there) but not in
    ReadWritePaths= (where ``$$`` would name another directory)."""
    data, config = tmp_path / "cost${HOME}data 100%", tmp_path / "c$USER.toml"
    out = syncd_cli(tmp_path / "home", "--config", str(config), "--data-dir", str(data),
                    "service", "install", "--systemd", "--print")
    assert out.returncode == 0, out.stderr
    argv = _exec_argv(out.stdout)
    assert argv[argv.index("--data-dir") + 1] == str(data), argv
    assert argv[argv.index("--config") + 1] == str(config), argv
    rw = next(x for x in out.stdout.splitlines() if x.startswith("ReadWritePaths="))
    assert _unquote_words(rw[len("ReadWritePaths="):].replace("%%", "%")) == [
        f"-{cache_of(tmp_path / 'home')}", str(data)]
    path = tmp_path / "syncd.service"
    path.write_text(out.stdout)
    analyze_verify(path)


@pytest.mark.parametrize("flag", ["--systemd", "--launchd"])
@pytest.mark.parametrize("option", ["--data-dir", "--config"])
@pytest.mark.parametrize("print_only", [True, False])
def test_a_path_with_a_newline_or_control_character_is_refused(
        tmp_path: Path, flag: str, option: str, print_only: bool) -> None:
    """A newline in a path ended the directive and began another (``ExecStartPre=/bin/rm …``);
    install refuses such a path, naming it, before anything is written."""
    home, fake = tmp_path / "home", tmp_path / "bin"
    fake.mkdir()
    log = tmp_path / "calls.log"
    for tool in ("systemctl", "launchctl"):
        (fake / tool).write_text(f'#!/bin/sh\necho "$*" >> "{log}"\nexit 0\n')
        (fake / tool).chmod(0o755)
    bad = tmp_path / "srv\nExecStartPre=/bin/rm -rf \x01home"
    paths = {"--data-dir": str(tmp_path / "data"), "--config": str(tmp_path / "c.toml"),
             option: str(bad)}
    out = syncd_cli(home, "--config", paths["--config"], "--data-dir", paths["--data-dir"],
                    "service", "install", flag, *(["--print"] if print_only else []),
                    PATH=f"{fake}:/usr/bin:/bin")
    assert (out.returncode, out.stdout) == (2, ""), out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.splitlines()) == 1, out.stderr
    what = "the data directory" if option == "--data-dir" else "the config file"
    shown = json.dumps(str(bad), ensure_ascii=False)
    assert out.stderr == (f"syncd: {what} {shown} contains a newline or another control "
                          "character, which a service unit cannot hold; choose another path\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin"]  # nothing written or run


def _fake_manager(tmp_path: Path, tool: str, fails: str) -> tuple[str, Path]:
    """A fake ``tool`` on PATH (the real one is never run) that logs its arguments and fails
    (exit 1) on a command line matching the shell pattern ``fails``; PATH and the log."""
    fake, log = tmp_path / "bin", tmp_path / "calls.log"
    fake.mkdir(exist_ok=True)
    (fake / tool).write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> "{log}"\n'
        f'case "$*" in {fails}) echo "Failed to connect to bus" >&2; exit 1;; esac\n'
        "exit 0\n")
    (fake / tool).chmod(0o755)
    return f"{fake}:/usr/bin:/bin", log


def test_uninstall_fails_and_keeps_the_unit_when_systemd_cannot_stop_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    path, log = _fake_manager(tmp_path, "systemctl", "*disable*")
    out = syncd_cli(home, "--data-dir", str(tmp_path / "data"), "service", "install",
                    "--systemd", PATH=path)
    assert out.returncode == 0, out.stderr
    unit = home / ".config/systemd/user/syncd.service"
    assert unit.exists()
    out = syncd_cli(home, "service", "uninstall", "--systemd", PATH=path)
    assert "--user disable --now syncd.service" in log.read_text()
    assert out.returncode == 75, out.stderr  # the service may still be running
    assert out.stderr.splitlines()[-1] == (
        "syncd: the service manager could not stop the service (exit 1); it may still be "
        f"running. {unit} is kept: `syncd service uninstall` again retries")
    assert unit.exists()
    working, _ = _fake_manager(tmp_path, "systemctl", "-")  # the manager is back: none fails
    out = syncd_cli(home, "service", "uninstall", "--systemd", PATH=working)
    assert out.returncode == 0 and not unit.exists(), out.stderr
    path, _ = _fake_manager(tmp_path, "systemctl", "*disable*")  # not installed: its unit is
    out = syncd_cli(home, "service", "uninstall", "--systemd", PATH=path)  # unknown, so
    assert out.returncode == 0 and "was not installed" in out.stderr  # disable fails: fine


@pytest.mark.parametrize("loaded", [True, False])
def test_uninstall_with_launchd_fails_only_while_the_agent_stays_loaded(
        tmp_path: Path, loaded: bool) -> None:
    """``launchctl bootout`` fails: while ``launchctl print`` still finds the agent, uninstall
    exits 75 and keeps the plist; an agent already booted out is no reason to keep it."""
    home = tmp_path / "home"
    path, log = _fake_manager(tmp_path, "launchctl",
                              "*bootout*" if loaded else "*bootout*|*print*")
    out = syncd_cli(home, "--data-dir", str(tmp_path / "data"), "service", "install",
                    "--launchd", PATH=path)  # its bootout of an earlier install may fail
    plist = home / "Library/LaunchAgents/dev.syncd.agent.plist"
    assert plist.exists(), out.stderr
    out = syncd_cli(home, "service", "uninstall", "--launchd", PATH=path)
    assert "bootout gui/" in log.read_text()
    if loaded:
        assert out.returncode == 75 and plist.exists(), out.stderr
        assert "could not stop the service" in out.stderr
    else:
        assert out.returncode == 0 and not plist.exists(), out.stderr


def test_recall_needs_a_query_unless_hook(tmp_path: Path) -> None:
    out = syncd_cli(tmp_path, "--data-dir", str(tmp_path / "data"), "recall")
    assert out.returncode == 2 and "QUERY is required" in out.stderr


# --- the prompt hook -----------------------------------------------------------------------------

async def hook(data: Path, stdin: bytes) -> tuple[int, str, float]:
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "syncd", "--data-dir", str(data), "recall", "--hook",
        env=env_for(data.parent), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    async with asyncio.timeout(30):
        out, _ = await proc.communicate(stdin)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), time.monotonic() - started


def payload(prompt: str, cwd: Path) -> bytes:
    return json.dumps({"session_id": "abc123", "transcript_path": "/dev/null", "cwd": str(cwd),
                       "hook_event_name": "UserPromptSubmit", "prompt": prompt}).encode()


async def test_hook_prints_the_context_for_the_project_realm(tmp_path: Path) -> None:
    data, project = tmp_path / "data", tmp_path / "billing-api"
    proc = await start(data, "--listen", "127.0.0.1:0")
    await wait_ready(proc)
    try:
        code, _, err = await cli(data, "save", "ship billing with make release", "--realm",
                                 "billing-api", "--type", "procedure")
        assert code == 0, err
        code, _, err = await cli(data, "save", "ship billing via the portal", "--realm", "other")
        assert code == 0, err
        code, out, _ = await hook(data, payload("how do I ship billing?", project))
        assert code == 0
        output = json.loads(out)["hookSpecificOutput"]
        assert output["hookEventName"] == "UserPromptSubmit"
        assert "ship billing with make release" in output["additionalContext"]
        assert "portal" not in output["additionalContext"]  # another project's realm
        code, out, _ = await hook(data, payload("zzzz qqqq", tmp_path / "empty-project"))
        assert code == 0 and out == ""  # no memories, no output
        code, _, err = await cli(data, "save", "billing invoices are numbered per tenant")
        assert code == 0, err  # no realm: "default", where agents' saves over MCP land
        code, out, _ = await hook(data, payload("how are billing invoices numbered?", project))
        context = json.loads(out)["hookSpecificOutput"]["additionalContext"]
        assert "numbered per tenant" in context and "portal" not in context
        code, out, _ = await hook(data, payload("zzzz qqqq", project))
        assert code == 0 and out == ""  # memories in these realms, but none matches: a fallback
    finally:
        proc.send_signal(signal.SIGTERM)
        assert (await finish(proc))[0] == 0


async def test_hook_is_silent_and_quick_when_the_daemon_is_down(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    with socket.socket() as sock:  # a port nobody listens on any more
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (data / "daemon.json").write_text(json.dumps({"pid": 1, "url": f"http://127.0.0.1:{port}"}))
    (data / "api-token").write_text("x" * 43 + "\n")
    (data / "api-token").chmod(0o600)
    code, out, elapsed = await hook(data, payload("how do I ship billing?", tmp_path))
    assert (code, out) == (0, "") and elapsed < 1.0  # the whole process: start-up included
    code, out, elapsed = await hook(tmp_path / "never-ran", payload("anything", tmp_path))
    assert (code, out) == (0, "") and elapsed < 1.0  # no token file either


def test_the_hook_loads_only_what_it_uses(tmp_path: Path) -> None:
    """The hook runs on every prompt: it must not import the store, numpy, asyncio or the
    export/import code (together ~0.3 s of start-up) just to send one request."""
    probe = ("import json, sys\n"
             "sys.argv = ['syncd', '--data-dir', sys.argv[1], 'recall', '--hook']\n"
             "from syncd.cli import main\n"
             "main()\n"
             "heavy = ['asyncio', 'sqlite3', 'numpy', 'local_store', 'syncd.transfer']\n"
             "print(json.dumps([m for m in heavy if m in sys.modules]))\n")
    out = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "never-ran")],
                         input=payload("how do I ship billing?", tmp_path), capture_output=True,
                         timeout=60, check=True, env=env_for(tmp_path))
    assert json.loads(out.stdout.decode().splitlines()[-1]) == []


@pytest.mark.parametrize("stdin", [b"", b"not json", b"[1, 2]", b'{"prompt": 7}',
                                   b'{"cwd": "/tmp"}', b"\xff\xfe"])
async def test_hook_ignores_malformed_input(tmp_path: Path, stdin: bytes) -> None:
    code, out, _ = await hook(tmp_path / "data", stdin)
    assert (code, out) == (0, "")


def test_an_install_systemd_refuses_says_how_to_get_a_user_manager(tmp_path: Path) -> None:
    """Over ssh without lingering there is no user manager ("Failed to connect to bus"): the
    answer says what to do, keeps the unit for the retry, and exits 75."""
    home = tmp_path / "home"
    path, _ = _fake_manager(tmp_path, "systemctl", "*daemon-reload*")
    out = syncd_cli(home, "--data-dir", str(tmp_path / "data"), "service", "install",
                    "--systemd", PATH=path)
    assert out.returncode == 75, out.stderr
    assert "Failed to connect to bus" in out.stderr  # systemctl's own message, then ours
    assert "loginctl enable-linger $USER" in out.stderr.splitlines()[-1]
    assert (home / ".config/systemd/user/syncd.service").exists()
